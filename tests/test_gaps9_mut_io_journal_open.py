"""io/journal.py Journal.open_if_abandoned: whose a journal is, said right, from either side.

A mutation sweep of the checks the round added (gap hunt round 3) found these states
set up by no test:

- another user's link or FIFO at a journal's name: refused for what it is (a link, a
  FIFO), not re-described by its owner (``if isinstance(exc, NotOursError): raise``);
- a recovery run by an unprivileged user: root's unreadable journal there is "not ours"
  (owned by uid 0), the user's own unreadable journal is a plain PermissionError, never
  "not ours" (``if uid == os.geteuid(): raise``);
- the journal swapped for another user's file between the owner check and the lock: the
  locked descriptor is checked again (``problem = ours_problem(os.fstat(fd), ...)``) and
  the swapped-in file is never read nor acted on.

Each proves the planted or victim file is left as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, listing, reachable_dir

from trtet_store.io import NotOursError
from trtet_store.io import journal as journal_mod
from trtet_store.io.journal import Journal, OutputPlan, Plan
from trtet_store.io.names import journal_path, temp_path

T1, T2 = "0123456789abcdef", "fedcba9876543210"


@pytest.fixture
def top() -> Iterator[Path]:
    with reachable_dir("gaps9-journal-", 0o755) as path:
        yield path


def _journal_bytes(d: Path, token: str, name: str = "model.pte") -> tuple[Path, bytes]:
    dest = d / name
    plan = Plan(token=token, outputs=[OutputPlan(dest=os.fspath(dest),
                                                 temp=os.fspath(temp_path(dest, token)),
                                                 backup=None, size=10)])
    return journal_path(dest, token), (plan.to_json() + "\n").encode()


def _entries(d: Path) -> dict[str, tuple]:
    """Each entry's lstat identity (a FIFO is never opened: listing() would wait on it)."""
    return {n: (st.st_mode, st.st_ino, st.st_uid, st.st_size, st.st_mtime_ns)
            for n in sorted(os.listdir(d)) for st in [os.lstat(d / n)]}


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_another_users_link_or_fifo_at_a_journal_name_is_refused_for_what_it_is(
        top: Path, kind: str) -> None:
    """open_if_abandoned: ``if isinstance(exc, NotOursError): raise``: the owner check's own
    reason stands (a link, a FIFO), not a second lookup's "owned by uid 65534"."""
    shared = top / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = top / "victim.pte"
    victim.write_bytes(b"root's program")
    path, _ = _journal_bytes(shared, T1)

    def plant() -> None:
        if kind == "link":
            os.symlink(victim, path)
        else:
            os.mkfifo(path)

    as_nobody(plant)
    before, victim_before = _entries(shared), victim.read_bytes()
    with pytest.raises(NotOursError) as got:
        Journal.open_if_abandoned(path)
    want = "a symbolic link" if kind == "link" else "a FIFO, not a regular file"
    assert got.value.reason == want, got.value.reason
    assert _entries(shared) == before and os.lstat(path).st_uid == NOBODY
    assert victim.read_bytes() == victim_before


def test_an_unprivileged_recovery_tells_roots_journal_from_its_own_unreadable_one(
        top: Path) -> None:
    """open_if_abandoned run as uid 65534: root's 0600 journal cannot be opened; whose is it?
    root's: NotOursError naming uid 0. Its own 0000 journal: a PermissionError that is not
    NotOursError (``if uid == os.geteuid(): raise``), for the user to fix, not "not ours"."""
    d = top / "theirs"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    roots, data = _journal_bytes(d, T1)
    roots.write_bytes(data)
    os.chmod(roots, 0o600)
    own, own_data = _journal_bytes(d, T2, "other.pte")
    own.write_bytes(own_data)
    os.chown(own, NOBODY, NOBODY)
    os.chmod(own, 0o000)
    before = listing(d)

    def as_user() -> None:
        with pytest.raises(NotOursError) as got:
            Journal.open_if_abandoned(roots)
        assert got.value.reason == f"owned by uid 0, not by uid {NOBODY}", got.value.reason
        with pytest.raises(PermissionError) as mine:
            Journal.open_if_abandoned(own)
        assert not isinstance(mine.value, NotOursError), str(mine.value)

    as_nobody(as_user)
    assert listing(d) == before
    assert (os.stat(roots).st_uid, os.stat(roots).st_mode & 0o777) == (0, 0o600)
    assert (os.stat(own).st_uid, os.stat(own).st_mode & 0o777) == (NOBODY, 0o000)


def test_a_journal_swapped_for_another_users_file_before_its_lock_is_never_read(
        top: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """open_if_abandoned checks the name (open_ours), then locks it and checks the locked
    descriptor again, the one it reads. Swapped in between (a barrier at the lock) for uid
    65534's file with a plan of its own: refused as another user's, that file untouched."""
    d = top / "d"
    d.mkdir()
    path, data = _journal_bytes(d, T1)
    path.write_bytes(data)
    planted = d / "planted"
    planted.write_bytes(data)  # the very same plan, so only the owner tells them apart
    os.chown(planted, NOBODY, NOBODY)
    real = journal_mod.try_lock

    def barrier(p, *a, **kw):
        if os.fspath(p) == os.fspath(path) and planted.exists():
            os.rename(planted, path)  # the swap lands between the check and the lock
        return real(p, *a, **kw)

    monkeypatch.setattr(journal_mod, "try_lock", barrier)
    with pytest.raises(NotOursError) as got:
        Journal.open_if_abandoned(path)
    assert got.value.reason == "owned by uid 65534, not by uid 0", got.value.reason
    st = os.stat(path)
    assert (st.st_uid, path.read_bytes()) == (NOBODY, data)
    # and it is not left locked: our own journal put back opens at once
    os.chown(path, 0, 0)
    j = Journal.open_if_abandoned(path)
    assert j is not None and j.plan.token == T1
    j.close()
