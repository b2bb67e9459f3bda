"""io/recovery.py: recovery's sweep of strays leaves another user's files alone (a gap hunt).

``_remove_strays`` skips a temp file, probe or destination lock that is not ours by its
``lstat``; ``_remove_unheld_lock`` judges the lock again on the descriptor it locked,
since the name can be swapped for another user's file after that ``lstat``. Here the
second check is given the swapped-in state directly: uid 65534's unheld lock file at a
destination lock's name, which it must not unlink.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, listing

from trtet_store.io.names import lock_path_of
from trtet_store.io.recovery import _remove_unheld_lock


@pytest.fixture
def top() -> Iterator[Path]:
    import shutil

    path = Path(tempfile.mkdtemp(prefix="strays-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path)


def test_an_unheld_lock_of_another_user_is_never_unlinked(top: Path) -> None:
    """recovery.py _remove_unheld_lock: ``if os.fstat(fd).st_uid != os.geteuid()``."""
    lock = lock_path_of(top / "model.pte")
    lock.write_bytes(b"")
    os.chown(lock, NOBODY, NOBODY)
    before = listing(top)
    assert _remove_unheld_lock(lock) is False
    assert listing(top) == before and lock.stat().st_uid == NOBODY
    ours = lock_path_of(top / "other.pte")  # and our own unheld lock is removed
    ours.write_bytes(b"")
    assert _remove_unheld_lock(ours) is True and not ours.exists()


def test_recover_leaves_another_users_stray_temp_and_lock_alone(top: Path) -> None:
    """recovery.py _remove_strays: ``if os.lstat(f).st_uid != euid: continue``. uid 65534's
    temp file (no journal of its token) and unheld lock in a 1777 directory are theirs:
    root's recover() removes its own strays there, never theirs."""
    from attacker import as_nobody

    from trtet_store import recover
    from trtet_store.io.names import temp_path

    def plant() -> None:
        temp_path(top / "theirs.pte", "0123456789abcdef").write_bytes(b"their bytes")
        lock_path_of(top / "theirs.pte").write_bytes(b"")

    as_nobody(plant)
    mine = temp_path(top / "mine.pte", "fedcba9876543210")
    mine.write_bytes(b"a stray of ours")
    theirs = {k: v for k, v in listing(top).items() if "theirs" in k}
    assert len(theirs) == 2
    outcomes = recover(top)
    assert [(o.journal, o.action) for o in outcomes] == [(mine, "removed stray")]
    assert listing(top) == theirs
    assert all((top / k).stat().st_uid == NOBODY for k in theirs)


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_link_or_fifo_of_ours_at_a_lock_name_is_left_and_recover_goes_on(top: Path,
                                                                          kind: str) -> None:
    """recovery.py _remove_unheld_lock: ``except UnsafeLockFileError: return False``. A link
    or FIFO at a destination lock's name passes the sweep's owner check when it is ours (or
    was swapped in after it): it is never a lock to remove, and recover() goes on."""
    from trtet_store import recover
    from trtet_store.io.names import temp_path

    target = top / "target"
    target.write_bytes(b"root's file")
    lock = lock_path_of(top / "model.pte")
    if kind == "link":
        os.symlink(target, lock)
    else:
        os.mkfifo(lock)
    mine = temp_path(top / "mine.pte", "fedcba9876543210")
    mine.write_bytes(b"a stray of ours")
    outcomes = recover(top)
    assert [(o.journal, o.action) for o in outcomes] == [(mine, "removed stray")]
    assert os.path.lexists(lock) and target.read_bytes() == b"root's file"
