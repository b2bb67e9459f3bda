"""Every internal on-disk name the storage engine makes, and how to read them back.

One rule per kind of file, so that the writer that makes a name and the
recovery that finds it later cannot disagree.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The lock beside a destination that guards its writes.
DEST_LOCK_SUFFIX = ".trtet-lock"

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


def destination(path: os.PathLike | str) -> Path:
    """The file a write of ``path`` replaces.

    A symlinked destination updates the file it points to, as open(path, "wb") would.
    """
    p = Path(path).absolute()
    return Path(os.path.realpath(p)) if p.is_symlink() else p
