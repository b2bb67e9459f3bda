"""try_lock holds only the file that is at the path now.

The holder before us, a recovery or a collector may unlink or replace a lock
file while we wait for its lock; a lock on the old inode would protect
nothing. Each test holds the lock, lets try_lock block on it, replaces the
file, releases, and looks at what try_lock got.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import threading

import pytest
from digests import file_digest
from proclocks import until_waiting

from trtet_store import BlobStore, write_file, write_files
from trtet_store.io import fs, names
from trtet_store.io.errors import ConcurrentWriteError
from trtet_store.io.lock import try_lock
from trtet_store.io.units import MiB


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
    until_waiting(os.getpid(), thread.is_alive)  # it has opened the file and waits in flock
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


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.EMFILE], ids=errno.errorcode.get)
def test_a_lock_that_cannot_be_opened_fails_the_write_as_itself_and_loses_nothing(
        here_fs, monkeypatch, code):
    """The destination's lock is opened through fs.calls, so its failure is seen.

    It must surface as the real error (not as "another write is in progress",
    which would send the user to wait for nobody) before any byte moves.
    """
    out = here_fs / "out"
    out.mkdir()
    dest = out / "model.pte"
    dest.write_bytes(b"old content")
    lock_name = names.lock_path_of(dest).name
    real_open = fs.calls.open

    def refuse_the_lock(path, *args):
        if os.path.basename(path) == lock_name:
            raise OSError(code, os.strerror(code), path)
        return real_open(path, *args)

    with BlobStore(here_fs / "s") as store:
        blob = store.put(os.urandom(MiB + 5))
        before = blob.digest
        monkeypatch.setattr(fs.calls, "open", refuse_the_lock)
        with pytest.raises(OSError) as raised:
            write_file(dest, [b"h" * 100, blob], consume=True)
        monkeypatch.undo()
        assert raised.value.errno == code
        assert not isinstance(raised.value, ConcurrentWriteError)
        assert not blob.consumed
        assert file_digest(blob.path) == before
    assert dest.read_bytes() == b"old content"
    assert sorted(p.name for p in out.iterdir()) == ["model.pte"]


def test_a_busy_second_destination_releases_the_first_ones_lock(here_fs):
    """Locks are taken one destination at a time; when a later one is busy (or fails),
    those already taken are released and their lock files removed, so the
    next write of the first destination is not refused for a lock nobody holds."""
    out = here_fs / "out"
    out.mkdir()
    first, second = out / "a.pte", out / "b.ptd"
    first.write_bytes(b"old a")
    held = try_lock(names.lock_path_of(second), create=True)
    try:
        with pytest.raises(ConcurrentWriteError):
            write_files([(first, [b"new a"]), (second, [b"new b"])])
    finally:
        os.close(held)
        os.unlink(names.lock_path_of(second))
    assert first.read_bytes() == b"old a"
    assert sorted(p.name for p in out.iterdir()) == ["a.pte"]
    write_file(first, [b"new a"])  # not refused: nobody holds its lock
    assert first.read_bytes() == b"new a"


def test_a_store_whose_lock_file_cannot_be_removed_still_releases_its_lock(here_fs):
    """Closing a store unlinks its lock file, then releases the lock; a failed
    unlink (here EPERM: the directory is immutable) must not keep the lock held."""
    directory = here_fs / "s"
    store = BlobStore(directory)
    (lock,) = directory.glob(names.store_lock_glob())
    subprocess.run(["chattr", "+i", os.fspath(directory)], check=True)
    try:
        store.close()
        fd = try_lock(lock, create=False)
        assert fd is not None, "the closed store still holds its lock"
        os.close(fd)
    finally:
        subprocess.run(["chattr", "-i", os.fspath(directory)], check=True)


def test_a_lock_file_is_unlinked_while_its_lock_is_still_held(here_fs, monkeypatch):
    """unlock_file unlinks, then releases. The other order leaves an instant when
    the file is still at its path and unlocked: a second writer that locks it
    then holds a lock on a file about to be deleted, and a third writer
    creates a new one, so two write the destination at once. So when the
    lock's descriptor is closed (which releases it), the file must already be
    gone from its path, while a second descriptor's try of it was refused."""
    out = here_fs / "out"
    out.mkdir()
    dest = out / "model.pte"
    lock_path = os.fspath(names.lock_path_of(dest))
    seen: list[tuple[int, str]] = []
    real_close = fs.calls.close

    def look_then_close(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(lock_path):
            other = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # same file
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                tried = "taken"
            except BlockingIOError:
                tried = "refused"
            finally:
                os.close(other)
            seen.append((os.fstat(fd).st_nlink, tried))
        return real_close(fd)

    monkeypatch.setattr(fs.calls, "close", look_then_close)
    write_file(dest, [b"new content"])
    monkeypatch.undo()
    assert seen == [(0, "refused")]  # unlinked while still held
    assert dest.read_bytes() == b"new content"
    assert sorted(p.name for p in out.iterdir()) == ["model.pte"]
