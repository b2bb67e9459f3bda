"""Issue 44 follow-up: a lock file planted as a link or a FIFO is refused in one line.

In a mode 1777 directory another user (uid 65534, a forked child that drops to
it) plants the lock file a write of ``model.pte`` takes: a link to a root-only
file, or a FIFO (whose read-only open would block forever). The write is
refused with :class:`UnsafeLockFileError` naming the lock file and saying to
remove it; the victim's digests and the shared directory's listing are
byte-identical, and nothing is written.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from crash_dying import in_child
from test_staging_dir_attacks import NOBODY, as_nobody, shared_dir, state, victim

from trtet_store import write_file
from trtet_store.io import UnsafeLockFileError, try_lock
from trtet_store.io.names import lock_path_of


def test_a_write_refuses_a_lock_file_planted_as_a_link(make_fs):
    mnt = make_fs("ext4", 128)
    shared = shared_dir(mnt)
    home, secret = victim(mnt)
    dest = shared / "model.pte"
    lock = lock_path_of(dest)
    as_nobody(lambda: os.symlink(secret, lock))
    home_before, shared_before = state(home), state(shared)
    with pytest.raises(UnsafeLockFileError) as err:
        write_file(dest, [b"program bytes" * 100])
    assert str(err.value) == (
        f"refusing the lock file {lock}: it is a symbolic link (trtet_store makes lock files "
        "only as regular files); remove it, then try again")
    assert err.value.errno == errno.ELOOP
    assert state(home) == home_before
    assert state(shared) == shared_before


def test_a_lock_planted_as_a_fifo_never_blocks(make_fs):
    """Read-only opens (a liveness check of another's lock) of a FIFO would block forever."""
    mnt = make_fs("xfs", 320)
    shared = shared_dir(mnt)
    lock = shared / ".store-0123456789abcdef.lock"
    as_nobody(lambda: os.mkfifo(lock, 0o666))
    before = state_of(shared)

    def take() -> None:  # in a child: a blocked open must fail the test, not hang it
        signal.alarm(20)  # default action: the child dies, in_child != 0
        try:
            try_lock(lock, create=False, readonly=True)
        except UnsafeLockFileError as exc:
            assert str(exc).startswith(f"refusing the lock file {lock}: it is not a regular file")
            return
        raise AssertionError("a FIFO was taken as a lock file")

    assert in_child(take) == 0
    with pytest.raises(UnsafeLockFileError, match="it is not a regular file"):
        try_lock(lock, create=True)  # O_RDWR does not block on a FIFO: refused all the same
    assert state_of(shared) == before


def state_of(directory: Path) -> list[tuple[str, int, int]]:
    """The listing (a FIFO cannot be read for a digest): name, mode, owner."""
    return sorted((p.name, p.lstat().st_mode, p.lstat().st_uid) for p in directory.iterdir())


def test_in_child_reports_a_lock_taken_as_nobody_too(make_fs):
    """The refusal is the same for the attacker's own uid: it is about the file, not who asks."""
    mnt = make_fs("btrfs", 256)
    shared = shared_dir(mnt)
    lock = shared / "x.lock"
    os.symlink("/etc/passwd", lock)
    os.lchown(lock, NOBODY, NOBODY)

    def take() -> None:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        with pytest.raises(UnsafeLockFileError):
            try_lock(lock, create=True)

    assert in_child(take) == 0
    assert os.readlink(lock) == "/etc/passwd"
