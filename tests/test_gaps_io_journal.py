"""Checks of a journal's plan and of journal reading that no test set up (a gap audit).

Each test writes a journal of ours (root's, in root's 0755 directory) whose plan has one
flaw a planted journal or a damaged one could have, and shows recovery refusing it as
not ours with nothing changed: a pin that is not a pin of its token (the journal's
removal would delete the file it names), a pin in a directory anyone writes, a consumed
copy's source in such a directory (finishing would delete it), a first output that is
not the file the journal is named for, a plan with no output, and a later output whose
directory is a link planted in a shared directory. And: a journal's start is capped at
exactly half of what recovery reads; the orphan sweep reading a journal through a pin
neither hangs on a FIFO planted at the journal's name nor drops its guard.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody
from test_audit_journal_plans import NEW, OLD, interrupted, refused
from test_audit_journal_plans import here as here  # the fixture  # noqa: PLC0414
from test_journal_plants import T1, journal_text, move, state

from trtet_store import recover
from trtet_store.io.journal import (
    DONE,
    JOURNAL_LIMIT,
    ROLLING_BACK,
    Journal,
    OutputPlan,
    PayloadPlan,
    Plan,
)
from trtet_store.io.names import journal_path, pin_path, temp_path

VICTIM = b"uid 65534's file, which root must not touch\n" * 20


def shared(here: Path, name: str = "shared") -> Path:
    """A 1777 directory (like /tmp) in ``here``: not a directory of ours."""
    d = here / name
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def nobodys_file(path: Path, data: bytes = VICTIM) -> Path:
    def write() -> None:
        path.write_bytes(data)
    as_nobody(write)
    assert path.stat().st_uid == NOBODY
    return path


def first_output(here: Path) -> OutputPlan:
    dest, _ = interrupted(here)
    return OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                      size=len(NEW))


@pytest.mark.parametrize("at", [ROLLING_BACK, DONE])
def test_a_pin_not_named_for_its_token_is_not_a_pin(here, at, caplog):
    """journal.py plan_problem: ``os.path.basename(pin) != .trtet-pin-<token>``. The pin
    here/report.pte (root's other program) would be deleted when the journal is removed."""
    plan = Plan(token=T1, outputs=[first_output(here)], pins=[os.fspath(here / "report.pte")])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, at))
    refused(here, path, f"its plan names the pin {here / 'report.pte'}, not one of its token",
            caplog)
    assert (here / "report.pte").exists()


def test_a_pin_in_a_directory_anyone_writes_is_not_ours(here, caplog):
    """journal.py plan_problem: ``if not dirs.ours(os.path.dirname(pin))``. A pin of the
    right name in a 1777 directory is uid 65534's file there; removing the journal would
    delete it."""
    d = shared(here)
    pin = nobodys_file(Path(pin_path(d, T1)))
    plan = Plan(token=T1, outputs=[first_output(here)], pins=[os.fspath(pin)])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names the pin {pin}, outside {here} and any directory of "
            "ours", caplog)
    assert pin.read_bytes() == VICTIM and pin.stat().st_uid == NOBODY


def test_a_pin_that_is_not_a_normal_path_is_refused(here, caplog):
    """journal.py plan_problem: ``if not _normal(pin)`` (a pin through ``..``)."""
    pin = os.fspath(here / ".trtet-staging" / ".." / f".trtet-pin-{T1}")
    plan = Plan(token=T1, outputs=[first_output(here)], pins=[pin])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names {pin!r}, not an absolute, normal path", caplog)


def test_pins_that_are_not_a_list_are_refused(here, caplog):
    """journal.py plan_problem: ``if not isinstance(plan.pins, list)``: a mapping of pins
    would be walked by its keys."""
    plan = Plan(token=T1, outputs=[first_output(here)],
                pins={os.fspath(here / "report.pte"): 1})  # type: ignore[arg-type]
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, "its plan's pins are not a list", caplog)


def test_a_consumed_copys_source_in_a_directory_anyone_writes_is_not_ours(here, caplog):
    """journal.py plan_problem: ``if p.placement in ("move", "insert") or p.consumed``. A copy
    that consumes its source: finishing deletes that source, here uid 65534's file in a
    1777 directory."""
    d = shared(here)
    source = nobodys_file(d / "0123456789abcdef-1.blob")
    out = first_output(here)
    out.payloads = [move(source, len(VICTIM), placement="copy")]
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=[out]), DONE))
    refused(here, path, f"its plan names the source {source}, outside {here} and any "
            "directory of ours", caplog)
    assert source.read_bytes() == VICTIM


