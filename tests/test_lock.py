"""try_lock holds only the file that is at the path now.

The holder before us, a recovery or a collector may unlink or replace a lock
file while we wait for its lock; a lock on the old inode would protect
nothing. Each test holds the lock, lets try_lock block on it, replaces the
file, releases, and looks at what try_lock got.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from trtet_store.io.lock import try_lock


def _blocked_try_lock(path, **kwargs):
    """Start try_lock(wait=True) in a thread while ``path`` is held; return (thread, result)."""
    result: dict = {}

    def run() -> None:
        try:
            result["fd"] = try_lock(path, wait=True, **kwargs)
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.3)  # it has opened the file and waits in flock
    assert thread.is_alive(), result
    return thread, result


@pytest.mark.parametrize("replaced", [True, False], ids=["replaced", "unlinked"])
def test_a_lock_file_replaced_while_waiting_is_taken_again_at_its_path(here_fs, replaced):
    path = here_fs / "x.lock"
    held = try_lock(path, create=True)
    assert held is not None
    thread, result = _blocked_try_lock(path, create=True)
    os.unlink(path)
    if replaced:
        path.write_bytes(b"")
    os.close(held)  # the waiter now gets the old, unlinked inode
    thread.join(10)
    fd = result["fd"]
    try:
        assert os.fstat(fd).st_ino == os.stat(path).st_ino
        assert os.fstat(fd).st_nlink == 1
    finally:
        os.close(fd)


def test_someone_elses_lock_file_replaced_while_waiting_is_reported(here_fs):
    path = here_fs / "x.lock"
    held = try_lock(path, create=True)
    thread, result = _blocked_try_lock(path, create=False)
    os.unlink(path)
    path.write_bytes(b"")  # a new owner's file: never ours to take
    os.close(held)
    thread.join(10)
    assert isinstance(result.get("error"), FileNotFoundError), result
    assert "fd" not in result


def test_a_held_lock_is_not_taken(here_fs):
    path = here_fs / "x.lock"
    held = try_lock(path, create=True)
    try:
        assert try_lock(path, create=True) is None
        assert try_lock(path, create=False) is None
    finally:
        os.close(held)
    with pytest.raises(FileNotFoundError):
        try_lock(here_fs / "missing.lock", create=False)
