"""Every internal on-disk name the storage engine makes, and how to read them back.

One rule per kind of file, so that the writer that makes a name and the
recovery that finds it later cannot disagree.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# Beside a destination: its lock, and per transaction (a 16-hex-digit token)
# a temp file, a backup of the old file and the journal.
DEST_LOCK_SUFFIX = ".trtet-lock"
JOURNAL_SUFFIX = ".trtet-journal"
# In each directory holding a blob a transaction uses: a pin (symlink to its journal).
PIN_PREFIX = ".trtet-pin-"
# A scratch file of a capability probe (fs.probe_*), named after the prober's pid: a
# writer tries an operation beside the destination and deletes it at once; killed in
# that instant, it stays, and recovery removes it once that pid is gone.
PROBE_PREFIX = ".trtet-probe-"
# A blob store's files: ``<token>-<n>.blob``, its ``.meta`` sidecar, the
# ``.part`` files they are written as, and the store's lock ``.store-<token>.lock``.
BLOB_SUFFIX = ".blob"
PART_SUFFIX = ".part"
BLOB_PART_SUFFIX = BLOB_SUFFIX + PART_SUFFIX
META_SUFFIX = ".meta"
STORE_LOCK_PREFIX = ".store-"
STORE_LOCK_SUFFIX = ".lock"
# The store the exporter stages engines in, beside the output.
STAGING_DIR = ".trtet-staging"
# A fetch's lock in its staging directory, ``fetch-<id>.lock`` (remote/download/staging.py
# takes it; the engine cache's sweep of partial downloads tests it: a lock nobody holds
# means no live download is using the directory).
FETCH_LOCK_PREFIX = "fetch-"
FETCH_LOCK_SUFFIX = ".lock"
# Where compile-and-publish stages its engines (kept there when the publish fails).
PUBLISH_STAGING_DIR = ".trtet-publish-staging"

_TEMP = re.compile(r"^\..+\.trtet-([0-9a-f]{16})\.(tmp|old)$")
_JOURNAL = re.compile(r"^\.(.+)\.trtet-([0-9a-f]{16})" + re.escape(JOURNAL_SUFFIX) + "$")
_PROBE = re.compile("^" + re.escape(PROBE_PREFIX) + r"(\d+)-")

# Internal names add up to 38 bytes to the destination's (journal); a longer
# name is shortened to a prefix and a hash, so every name fits NAME_MAX (255).
_NAME_KEEP = 200


def internal_stem(name: str) -> str:
    """The part of ``name`` the writer's internal files (lock, journal, temp) are named after.

    The name itself when it leaves room for the longest suffix; otherwise its
    first bytes and a hash of the whole, so that names of 218 to 255 bytes
    still get internal names within NAME_MAX.
    """
    raw = os.fsencode(name)
    if len(raw) <= _NAME_KEEP:
        return name
    # A cut through a multi-byte character is dropped; the hash keeps names apart.
    head = raw[:_NAME_KEEP - 40].decode("utf-8", "ignore")
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:32]}"


def lock_path_of(dest: Path) -> Path:
    """The lock file that guards writes of ``dest``."""
    return lock_path_of_stem(dest.parent, internal_stem(dest.name))


def lock_path_of_stem(directory: Path, stem: str) -> Path:
    """The lock file of the destination whose internal stem is ``stem``."""
    return directory / f".{stem}{DEST_LOCK_SUFFIX}"


def is_dest_lock(name: str) -> bool:
    """Whether ``name`` is a destination's lock file."""
    return name.endswith(DEST_LOCK_SUFFIX)


def destination(path: os.PathLike | str, *, follow_links: bool = True) -> Path:
    """The file a write of ``path`` replaces.

    A symlinked destination updates the file it points to, as open(path, "wb")
    would; with ``follow_links=False`` the link itself is replaced by the new
    file (a rename over it), and its target is never written.
    """
    p = Path(path).absolute()
    return Path(os.path.realpath(p)) if follow_links and p.is_symlink() else p


# -- a transaction's files, beside its destinations -------------------------------------

def temp_path(dest: Path, token: str) -> Path:
    """The temp file transaction ``token`` builds ``dest`` in."""
    return dest.with_name(f".{internal_stem(dest.name)}.trtet-{token}.tmp")


def backup_path(dest: Path, token: str) -> Path:
    """Where transaction ``token`` keeps ``dest``'s old file until every output is published."""
    return dest.with_name(f".{internal_stem(dest.name)}.trtet-{token}.old")


def journal_path(dest: Path, token: str) -> Path:
    """The journal of transaction ``token``, named after its first destination ``dest``."""
    return dest.with_name(f".{internal_stem(dest.name)}.trtet-{token}{JOURNAL_SUFFIX}")


def journal_glob() -> str:
    """A glob pattern for the journals in a directory."""
    return f".*{JOURNAL_SUFFIX}"


def parse_journal(name: str) -> tuple[str, str] | None:
    """``(internal stem of the first destination, token)`` of a journal's name, else None."""
    m = _JOURNAL.match(name)
    return (m.group(1), m.group(2)) if m else None


def journal_token(name: str) -> str:
    """The token of a file that :func:`journal_glob` matched (as written: the part before
    its suffix)."""
    return name.split(".trtet-")[-2]


def temp_token(name: str) -> str | None:
    """The transaction token of a temp or backup file's name, else None."""
    m = _TEMP.match(name)
    return m.group(1) if m else None


def pin_path(directory: os.PathLike | str, token: str) -> str:
    """The pin transaction ``token`` leaves in ``directory``."""
    return os.path.join(directory, f"{PIN_PREFIX}{token}")


def pin_glob() -> str:
    """A glob pattern for the pins in a directory."""
    return PIN_PREFIX + "*"


# -- capability probes ------------------------------------------------------------------

def probe_path(directory: Path, tag: str) -> Path:
    """A scratch file for a capability probe of this process, told apart by ``tag``."""
    return directory / f"{PROBE_PREFIX}{os.getpid()}-{tag}"


def probe_pid(name: str) -> int | None:
    """The pid of the process whose probe left the file ``name``, else None."""
    m = _PROBE.match(name)
    return int(m.group(1)) if m else None


# -- a blob store's files ---------------------------------------------------------------

def blob_path(directory: Path, token: str, seq: int) -> Path:
    """The ``seq``-th blob of the store ``token``."""
    return directory / f"{token}-{seq}{BLOB_SUFFIX}"


def part_path_of(blob: Path) -> Path:
    """The file a blob is written as until it is sealed."""
    return blob.with_name(blob.name[: -len(BLOB_SUFFIX)] + BLOB_PART_SUFFIX)


def meta_path_of(blob: os.PathLike | str) -> str:
    """A blob's metadata sidecar."""
    return os.fspath(blob) + META_SUFFIX


def blob_token(name: str) -> str | None:
    """The token of the store a blob (or its sidecar) belongs to, from its name."""
    head, sep, _ = name.partition("-")
    return head if sep and len(head) == 16 else None


def store_lock_path(directory: Path, token: str) -> Path:
    """The lock a live store ``token`` holds in its directory."""
    return directory / f"{STORE_LOCK_PREFIX}{token}{STORE_LOCK_SUFFIX}"


def store_lock_glob() -> str:
    """A glob pattern for the store locks in a directory."""
    return f"{STORE_LOCK_PREFIX}*{STORE_LOCK_SUFFIX}"
