"""The per-destination lock: two writers (or a writer and a recovery) never race for one file."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from trtet_store.io import fs
from trtet_store.io.errors import ConcurrentWriteError


def lock_file(lock_path: Path, dest: Path, timeout: float | None = None) -> int:
    """An exclusive lock tied to ``lock_path``'s current inode, waiting up to ``timeout`` s.

    Polled rather than a blocking ``flock``: a blocking call cannot be given
    a deadline, and the holder may unlink the file we wait on.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if deadline is not None and time.monotonic() < deadline:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            waited = f" (waited {timeout:g} s)" if timeout else ""
            raise ConcurrentWriteError(
                errno.EAGAIN, f"another write to {dest} is in progress{waited}; wait for it to "
                "finish, or pass timeout= to wait", os.fspath(dest)) from None
        # The holder before us may have unlinked the file after we opened it:
        # a lock on a deleted inode protects nothing, so take it again.
        try:
            if fs.same_file(os.fstat(fd), os.stat(lock_path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
