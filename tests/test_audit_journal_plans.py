"""A journal of ours is replayed only when every path its plan names is one a write of ours
there would name.

Recovery renames, unlinks and truncates what a plan names, trusting a journal
of our own uid. Two of the plan checks are held here against root's own
journals (as an older tool, a copy, or a bug would leave them) in a real
directory, each naming a root file the replay would destroy:

- a backup that is not the output's backup name for the journal's token (a
  rollback deletes the backup, an unpublish renames it over the destination,
  a finished write deletes it): here root's other program beside the journal;
- a path through ``..`` (an output, a consumed source, a pin), which
  ``os.path.normpath`` would change: not an absolute, normal path.

Each test proves the journal is reported "not ours" with the reason, that
neither ``recover`` nor a write of the destination touched root's files
(bytes, owner, mode), and that the journal is still there.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_journal_plants import T1, journal_text, move, state

from trtet_store import recover, write_file
from trtet_store.io.journal import DONE, ROLLING_BACK, UNPUBLISHING, OutputPlan, Plan
from trtet_store.io.names import backup_path, journal_path, pin_path, temp_path

PROGRAM = b"root's new program " * 64
OLD = b"root's old program\n" * 40
OTHER = b"root's other program\n" * 30
NEW = b"the interrupted write's new program\n" * 20


@pytest.fixture
def here() -> Iterator[Path]:
    """root's 0755 directory on the root disk, with a staging directory of ours (0700)."""
    path = Path(tempfile.mkdtemp(prefix="journal-plans-", dir="/tmp"))
    os.chmod(path, 0o755)
    (path / ".trtet-staging").mkdir(mode=0o700)
    yield path
    shutil.rmtree(path)


def interrupted(here: Path) -> tuple[Path, Path]:
    """An interrupted write of ``model.pte`` over its old file: the old file at its name, the
    new one complete in its temp file; and root's other program beside it (the victim)."""
    dest, other = here / "model.pte", here / "report.pte"
    dest.write_bytes(OLD)
    temp_path(dest, T1).write_bytes(NEW)
    other.write_bytes(OTHER)
    os.chmod(other, 0o640)
    return dest, other


def refused(here: Path, path: Path, detail: str, caplog) -> None:
    """recover, then a write of the destination: the journal is not ours, nothing changes
    but the destination the write wrote."""
    before = state(here)
    outcomes = recover(here)
    assert [(o.journal, o.action, o.detail) for o in outcomes] == [
        (path, "not ours", f"{detail}; left alone")]
    assert state(here) == before
    dest = here / "model.pte"
    with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
        write_file(dest, [PROGRAM])
    assert dest.read_bytes() == PROGRAM
    after = state(here)
    del after[os.fspath(dest)], before[os.fspath(dest)]
    assert after == before  # the victim, the journal, the temp and the staging directory


@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("at", [ROLLING_BACK, UNPUBLISHING, DONE])
def test_a_journal_of_ours_whose_backup_is_another_file_is_not_replayed(here, at, which,
                                                                         caplog):
    """Its (first or second) output's backup names root's other program: rolling back or
    finishing would delete it, unpublishing would rename it over that output."""
    dest, other = interrupted(here)
    outputs = [OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)),
                          backup=os.fspath(other), size=len(NEW))]
    if which == "second":
        outputs[0].backup = os.fspath(backup_path(dest, T1))
        os.link(dest, outputs[0].backup)
        dest = here / "b.pte"  # the output whose backup is wrong
        dest.write_bytes(OLD)
        temp_path(dest, T1).write_bytes(NEW)
        outputs.append(OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)),
                                  backup=os.fspath(other), size=len(NEW)))
    assert os.fspath(other) != os.fspath(backup_path(dest, T1))
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=outputs), at))  # root's own
    refused(here, path, f"its plan names the backup {other}, not {dest}'s for its token",
            caplog)
    assert other.read_bytes() == OTHER and other.stat().st_mode & 0o777 == 0o640


def test_the_same_journal_with_its_own_backup_is_replayed(here):
    """The control: with the backup named for its token, the same unpublishing journal is
    rolled back (the old file back at its name), so the refusal above is the name check's."""
    dest, other = interrupted(here)
    backup = backup_path(dest, T1)
    os.link(dest, backup)
    plan = Plan(token=T1, outputs=[OutputPlan(
        dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=os.fspath(backup),
        size=len(NEW))])
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(plan, UNPUBLISHING))
    (outcome,) = recover(here)
    assert (outcome.journal, outcome.action) == (path, "rolled back")
    assert dest.read_bytes() == OLD and other.read_bytes() == OTHER
    assert not path.exists() and not backup.exists()


def dotdot_plan(here: Path, what: str) -> tuple[Plan, str, str]:
    """A plan of ``model.pte`` that names one path through ``.trtet-staging/..`` (so every
    directory it names is ours, and the path reaches root's file in ``here``); the state a
    replay of it would destroy that file in, and the path."""
    dest = here / "model.pte"
    via = os.fspath(here / ".trtet-staging") + "/.."
    first = OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                       size=len(NEW))
    if what == "source":  # a finished write deletes its consumed sources
        src = f"{via}/weights.bin"
        first.payloads = [move(Path(src), 100)]
        return Plan(token=T1, outputs=[first]), DONE, src
    if what == "output":  # unpublishing renames a dest whose temp is gone to its temp name,
        out = f"{via}/report.pte"  # and the rollback then deletes that temp
        second = OutputPlan(dest=out, temp=os.fspath(temp_path(Path(out), T1)), backup=None,
                            size=len(OTHER))
        return Plan(token=T1, outputs=[first, second]), UNPUBLISHING, out
    pin = os.fspath(pin_path(Path(via), T1))  # a journal removed removes its pins
    return Plan(token=T1, outputs=[first], pins=[pin]), ROLLING_BACK, pin


@pytest.mark.parametrize("what", ["source", "output", "pin"])
def test_a_journal_of_ours_naming_a_path_through_dotdot_is_not_replayed(here, what, caplog):
    dest, other = interrupted(here)
    weights, pin = here / "weights.bin", Path(pin_path(here, T1))
    weights.write_bytes(b"root's weights\n" * 40)
    pin.write_bytes(b"root's file at a pin's name\n")
    plan, at, named = dotdot_plan(here, what)
    assert os.path.normpath(named) != named
    reached = Path(os.path.normpath(named))
    assert reached in (weights, other, pin) and reached.exists()
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(plan, at))
    refused(here, path, f"its plan names {named!r}, not an absolute, normal path", caplog)
    assert weights.read_bytes() == b"root's weights\n" * 40 and other.read_bytes() == OTHER
    assert pin.read_bytes() == b"root's file at a pin's name\n"
