"""What dead stores leave in a directory: orphans, to keep, and debris, to tidy.

A live :class:`~trtet_store.io.blobstore.BlobStore` holds an exclusive
``flock`` on its ``.store-<token>.lock``. The kernel drops that lock when the
process dies, however it dies, so a store is dead exactly when its lock file
can be locked (or is gone); PIDs are never trusted. A dead store's sealed
blobs are *orphans*: a staged blob may be hours of TensorRT build, so they
are listed (:func:`list_orphans`), never deleted here. What no one can use
(half-written blobs, sidecars without a blob, the dead stores' lock files) is
removed (:func:`collect_stale`).

A blob that an interrupted write's journal still names is *pinned*
(:func:`pinned_paths`): the recovery of that write needs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.io import journal, names
from trtet_store.io.lock import release, try_lock
from trtet_store.io.names import BLOB_PART_SUFFIX, BLOB_SUFFIX, META_SUFFIX, PART_SUFFIX
from trtet_store.io.sidecar import read_meta

# The blob store's logger: these messages were the store's before they had a
# module, and users filter on its name.
log = logging.getLogger("trtet_store.blobstore")


@dataclass(frozen=True)
class Orphan:
    """A staged blob whose store died (its process exited or crashed) without releasing it.

    Attributes
    ----------
    path : pathlib.Path
        The blob file.
    size : int
        Its length now.
    age : float
        Seconds since it was last modified.
    created : float or None
        When it was sealed (Unix time), from its sidecar.
    pid, host : int or None, str or None
        The process (and machine) that staged it, from its sidecar.
    origin : str or None
        Where an adopted file came from.
    metadata : dict
        The user's metadata recorded with it (e.g. a build fingerprint).
    pinned : bool
        A write journal still needs it: run ``recover`` on that write's output
        directory first; until then it can be neither adopted nor removed.
    sealed_identity : tuple or None
        Its identity when sealed; when it still matches, its recorded digests
        are trusted on adoption.
    """

    path: Path
    size: int
    age: float
    created: float | None = None
    pid: int | None = None
    host: str | None = None
    origin: str | None = None
    metadata: dict = field(default_factory=dict)
    pinned: bool = False
    sealed_identity: tuple | None = None


def pinned_paths(directory: Path) -> set[str]:
    """Files in ``directory`` that a live write journal still names.

    A transaction leaves a pin (a symlink to its journal) in each source
    directory; the journal lists the sources. A pin whose journal is gone is
    itself stale.
    """
    pinned: set[str] = set()
    for pin in directory.glob(names.pin_glob()):
        target = Path(os.readlink(pin)) if pin.is_symlink() else None
        if target is None or not target.exists():
            # Another user's, in a sticky shared directory: not ours to remove.
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(os.fspath(pin))
            continue
        try:
            pinned.update(journal.source_paths(target))
        except (OSError, ValueError) as exc:
            # An unreadable journal still pins everything: deleting a file it
            # may need is the one mistake we must not make.
            log.warning("journal %s unreadable (%s); keeping all files in %s", target, exc,
                        directory)
            pinned.update(os.fspath(p) for p in directory.iterdir())
    return pinned


class _Liveness:
    """Which store tokens in a directory are alive (their lock is held), asked once each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._known: dict[str, bool] = {}

    def alive(self, token: str) -> bool:
        if token not in self._known:
            self._known[token] = _token_alive(self.directory, token)
        return self._known[token]


def _token_alive(directory: Path, token: str) -> bool:
    # Read-only: flock needs no write access, and in a staging directory
    # shared between users another user's lock file is readable at most.
    try:
        fd = try_lock(names.store_lock_path(directory, token), create=False, readonly=True)
    except FileNotFoundError:
        return False  # no lock file: its store is gone
    except PermissionError:
        # Another user's, not even readable: we cannot tell, so its blobs are
        # never taken for orphans (nor its debris collected) by us.
        return True
    if fd is None:
        return True  # its store holds it
    release(fd)
    return False


