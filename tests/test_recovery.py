"""recover(): finishes or undoes interrupted writes, idempotent, safe beside live writers.

Crashes here are real deaths: the write runs in a forked child that calls
``os._exit`` just before a chosen system call (crashkit.CallHook), so no
``finally`` and no rollback runs, and the kernel drops the child's locks.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import crashkit
from crashkit import CallHook, Scenario, check_recovered, collect_dead_store, die, in_child

from trtet_store import recover

KiB = 1 << 10


def small_scenario(**changes) -> Scenario:
    """Two outputs (one replacing an old file), three blobs and a user file; 16 KiB chunks."""
    scn = Scenario(
        blobs=[(11, 300_001), (12, 200_000), (13, 70_000)],
        outputs={
            "m.pte": [["bytes", 1, 100], ["blob", 0], ["bytes", 2, 33], ["ext", "u.bin"],
                      ["blob", 1]],
            "m.ptd": [["bytes", 3, 10], ["blob", 2]],
        },
        old={"m.pte": (4, 1000)},
        externals={"u.bin": (5, 50_000)},
        store_chunk=16 * KiB,
        write_chunk=32 * KiB,
    )
    for k, v in changes.items():
        setattr(scn, k, v)
    return scn


def trace(scn: Scenario, root: Path) -> list[str]:
    """The system calls an uninterrupted write of ``scn`` makes, in order (in this process)."""
    staging, out, user = scn.install(root)
    store, blobs = scn.stage(staging)
    with CallHook(None, die) as hook, contextlib.suppress(OSError):
        scn.write(out, user, blobs)
    store.close()
    return hook.names


def nth(names: list[str], name: str, k: int) -> int:
    """The 1-based call number of the ``k``-th call of ``name``."""
    seen = 0
    for i, n in enumerate(names, 1):
        if n == name:
            seen += 1
            if seen == k:
                return i
    raise AssertionError(f"fewer than {k} calls of {name}: {names}")


def move_truncation(names: list[str], k: int = 1) -> int:
    """The call number of the ``k``-th truncation of a move source (fdatasync, then ftruncate)."""
    seen = 0
    for i in range(1, len(names)):
        if names[i] == "ftruncate" and names[i - 1] == "fdatasync":
            seen += 1
            if seen == k:
                return i + 1
    raise AssertionError(f"fewer than {k} move steps: {names}")


def die_at(scn: Scenario, root: Path, at: int, *, action=die) -> tuple[Path, Path, Path]:
    """Stage and write ``scn`` in a child that dies before call number ``at``."""
    staging, out, user = scn.install(root)

    def child():
        _store, blobs = scn.stage(staging)
        with CallHook(at, action):
            scn.write(out, user, blobs)

    code = in_child(child)
    assert code == 86, f"the child did not die at call {at} (exit {code})"
    return staging, out, user


def actions(outcomes) -> list[str]:
    return [o.action for o in outcomes if o.action != "removed stray"]


# -- finishing or undoing -------------------------------------------------------------


def test_recover_rolls_back_when_finishing_a_move_finds_a_changed_source(here_fs):
    # The front of blob 0 changed after staging; the writer died after moving
    # its first steps. Finishing the move hits the changed chunk: recovery
    # must undo the write instead of failing (and failing again next time).
    scn = small_scenario(tamper=0)
    names = trace(scn, here_fs)
    at = move_truncation(names) + 1  # after the first step of the first move
    staging, out, user = die_at(scn, here_fs, at)
    assert crashkit.journal_state(out) == "placing"
    outcomes = recover(out)
    assert actions(outcomes) == ["rolled back"], outcomes
    assert "does not match the digest" in outcomes[0].detail
    assert check_recovered(scn, staging, out, user) == "old"
    assert recover(out) == []
    collect_dead_store(staging)
