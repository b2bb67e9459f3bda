"""io/journal.py plan_problem and parse, each rule given the plan it exists for.

Called directly on a journal path in a directory of ours (nothing is read or
changed by plan_problem): a name that is not a journal's; a temp path that is
not absolute and normal; a backup not named for the journal's token; a moved
source that is not absolute and normal; pins that are not a list; a copy's
source (only read) may lie anywhere, but must be a path; the journal's own
directory reached through a link on the way is still its own. ``parse`` calls
a complete but unreadable plan damaged (JournalError), never a crash.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.io.errors import JournalError
from trtet_store.io.journal import OutputPlan, PayloadPlan, Plan, parse, plan_problem
from trtet_store.io.names import backup_path, journal_path, temp_path

T1, T2 = "0123456789abcdef", "fedcba9876543210"


def _plan(d: Path, **out) -> tuple[Path, Plan]:
    dest = d / "model.pte"
    o = OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                   size=10)
    for k, v in out.items():
        setattr(o, k, v)
    return journal_path(dest, T1), Plan(token=T1, outputs=[o])


def _payload(source: object, placement: str) -> PayloadPlan:
    return PayloadPlan(source=source, offset=0, size=10, placement=placement, reason="",
                       chunk_size=4096, chunk_digests=[1])


def test_each_path_rule_of_a_plan(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    path, plan = _plan(d)
    assert plan_problem(path, plan) is None
    assert plan_problem(d / "model.pte.json", plan) == "its name is not a write journal's"

    bad_temp = f"{d}/../d/{temp_path(d / 'model.pte', T1).name}"
    path, plan = _plan(d, temp=bad_temp)
    assert plan_problem(path, plan) == f"its plan names {bad_temp!r}, not an absolute, normal path"

    theirs = os.fspath(backup_path(d / "model.pte", T2))
    path, plan = _plan(d, backup=theirs)
    assert plan_problem(path, plan) == (f"its plan names the backup {theirs}, not "
                                        f"{d / 'model.pte'}'s for its token")
    ours = os.fspath(backup_path(d / "model.pte", T1))
    path, plan = _plan(d, backup=ours)
    assert plan_problem(path, plan) is None

    path, plan = _plan(d, payloads=[_payload("blobs/x.blob", "move")])
    assert plan_problem(path, plan) == \
        "its plan names 'blobs/x.blob', not an absolute, normal path"
    path, plan = _plan(d, payloads=[_payload("/etc/hostname", "copy")])  # only read
    assert plan_problem(path, plan) is None
    path, plan = _plan(d, payloads=[_payload(7, "copy")])
    assert plan_problem(path, plan) == "its plan names the source 7, not a path"

    path, plan = _plan(d)
    plan.pins = {"a": 1}
    assert plan_problem(path, plan) == "its plan's pins are not a list"


def test_the_journals_directory_reached_through_a_link_is_its_own(tmp_path: Path) -> None:
    """Even a shared (1777) journal directory, which is no directory of ours: reached by
    another path (a link on the way, not at its end), it is the journal's own by inode."""
    d = tmp_path / "top" / "d"
    d.mkdir(parents=True)
    os.chmod(d, 0o1777)
    os.symlink(tmp_path / "top", tmp_path / "via")
    path, plan = _plan(d)
    pin = tmp_path / "via" / "d" / f".trtet-pin-{T1}"
    plan.pins = [os.fspath(pin)]
    assert plan_problem(path, plan) is None
    plan.pins = [os.fspath(tmp_path / "top" / f".trtet-pin-{T1}")]  # ours too (0755, root's)
    assert plan_problem(path, plan) is None
    # The first output's directory missing: not the journal's.
    gone = tmp_path / "gone" / "model.pte"
    plan.outputs[0].dest = os.fspath(gone)
    plan.outputs[0].temp = os.fspath(temp_path(gone, T1))
    assert plan_problem(path, plan) == f"its plan's first output {gone} is not in {d}"


@pytest.mark.parametrize("line", [b"{}", b'{"token": "0123456789abcdef"}', b"[1, 2]", b'"x"',
                                  b'{"token": 5, "outputs": 7}'])
def test_a_complete_but_unreadable_plan_is_damaged_not_a_crash(line: bytes,
                                                               tmp_path: Path) -> None:
    with pytest.raises(JournalError):
        parse(line + b"\n", tmp_path / "j")


def test_read_gives_our_journals_plan_and_state_and_refuses_another_users(
        tmp_path: Path) -> None:
    from trtet_store.io import NotOursError
    from trtet_store.io.journal import DONE, read

    d = tmp_path / "d"
    d.mkdir()
    path, plan = _plan(d)
    path.write_bytes((plan.to_json() + "\n" + f'{{"state":"{DONE}"}}' + "\n").encode())
    got, state = read(path)
    assert (got.token, got.outputs[0].dest, state) == (T1, plan.outputs[0].dest, DONE)
    os.chown(path, 65534, 65534)
    with pytest.raises(NotOursError, match="owned by uid 65534"):
        read(path)


def test_a_write_removes_its_own_destinations_torn_journal_and_goes_ahead(
        tmp_path: Path, caplog) -> None:
    """recover_destination: a journal of this very destination whose plan line was never
    completed (its writer killed while writing it) is removed by the next write of it."""
    from trtet_store.io import write_file

    d = tmp_path / "d"
    d.mkdir()
    dest = d / "model.pte"
    dest.write_bytes(b"old")
    torn = journal_path(dest, T1)
    torn.write_bytes(b'{"token": "0123456789abcdef", "outp')  # no newline: never complete
    write_file(dest, [b"the new program"])
    assert dest.read_bytes() == b"the new program"
    assert not torn.exists()
    assert sorted(os.listdir(d)) == ["model.pte"]


def test_a_missing_directory_is_ours_only_under_a_directory_of_ours(tmp_path: Path) -> None:
    """_Dirs.ours: a directory gone since (a staging directory deleted) counts as ours only
    when its parent does: under a shared 1777 directory it is anyone's."""
    d = tmp_path / "d"
    d.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    path, plan = _plan(d)
    plan.pins = [os.fspath(d / "gone" / "deeper" / f".trtet-pin-{T1}")]
    assert plan_problem(path, plan) is None
    pin = shared / "gone" / f".trtet-pin-{T1}"
    plan.pins = [os.fspath(pin)]
    assert plan_problem(path, plan) == \
        f"its plan names the pin {pin}, outside {d} and any directory of ours"
