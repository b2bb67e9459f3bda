"""io/journal.py plan_problem (_normal, _Dirs.same_as_home): two path rules no test set up.

- a plan path holding a NUL byte is not an absolute, normal path: refused with that
  reason, never handed to an ``os`` call (which raises ValueError, not a refusal);
- the journal's own directory is the same directory by device AND inode: the root of
  another filesystem (a tmpfs's root has inode 1 on every tmpfs) is not it.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.io.journal import OutputPlan, Plan, plan_problem
from trtet_store.io.names import journal_path, temp_path

T1 = "0123456789abcdef"


def _plan(d: Path, dest_dir: Path | None = None) -> tuple[Path, Plan]:
    dest = (dest_dir or d) / "model.pte"
    o = OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                   size=10)
    return journal_path(d / "model.pte", T1), Plan(token=T1, outputs=[o])


def test_a_plan_path_with_a_nul_byte_is_refused_not_a_crash(tmp_path: Path) -> None:
    """_normal: ``"\\0" not in p``. A pin (and a moved source) naming a NUL byte."""
    path, plan = _plan(tmp_path)
    assert plan_problem(path, plan) is None
    pin = f"{tmp_path}/x\0y/.trtet-pin-{T1}"
    plan.pins = [pin]
    assert plan_problem(path, plan) == f"its plan names {pin!r}, not an absolute, normal path"


def test_the_root_of_another_filesystem_is_not_the_journals_directory(make_fs) -> None:
    """_Dirs.same_as_home: ``(st_dev, st_ino) == (home.st_dev, home.st_ino)``. Two tmpfs
    roots share inode 1; a plan whose first output is in the other one is refused."""
    home, other = make_fs("tmpfs", 1), make_fs("tmpfs", 1)
    a, b = os.stat(home), os.stat(other)
    assert a.st_ino == b.st_ino and a.st_dev != b.st_dev  # the state this test needs
    path, plan = _plan(home)
    assert plan_problem(path, plan) is None
    path, plan = _plan(home, dest_dir=other)
    first = plan.outputs[0].dest
    assert plan_problem(path, plan) == f"its plan's first output {first} is not in {home}"
    assert os.listdir(home) == [] and os.listdir(other) == []


def test_the_journals_directory_named_by_a_link_to_it_is_its_own(tmp_path: Path) -> None:
    """_Dirs.same_as_home: a directory found the same as the journal's (by device and inode)
    is remembered as ours (``if ok: self._ours[d] = True``): named through a link to it, it is
    not then refused by the check that opens a directory without following its last link."""
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(home, tmp_path / "alias")
    path, plan = _plan(home, dest_dir=tmp_path / "alias")
    assert plan_problem(path, plan) is None
    path, plan = _plan(home, dest_dir=tmp_path / "alias")  # a later output there too
    plan.outputs.append(OutputPlan(dest=f"{tmp_path}/alias/b.pte",
                                   temp=os.fspath(temp_path(tmp_path / "alias" / "b.pte", T1)),
                                   backup=None, size=1))
    assert plan_problem(path, plan) is None


def test_a_journal_directory_gone_since_makes_no_other_directory_its_own(tmp_path: Path) -> None:
    """_Dirs.same_as_home_id: the journal's directory can no longer be looked up (renamed
    away after the journal was read): then no directory is it (``return False``), and a pin
    in a shared 1777 directory is refused as anyone's."""
    home = tmp_path / "home"  # never made: as if renamed away since
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    path, plan = _plan(home)
    pin = shared / f".trtet-pin-{T1}"
    plan.pins = [os.fspath(pin)]
    assert plan_problem(path, plan) == \
        f"its plan names the pin {pin}, outside {home} and any directory of ours"
