"""io/journal.py plan_problem: three rules of a journal's plan no test set up (a gap hunt).

Each journal is root's, in root's 0755 directory, with one flaw: its plan's token is not
the one in its name; its first output lies in another directory of ours (the staging
directory) instead of the journal's own; a pin is a relative path. Recovery reports it
not ours, changes nothing, and a later write of the destination goes ahead.
"""

from __future__ import annotations

import os

import pytest
from test_audit_journal_plans import NEW, interrupted, refused
from test_audit_journal_plans import here as here  # the fixture  # noqa: PLC0414
from test_gaps_io_journal import first_output
from test_journal_plants import T1, T2, journal_text

from trtet_store.io.journal import DONE, ROLLING_BACK, OutputPlan, Plan
from trtet_store.io.names import journal_path, temp_path


@pytest.mark.parametrize("at", [ROLLING_BACK, DONE])
def test_a_plan_of_another_token_than_its_name_is_refused(here, at, caplog):
    """journal.py plan_problem: ``if plan.token != token``. The journal is named for T1; its
    plan says T2 (its temp still T1's): recovery would act for a write that never was."""
    plan = Plan(token=T2, outputs=[first_output(here)])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, at))
    refused(here, path, f"its plan's token {T2!r} is not the one in its name", caplog)


@pytest.mark.parametrize("at", [ROLLING_BACK, DONE])
def test_a_first_output_in_another_directory_of_ours_is_refused(here, at, caplog):
    """journal.py plan_problem: ``if not dirs.same_as_home(os.path.dirname(first))``: the
    first output is the file in the journal's own directory, not one of that name in
    another directory of ours (root's 0700 staging directory here)."""
    interrupted(here)
    other = here / ".trtet-staging" / "model.pte"
    other.write_bytes(b"root's staged file\n")
    temp_path(other, T1).write_bytes(NEW)
    plan = Plan(token=T1, outputs=[OutputPlan(dest=os.fspath(other),
                                              temp=os.fspath(temp_path(other, T1)),
                                              backup=None, size=len(NEW))])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, at))
    refused(here, path, f"its plan's first output {other} is not in {here}", caplog)
    assert other.read_bytes() == b"root's staged file\n"


def test_a_relative_pin_is_refused(here, caplog, monkeypatch):
    """journal.py _normal: ``os.path.isabs(p)``: a relative pin would be resolved against
    whatever directory recovery runs in (here the journal's own, where the pin's
    directory is root's staging directory: accepted, the file there would be removed)."""
    monkeypatch.chdir(here)
    (here / ".trtet-staging" / f".trtet-pin-{T1}").write_bytes(b"root's file")
    pin = f".trtet-staging/.trtet-pin-{T1}"
    plan = Plan(token=T1, outputs=[first_output(here)], pins=[pin])
    path = journal_path(here / "model.pte", T1)
    path.write_bytes(journal_text(plan, DONE))
    refused(here, path, f"its plan names {pin!r}, not an absolute, normal path", caplog)
