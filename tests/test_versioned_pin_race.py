"""Issue 34 item 9: a reader never pins a version pruned between its open and its lock.

``pinned_version`` resolves the link, opens the version's directory, then
takes a shared ``flock``. A save that prunes that version in between (its
exclusive ``flock`` is still free then) renames it away and deletes it; the
reader's lock then holds a directory that is gone. The re-check after the
lock (does the path still name the directory locked?) resolves the link
again. The interleaving is forced: a hook on the reader's shared lock (taken
by io's ``try_lock(shared=True)``) runs the pruning save first.
"""

from __future__ import annotations

import fcntl
import os

from trtet_store.io import lock
from trtet_store.io.versioned import current_version, pinned_version, write_versioned


class _SaveBeforeSharedLock:
    """``fcntl`` for io/lock.py, whose first shared ``flock`` runs ``save`` first."""

    def __init__(self, save) -> None:
        self.save = save
        self.fired = 0

    def flock(self, fd: int, op: int) -> None:
        if op == fcntl.LOCK_SH and not self.fired:
            self.fired += 1
            self.save()  # between the reader's open and its lock
        fcntl.flock(fd, op)

    def __getattr__(self, name: str):
        return getattr(fcntl, name)


def _save(directory, n: int):
    return write_versioned([(directory / "m.pte", [f"pte {n}".encode()]),
                            (directory / "w.ptd", [f"ptd {n}".encode()])], keep=1)


def test_a_version_pruned_between_open_and_lock_is_not_pinned(here_fs, monkeypatch):
    first = _save(here_fs, 1)
    saves = []
    hook = _SaveBeforeSharedLock(lambda: saves.append(_save(here_fs, 2)))
    monkeypatch.setattr(lock, "fcntl", hook)
    with pinned_version(here_fs / "m") as version:
        assert hook.fired == 1
        # The forced state: the version the reader opened was pruned by the save.
        assert saves[0].removed == (first.version,) and not first.version.exists()
        assert version == saves[0].version == current_version(here_fs / "m")
        assert os.path.isdir(version)
        assert (version / "m.pte").read_bytes() == b"pte 2"
        assert (version / "w.ptd").read_bytes() == b"ptd 2"
    # And the pin holds: a save meanwhile would have kept it (checked in test_versioned).