def test_a_copys_source_that_is_not_a_path_is_refused(here, caplog):
    """journal.py plan_problem: ``elif not isinstance(p.source, str)``."""
    out = first_output(here)
    out.payloads = [PayloadPlan(source=7, offset=0, size=9, placement="copy",  # type: ignore
                                reason="x", chunk_size=1 << 20, chunk_digests=None)]
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=[out]), DONE))
    refused(here, path, "its plan names the source 7, not a path", caplog)


@pytest.mark.parametrize("at", [ROLLING_BACK, DONE])
def test_a_first_output_that_is_not_the_file_the_journal_is_named_for(here, at, caplog):
    """journal.py plan_problem: ``names.internal_stem(basename(first)) != stem``. The journal
    is model.pte's; its plan's first output is report.pte (root's other program), temp
    named for it and the token: finished, recovery would rename that temp over it."""
    interrupted(here)
    other = here / "report.pte"
    temp_path(other, T1).write_bytes(NEW)
    plan = Plan(token=T1, outputs=[OutputPlan(dest=os.fspath(other),
                                              temp=os.fspath(temp_path(other, T1)),
                                              backup=None, size=len(NEW))])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, at))
    refused(here, path, f"its plan's first output {other} is not the file its name says",
            caplog)
    assert other.read_bytes() != NEW


def test_a_plan_with_no_output_is_refused(here, caplog):
    """journal.py plan_problem: ``if not plan.outputs``."""
    interrupted(here)
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=[]), DONE))
    refused(here, path, "its plan has no outputs", caplog)


@pytest.mark.parametrize("dotdot", [True, False])
def test_a_first_output_that_is_not_a_normal_path_is_refused(here, caplog, dotdot):
    """journal.py plan_problem: the first output's own ``_normal`` check (said as the path,
    before the name is compared): a path through ``..``, or none at all (JSON null)."""
    interrupted(here)
    dest = os.fspath(here / ".trtet-staging" / ".." / "model.pte") if dotdot else None
    plan = Plan(token=T1, outputs=[OutputPlan(dest=dest, temp=os.fspath(
        temp_path(here / "model.pte", T1)), backup=None, size=len(NEW))])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names {dest!r}, not an absolute, normal path", caplog)


def test_a_later_outputs_directory_that_is_a_planted_link_is_not_ours(here, caplog):
    """journal.py _Dirs._check: the directory opened with O_NOFOLLOW. uid 65534 plants, in a
    1777 directory, a link to root's 0700 directory ``victim``; the plan's second output
    lies under the link. Followed, the check would see root's directory (ours) and
    recovery would rename a temp over victim/report.pte."""
    first = first_output(here)
    d = shared(here)
    victim = here / "victim"
    victim.mkdir(mode=0o700)
    (victim / "report.pte").write_bytes(OLD)
    temp_path(victim / "report.pte", T1).write_bytes(NEW)

    def plant() -> None:
        os.symlink(victim, d / "link")
    as_nobody(plant)
    second = d / "link" / "report.pte"
    plan = Plan(token=T1, outputs=[first, OutputPlan(
        dest=os.fspath(second), temp=os.fspath(temp_path(second, T1)), backup=None,
        size=len(NEW))])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names {second}, outside {here} and any directory of ours",
            caplog)
    assert (victim / "report.pte").read_bytes() == OLD


def _plan_of_size(dest: Path, n: int) -> Plan:
    """A plan whose journal start (its JSON and a newline) is exactly ``n`` bytes."""
    def plan(reason: str) -> Plan:
        return Plan(token=T1, outputs=[OutputPlan(
            dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None, size=9,
            payloads=[PayloadPlan(source=os.fspath(dest.parent / "a.blob"), offset=0, size=9,
                                  placement="move", reason=reason, chunk_size=1 << 20,
                                  chunk_digests=None, consumed=True)])])
    base = len(plan("").to_json()) + 1
    got = plan("r" * (n - base))
    assert len(got.to_json()) + 1 == n
    return got