def list_orphans(directory: os.PathLike | str) -> list[Orphan]:
    """Blobs in ``directory`` whose store is dead, oldest first; nothing is changed.

    A store is dead when its lock file can be locked (or is gone): the kernel
    released the owner's ``flock`` when the owner exited, however it exited.

    Parameters
    ----------
    directory : path-like
        A blob store's directory (missing: no orphans).

    Returns
    -------
    list of Orphan
        Oldest (least recently modified) first.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    live = _Liveness(directory)
    pinned: set[str] | None = None
    now = time.time()
    found = []
    for path in directory.glob(f"*{BLOB_SUFFIX}"):
        token = names.blob_token(path.name)
        if token is None or live.alive(token):
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # taken over or removed meanwhile
        if pinned is None:
            pinned = pinned_paths(directory)
        meta = read_meta(path)
        found.append(Orphan(
            path=path.absolute(), size=st.st_size, age=max(0.0, now - st.st_mtime),
            created=meta.get("created"), pid=meta.get("pid"), host=meta.get("host"),
            origin=meta.get("origin"), metadata=meta.get("metadata") or {},
            pinned=os.fspath(path) in pinned or os.fspath(path.absolute()) in pinned,
            sealed_identity=tuple(meta["identity"]) if meta.get("identity") else None))
    return sorted(found, key=lambda o: -o.age)


def describe_orphan(o: Orphan) -> str:
    """One line about an orphan, for logs and ``trtet-store recover``."""
    parts = [f"{o.size} bytes", f"age {_age(o.age)}"]
    if o.pid is not None:
        parts.append(f"staged by pid {o.pid}" + (f" on {o.host}" if o.host else ""))
    if o.origin:
        parts.append(f"adopted from {o.origin}")
    if o.metadata:
        parts.append("metadata " + json.dumps(o.metadata, sort_keys=True))
    if o.pinned:
        parts.append("pinned by an interrupted write (recover it first)")
    return "; ".join(parts)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def stale_parts(directory: os.PathLike | str) -> list[tuple[Path, int]]:
    """The half-written files (``.part``) of dead stores in ``directory``, with their sizes:
    what :func:`collect_stale` (run when a store next opens there) removes. Nothing is
    changed; links are not followed; a directory that is not there has none."""
    found: list[tuple[Path, int]] = []
    top = Path(directory)
    try:
        entries = sorted(top.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return found
    live = _Liveness(top)
    for f in entries:
        token = names.blob_token(f.name)
        if token is None or not f.name.endswith(PART_SUFFIX) or live.alive(token):
            continue
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((f, st.st_size))
    return found


def collect_stale(directory: Path) -> list[Path]:
    """Tidy up after dead stores in ``directory``; their blobs are kept (orphans).

    Removes what no one can use: half-written blobs (``.blob.part``) and
    sidecars whose blob is gone, of dead stores only; and the dead stores'
    lock files. A store is dead when its lock file can be locked.

    Returns
    -------
    list of pathlib.Path
        The files deleted (never a sealed blob).
    """
    removed: list[Path] = []
    live = _Liveness(directory)
    pinned: set[str] | None = None
    for f in list(directory.iterdir()):
        token = names.blob_token(f.name)
        if token is None or live.alive(token):
            continue
        name = f.name
        if name.endswith(BLOB_SUFFIX + META_SUFFIX):
            blob = f.with_name(name[: -len(META_SUFFIX)])
            if pinned is None:
                pinned = pinned_paths(directory)
            # A blob an interrupted write renamed away (an insert's host)
            # comes back when it is undone: its sidecar must be there then.
            if blob.exists() or os.fspath(blob) in pinned:
                continue
        elif not (name.endswith(BLOB_PART_SUFFIX) or name.endswith(META_SUFFIX + PART_SUFFIX)):
            continue
        try:
            os.unlink(os.fspath(f))
        except FileNotFoundError:
            pass
        except PermissionError:
            continue  # another user's, in a sticky shared directory: theirs to tidy
        removed.append(f)
    for lock_path in directory.glob(names.store_lock_glob()):
        try:
            fd = try_lock(lock_path, create=False, readonly=True)
        except (FileNotFoundError, PermissionError):
            continue  # removed meanwhile, or another user's we cannot even read
        if fd is None:
            continue  # its owner is alive
        try:
            # Unlinked while we hold it, so no one is left holding a lock on
            # a deleted file; a dead token stays dead without its lock file.
            os.unlink(lock_path)
        except (FileNotFoundError, PermissionError):
            pass  # gone, or another user's in a sticky directory
        finally:
            release(fd)
    if removed:
        log.info("removed %d unfinished file(s) of dead stores in %s", len(removed), directory)
    return removed
