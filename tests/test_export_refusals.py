"""A refused save of an ExecuTorch program changes nothing, owned payloads included.

``save_program(..., consume=True)`` adopts the payload files ExecuTorch owns
(``FileBackedData.move_from`` / ``cleanup=True``) into a store before it
writes. When the write is then refused or rolled back, every adopted file is
back at its path, byte-identical, owned by ExecuTorch again (a finalizer
deletes it with its payload, as before), and the program can be saved again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from digests import file_digest
from programs import named_data_program, standard_entries

from trtet_store import InsufficientSpaceError
from trtet_store.export import _executorch_private as priv
from trtet_store.export.executorch import save_program

pytestmark = pytest.mark.skipif(
    not priv.has_file_backed_data(), reason="executorch 1.4 has no FileBackedData")


def _owned(sp) -> dict[str, str]:
    return {p: file_digest(p) for p in (sp.moved._path, sp.cleanup._path)}


def _assert_unchanged(sp, before: dict[str, str], src: Path) -> None:
    assert _owned(sp) == before
    assert priv.file_backed_owns_file(sp.moved) and priv.file_backed_owns_file(sp.cleanup)
    assert priv.attached_blob(sp.moved) is None and priv.attached_blob(sp.cleanup) is None
    # Nothing of ours is left beside the payloads: no store, no journal, no temp file.
    assert sorted(p.name for p in src.iterdir()) == sorted(
        Path(p).name for p in [*before, sp.user_path])


def _refused_then_saved(tmp_path: Path, dest: Path, error: type[BaseException]) -> None:
    src = tmp_path / "src"
    sp = standard_entries(src, 1 << 20)
    program = named_data_program(sp.entries)
    before = _owned(sp)
    with pytest.raises(error):
        save_program(program, dest, consume=True)
    _assert_unchanged(sp, before, src)
    # Still a valid program: ExecuTorch's own save and ours write it.
    out = tmp_path / "again"
    out.mkdir()
    program.save(os.fspath(out / "program.pte"))
    save_program(program, out / "ours.pte")
    assert file_digest(out / "ours.pte") == file_digest(out / "program.pte")
    # ExecuTorch owns the files again: a live finalizer deletes each with its payload.
    for path in before:
        assert [f.alive for f in priv._finalizers_removing(path)] == [True]


def test_consuming_save_into_a_missing_directory_changes_nothing(tmp_path):
    _refused_then_saved(tmp_path, tmp_path / "missing" / "program.pte", FileNotFoundError)


def test_consuming_save_refused_by_the_preflight_changes_nothing(tmp_path, make_fs):
    small = make_fs("tmpfs", 1)
    _refused_then_saved(tmp_path, small / "program.pte", InsufficientSpaceError)
