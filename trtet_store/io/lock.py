"""Locks tied to a file's name: the per-destination lock, and the one way to take any of them.

Every lock of the engine (a destination's, a store's, a journal's) is an
exclusive ``flock``, and every reader's pin (a cached blob's, a version's) a
shared one, on a file that someone may unlink: the holder before us, a
recovery, a collector of dead stores, an eviction. A lock on an unlinked
inode protects nothing, so :func:`try_lock` returns a lock only on the file
that is at the path *now*.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from trtet_store.io import fs
from trtet_store.io.errors import ConcurrentWriteError, UnsafeLockFileError


def try_lock(path: os.PathLike | str, *, create: bool, readonly: bool = False,
             wait: bool = False, shared: bool = False) -> int | None:
    """Open ``path`` and take an exclusive (or shared) ``flock`` on the very file found there.

    Parameters
    ----------
    path : path-like
        The lock file.
    create : bool
        Create the file if it is missing. The file is then *ours to hold*:
        when the one we locked was unlinked or replaced meanwhile (by the
        holder before us, or a collector), it is taken again, at the path,
        until we hold the file that is there. Without ``create`` the file is
        *someone else's*: if it is gone, or no longer the one we locked, that
        is reported, never retaken (a new file there belongs to a new owner).
    readonly : bool
        Open it read-only (``flock`` needs no write access; a lock file of
        another user's may be readable only).
    wait : bool
        Block until the lock is free instead of returning None.
    shared : bool
        Take a shared lock: a reader's pin. Any number of shared holders
        coexist; an exclusive lock is refused (or waits) while one holds, as
        a shared one is while an exclusive one holds. The path may then also
        be a directory (a pinned version's), opened with ``readonly``.

    Returns
    -------
    int or None
        The open, locked descriptor (the caller closes it to unlock), or None
        when another open file holds the lock (never with ``wait``).

    Raises
    ------
    FileNotFoundError
        Without ``create``: the file is missing, or was unlinked or replaced
        before we held its lock.
    UnsafeLockFileError
        The path is a symbolic link, or not a regular file (nor, ``shared``,
        a directory): planted where a lock file goes. It is never followed,
        so a lock never creates or opens a file elsewhere, and a FIFO never
        blocks the open.
    """
    # O_NOFOLLOW: a lock file is never a link (one planted in a shared
    # directory would make O_CREAT create, or open, a file wherever it points).
    # O_NONBLOCK: a FIFO planted there must not block the open (flock's waiting
    # is LOCK_NB's business, not the descriptor's).
    flags = ((os.O_RDONLY if readonly else os.O_RDWR) | os.O_NOFOLLOW | os.O_NONBLOCK
             | os.O_CLOEXEC)
    if create:
        flags |= os.O_CREAT
    while True:
        try:
            fd = fs.calls.open(os.fspath(path), flags, 0o644)
        except OSError as exc:
            # ELOOP from O_NOFOLLOW; EACCES where fs.protected_symlinks refuses
            # another user's link in a sticky directory before O_NOFOLLOW does.
            if exc.errno in (errno.ELOOP, errno.EACCES) and _is_link(path):
                raise UnsafeLockFileError(os.fspath(path), "it is a symbolic link") from None
            raise
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or (shared and stat.S_ISDIR(mode))):
            release(fd)
            raise UnsafeLockFileError(os.fspath(path), "it is not a regular file")
        try:
            same = lock_the_file_at(fd, path, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                                    | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            release(fd)
            return None
        except BaseException:
            release(fd)
            raise
        if same:
            return fd
        release(fd)
        if not create:
            raise FileNotFoundError(errno.ENOENT, "unlinked or replaced while being locked",
                                    os.fspath(path))


def lock_the_file_at(fd: int, path: os.PathLike | str, operation: int) -> bool:
    """``flock(fd, operation)``, then whether ``fd`` is still the file at ``path``.

    A lock taken on a file that its holder unlinked (or a collector replaced)
    while we waited guards nothing anyone can find: the caller drops it and
    takes the file that is there now. ``BlockingIOError`` (``LOCK_NB``) passes.
    """
    fcntl.flock(fd, operation)
    try:
        return fs.same_file(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def _is_link(path: os.PathLike | str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def release(fd: int) -> None:
    """Close a lock's descriptor, which releases its ``flock``.

    An error from ``close`` is dropped: Linux frees the descriptor (and with it
    the lock) even when ``close`` fails, and no lock file (a journal included)
    is closed with data not yet synced.
    """
    with contextlib.suppress(OSError):
        fs.calls.close(fd)


def unlock_file(fd: int, lock_path: os.PathLike | str) -> None:
    """Remove a lock file we hold, then release its lock: the end of :func:`lock_file`.

    Unlinked while still held, so a waiter that gets the lock next finds that
    the file it locked is no longer at the path and takes a fresh one (see
    :func:`try_lock`). An unlink that fails leaves a stray lock file, which
    holds nothing and which recovery (for a store's lock, the next store's
    collector) removes; the lock is released either way.
    """
    with contextlib.suppress(OSError):
        os.unlink(lock_path)
    release(fd)


def lock_file(lock_path: Path, dest: Path, timeout: float | None = None) -> int:
    """An exclusive lock tied to ``lock_path``'s current inode, waiting up to ``timeout`` s.

    Polled rather than a blocking ``flock``: a blocking call cannot be given
    a deadline, and the holder may unlink the file we wait on.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = try_lock(lock_path, create=True)
        if fd is not None:
            return fd
        if deadline is not None and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            continue
        waited = f" (waited {timeout:g} s)" if timeout else ""
        raise ConcurrentWriteError(
            errno.EAGAIN, f"another write to {dest} is in progress{waited}; wait for it to "
            "finish, or pass timeout= to wait", os.fspath(dest))