def test_a_journal_start_of_exactly_half_the_read_limit_is_written_one_more_byte_is_not(
        tmp_path):
    """journal.py Journal.create: ``if len(data) > JOURNAL_LIMIT // 2`` (amend lines may
    repeat the plan, so a start of half what recovery reads is the most). At the cap: written
    and read back whole; one byte over: refused, nothing written."""
    dest = tmp_path / "model.pte"
    half = JOURNAL_LIMIT // 2
    path = journal_path(dest, T1)
    j = Journal.create(path, _plan_of_size(dest, half))
    try:
        assert path.stat().st_size == half
    finally:
        j.close()
    path.unlink()
    with pytest.raises(OSError, match=f"is {half + 1} bytes, over the {half} a journal may"):
        Journal.create(path, _plan_of_size(dest, half + 1))
    assert os.listdir(tmp_path) == []


def test_the_orphan_sweep_reading_a_journal_through_a_pin_never_waits_on_a_fifo(here):
    """journal.py read (source_paths): the journal opened as open_ours opens (O_NONBLOCK, a
    regular file of ours). A store directory of ours holds a pin to a journal beside a
    destination in a 1777 directory; the write is gone, and uid 65534 makes a FIFO at the
    journal's name. The sweep must answer at once and keep every file (it cannot tell
    what that journal pins), never block on the FIFO nor drop a file."""
    from trtet_store.io.orphans import pinned_paths

    d = shared(here)
    store = here / ".trtet-staging"
    (store / "0123456789abcdef-1.blob").write_bytes(OLD)
    journal = journal_path(d / "model.pte", T1)
    os.symlink(journal, pin_path(store, T1))
    as_nobody(lambda: os.mkfifo(journal, 0o666))
    before = state(here)

    class Hung(BaseException):  # not an OSError: the sweep must not take it for a refusal
        pass

    def hung(*_: object) -> None:
        raise Hung("the sweep waited on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        pinned = pinned_paths(store)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.fspath(store / "0123456789abcdef-1.blob") in pinned
    assert state(here) == before


def test_recover_of_a_journal_named_for_one_file_never_touches_the_other(here, caplog):
    """The control for the first-output check: the same journal named for report.pte is
    ours, and is replayed."""
    interrupted(here)
    other = here / "report.pte"
    temp_path(other, T1).write_bytes(NEW)
    plan = Plan(token=T1, outputs=[OutputPlan(dest=os.fspath(other),
                                              temp=os.fspath(temp_path(other, T1)),
                                              backup=None, size=len(NEW))])
    path = journal_path(other, T1)
    path.write_bytes(journal_text(plan, DONE))
    (outcome,) = [o for o in recover(here) if o.journal == path]
    assert outcome.action == "rolled forward", outcome
    assert other.read_bytes() == NEW


def test_recover_says_a_journal_not_ours_at_warning(here, caplog):
    """recovery.py: "not ours" is among the outcomes logged at WARNING (a library user who
    reads only warnings learns that a planted journal sits beside their file)."""
    import logging

    interrupted(here)
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(Plan(token=T1, outputs=[]), DONE))
    with caplog.at_level(logging.INFO, logger="trtet_store.recovery"):
        (outcome,) = recover(here)
    assert outcome.action == "not ours"
    said = [r for r in caplog.records if os.fspath(path) in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING], [
        (r.levelname, r.getMessage()) for r in said]
    assert "not ours" in said[0].getMessage() and "its plan has no outputs" in \
        said[0].getMessage()


def test_a_pin_of_another_token_is_not_this_journals_pin(here, caplog):
    """journal.py plan_problem: the pin's whole name is ``.trtet-pin-<token>`` of this
    journal's token, not any name with the prefix (final audit V5: ``startswith`` passed
    every test). Another write's pin beside it protects that write's staged files; a
    journal naming it would have recovery delete it."""
    other = "f" * len(T1)
    assert other != T1
    theirs = Path(pin_path(here, other))
    theirs.write_bytes(b"another write's pin\n")
    plan = Plan(token=T1, outputs=[first_output(here)], pins=[os.fspath(theirs)])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names the pin {theirs}, not one of its token", caplog)
    assert theirs.read_bytes() == b"another write's pin\n"
