"""The fetches a failure left staged in a directory: listed without changing anything, or discarded.

A fetch that fails keeps, in ``DIR/.trtet-staging`` (see :mod:`.staging`),
its run files (``fetch-<id>-<object>-<offset>-<size>.run``), its journal
(``fetch-<id>.journal``) and its lock file (``fetch-<id>.lock``), so that
the same ``trtet-store fetch`` resumes it. ``trtet-store recover DIR`` names
them with :func:`interrupted_fetches` and drops them on request with
:func:`discard_fetch`.

Listing is read-only: the staging directory is opened without following a
link (a link there is reported, never read through), every file in it is
opened by ``dir_fd`` with ``O_NOFOLLOW``, nothing is created, and whether a
fetch is running is asked of its lock file with a non-blocking ``flock``
released at once (a fetch that starts in that instant is told that another
is running, as it would be by any holder).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.io import (
    STAGING_DIR,
    BlobStore,
    ConcurrentWriteError,
    SafeDir,
    staging_directory,
    try_lock,
    unlock_file,
)
from trtet_store.remote.download.staging import METADATA_KEY, STAGING_TODO, fetch_lock_name

__all__ = ["InterruptedFetch", "StagingLinkError", "discard_fetch", "interrupted_fetches"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: A journal larger than this is not read (one line per range: a real one is far smaller).
_JOURNAL_LIMIT = 64 << 20


class StagingLinkError(OSError):
    """``DIR/.trtet-staging`` is a symbolic link (or not a directory): it is not followed."""


@dataclass
class InterruptedFetch:
    """One fetch whose journal is in a staging directory.

    Attributes
    ----------
    id : str
        The fetch's id (a digest of its destination's path).
    url, dest : str
        What its journal says it fetched, and into where ("" when its head is damaged).
    staged, total : int
        Bytes its journal records as written, and the bytes of all its runs.
    since : float
        The journal's modification time (the last range written).
    journal : Path
        The journal.
    runs : list of Path
        Its run files there now.
    running : bool
        Its lock is held: a fetch is running now.
    """

    id: str
    url: str
    dest: str
    staged: int
    total: int
    since: float
    journal: Path
    runs: list[Path] = field(default_factory=list)
    running: bool = False


def interrupted_fetches(directory: os.PathLike | str) -> list[InterruptedFetch]:
    """The fetches whose journals are in ``directory/.trtet-staging``, changing nothing.

    Parameters
    ----------
    directory : path-like
        The directory fetched into (the destination's parent).

    Returns
    -------
    list of InterruptedFetch
        Sorted by journal name; empty when there is no staging directory.

    Raises
    ------
    StagingLinkError
        ``directory/.trtet-staging`` is a link or not a directory: it is not
        followed, and nothing in it is listed.
    """
    staging = Path(directory) / STAGING_DIR
    try:
        st = os.lstat(staging)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise StagingLinkError(errno.ELOOP, f"{staging} is {kind}: not followed, nothing in it "
                               "listed; remove it", os.fspath(staging))
    try:
        dfd = os.open(staging, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link since the lstat
            raise StagingLinkError(errno.ELOOP, f"{staging} is a symbolic link: not followed, "
                                   "nothing in it listed; remove it", os.fspath(staging)) from None
        raise
    try:
        names = sorted(os.listdir(dfd))
        found = []
        for name in names:
            if not (name.startswith("fetch-") and name.endswith(".journal")):
                continue
            fid = name[len("fetch-"):-len(".journal")]
            one = _read_one(dfd, staging, fid, names)
            if one is not None:
                found.append(one)
        return found
    finally:
        os.close(dfd)


def _read_one(dfd: int, staging: Path, fid: str, names: list[str]) -> InterruptedFetch | None:
    name = f"fetch-{fid}.journal"
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return None  # gone meanwhile, or a link at a journal's name: not a journal of ours
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, _JOURNAL_LIMIT) if st.st_size <= _JOURNAL_LIMIT else b""
    finally:
        os.close(fd)
    head: dict = {}
    done: set[tuple[int, int, int]] = set()
    for i, line in enumerate(data.split(b"\n")):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a kill mid-append: that range is fetched again, as a resume does
        if not isinstance(record, dict):
            continue
        if i == 0 and "fetch" in record:
            head = record
        elif {"obj", "offset", "size", "crc"} <= record.keys():
            with contextlib.suppress(TypeError, ValueError):
                done.add((int(record["obj"]), int(record["offset"]), int(record["size"])))
    total = 0
    for run in head.get("runs", []) if isinstance(head.get("runs"), list) else []:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            total += int(run[2])
    prefix = f"fetch-{fid}-"
    runs = [staging / n for n in names if n.startswith(prefix) and n.endswith(".run")
            and _regular(dfd, n)]
    return InterruptedFetch(
        id=fid, url=str(head.get("url", "")), dest=str(head.get("dest", "")),
        staged=min(sum(size for _, _, size in done), total) if total else 0, total=total,
        since=st.st_mtime, journal=staging / name, runs=runs,
        running=_lock_held(dfd, fetch_lock_name(fid)))


def _regular(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _lock_held(dfd: int, name: str) -> bool:
    """Whether another open file holds ``name``'s ``flock`` (asked, then released at once)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return False  # no lock file (or a link at its name): no fetch holds it
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock we may have taken
    return False


def _discard_blobs(sdir: SafeDir, fid: str) -> None:
    """The staged runs a killed fetch left as orphan blobs, taken over and given up.

    As a fetch drops the runs of a version it no longer wants (:mod:`.staging`):
    adopted, then closed (which gives each back to its ``.run`` name, removed
    with the others). A pinned one (a write of ours died holding it) is left
    to ``recover``, which runs first.
    """
    if not any(n.endswith(".blob") for n in os.listdir(sdir.fd)):
        return  # no blob store to open (it would make its lock file)
    store = BlobStore(sdir.path)
    try:
        for orphan in store.orphans():
            if orphan.pinned or orphan.metadata.get(METADATA_KEY, {}).get("id") != fid:
                continue
            store.adopt_orphan(orphan).close()
    finally:
        store.close()


def discard_fetch(directory: os.PathLike | str, fetch: InterruptedFetch) -> int:
    """Remove ``fetch``'s staged runs, journal and lock file, holding its lock.

    Its runs are its ``.run`` files and the orphan blobs a killed run of it
    left. Nothing else is touched; the staging directory goes only if that
    leaves it empty (as a fetch that ends leaves it).

    Returns
    -------
    int
        How many staged runs were removed.

    Raises
    ------
    ConcurrentWriteError
        Its lock is held: the fetch is running; nothing was removed.
    UnsafeDirectoryError
        The staging directory is a link, another user's, or writable by
        others: nothing was removed.
    """
    with staging_directory(Path(directory) / STAGING_DIR, create=False,
                           todo=STAGING_TODO) as sdir:
        lock_name = fetch_lock_name(fetch.id)
        # The lock of the file at the path now (io.lock's protocol), as a fetch takes it:
        # no fetch can start on these files while we remove them.
        fd = try_lock(sdir.path / lock_name, create=True)
        if fd is None:
            raise ConcurrentWriteError(errno.EBUSY, f"a fetch into {fetch.dest} is running; "
                                       "wait for it to finish, then discard again",
                                       os.fspath(fetch.journal))
        try:
            _discard_blobs(sdir, fetch.id)  # back to their .run names, removed below
            removed = 0
            prefix = f"fetch-{fetch.id}-"
            for name in os.listdir(sdir.fd):  # the run files there now, under the lock
                if name.startswith(prefix) and name.endswith(".run"):
                    sdir.unlink(name)  # a link is removed itself, never followed
                    removed += 1
            sdir.unlink(f"fetch-{fetch.id}.journal")
        finally:
            unlock_file(fd, sdir.path / lock_name)
        with contextlib.suppress(OSError):
            os.rmdir(sdir.path)  # only when empty; rmdir never follows a link
    return removed
