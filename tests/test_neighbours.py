"""Issue 34 item 2: a write never replaces a ``.ptd`` that another ``.pte`` of its directory needs.

ExecuTorch names ``.ptd`` files by tag: two programs exported with the tag
``cpu`` both write ``cpu.ptd``. Real programs (tests/programs.py): ``a.pte``
and its ``cpu.ptd`` are saved, then ``b`` (other weights, same tag) is saved
into the same directory: refused before anything is written, ``a``'s files
byte-identical, no stray file; ``replace_needed=True`` replaces; the same
program saved over itself is not refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from digests import file_digest
from lowered import portable_linear_program, xnnpack_linear_program  # once a run, copied
from versions import needs_file_backed_data

import trtet_store
from trtet_store.inspector import verify
from trtet_store.inspector.neighbours import check_neighbours, read_program_needs, read_ptd_keys


@pytest.fixture(scope="module")
def programs():
    """Two XNNPACK programs with weights in ``cpu.ptd`` (other seeds: other weights)."""
    return (xnnpack_linear_program(external_tag="cpu", seed=0),
            xnnpack_linear_program(external_tag="cpu", seed=1))


def _snapshot(directory: Path) -> dict[str, str]:
    """Every entry of ``directory`` (hidden ones too) with its content digest."""
    return {p.name: (file_digest(p) if p.is_file() else "dir") for p in directory.iterdir()}


def _saved_a(directory: Path, program) -> dict[str, str]:
    trtet_store.save_program(program.manager, directory / "a.pte")
    assert sorted(p.name for p in directory.iterdir()) == ["a.pte", "cpu.ptd"]
    return _snapshot(directory)


def test_a_second_program_into_the_same_directory_is_refused(here_fs, programs):
    a, b = programs
    before = _saved_a(here_fs, a)
    with pytest.raises(trtet_store.NeededByAnotherError) as err:
        trtet_store.save_program(b.manager, here_fs / "b.pte")
    message = str(err.value)
    # Names the file, the program that needs it, and what to do.
    assert os.fspath(here_fs / "cpu.ptd") in message
    assert os.fspath(here_fs / "a.pte") in message
    assert "separate directory" in message and "replace_needed=True" in message
    assert err.value.needed_by == [os.fspath(here_fs / "a.pte")]
    assert isinstance(err.value, FileExistsError)
    # Nothing written: a's files byte-identical, no b.pte, no temp or journal left.
    assert _snapshot(here_fs) == before
    assert verify(here_fs / "a.pte").ok


def test_write_tensor_data_is_refused_too(here_fs, programs):
    a, b = programs
    before = _saved_a(here_fs, a)
    with pytest.raises(trtet_store.NeededByAnotherError):
        trtet_store.write_tensor_data(b.manager, here_fs)
    assert _snapshot(here_fs) == before


def test_the_opt_in_replaces(here_fs, programs):
    a, b = programs
    before = _saved_a(here_fs, a)
    trtet_store.save_program(b.manager, here_fs / "b.pte", replace_needed=True)
    after = _snapshot(here_fs)
    assert sorted(after) == ["a.pte", "b.pte", "cpu.ptd"]
    assert after["a.pte"] == before["a.pte"] and after["cpu.ptd"] != before["cpu.ptd"]
    assert verify(here_fs / "b.pte").ok
    assert not verify(here_fs / "a.pte").ok  # what the refusal protects against


def test_the_same_program_saved_over_itself_is_not_refused(here_fs, programs):
    a, b = programs
    _saved_a(here_fs, a)
    trtet_store.save_program(a.manager, here_fs / "a.pte")  # same program, same name
    trtet_store.save_program(b.manager, here_fs / "a.pte")  # another program, a's own name
    assert sorted(p.name for p in here_fs.iterdir()) == ["a.pte", "cpu.ptd"]
    assert verify(here_fs / "a.pte").ok


def test_a_separate_directory_is_not_refused(here_fs, programs):
    a, b = programs
    _saved_a(here_fs, a)
    (here_fs / "b").mkdir()
    trtet_store.save_program(b.manager, here_fs / "b" / "b.pte")
    assert verify(here_fs / "a.pte").ok and verify(here_fs / "b" / "b.pte").ok


def test_external_tensors_by_name_are_needed(here_fs):
    """The portable program's emitter constants: keys are tensor names, not digests."""
    a, b = portable_linear_program(seed=0), portable_linear_program(seed=1)
    trtet_store.save_program(a.manager, here_fs / "a.pte")
    before = _snapshot(here_fs)
    with pytest.raises(trtet_store.NeededByAnotherError, match="l1.weight"):
        trtet_store.save_program(b.manager, here_fs / "b.pte")
    assert _snapshot(here_fs) == before


def test_an_unreadable_neighbour_is_taken_to_need_it(here_fs, programs):
    a, b = programs
    _saved_a(here_fs, a)
    (here_fs / "a.pte").write_bytes(b"\0" * 100)  # damaged: cannot tell what it needs
    before = _snapshot(here_fs)
    with pytest.raises(trtet_store.NeededByAnotherError, match="could not be read"):
        trtet_store.save_program(b.manager, here_fs / "b.pte")
    assert _snapshot(here_fs) == before


def test_a_program_that_needs_nothing_of_it_does_not_block(here_fs, programs):
    a, _ = programs
    inline = xnnpack_linear_program(external_tag=None, seed=2)  # weights in its .pte
    trtet_store.save_program(inline.manager, here_fs / "inline.pte")
    trtet_store.save_program(a.manager, here_fs / "a.pte")
    trtet_store.save_program(a.manager, here_fs / "a.pte")
    assert verify(here_fs / "a.pte").ok


def test_compile_and_save_refuses_before_the_build(here_fs, programs, monkeypatch):
    from trtet_store.export import tensorrt as trt
    from trtet_store.io.units import MiB
    from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

    builder = FakeBuilder(engine_sizes=(MiB,))
    monkeypatch.setattr(trt, "build_engines", builder)
    monkeypatch.setattr(trt, "check_available", lambda: None)
    a, _ = programs
    before = _saved_a(here_fs, a)
    module, inputs = linear_relu()
    with pytest.raises(trtet_store.NeededByAnotherError):
        trtet_store.compile_and_save(module, inputs, here_fs / "b.pte",
                                     external_engine_data="cpu")
    assert builder.built == []  # no build was paid for
    assert _snapshot(here_fs) == before


def test_the_light_reader_agrees_with_the_inspector(here_fs, programs):
    """What neighbours reads without executorch is what the verifier reads with it."""
    a, _ = programs
    portable = portable_linear_program()
    trtet_store.save_program(a.manager, here_fs / "a.pte")
    trtet_store.save_program(portable.manager, here_fs / "p.pte")
    for pte in ("a.pte", "p.pte"):
        result = verify(here_fs / pte)
        needed = {e["key"] for e in result.external_data["needed"]}
        holders = {e["found_in"] for e in result.external_data["needed"]}
        for holder in holders:
            keys = read_ptd_keys(holder)
            assert set(read_program_needs(here_fs / pte).needed_of(keys)) == needed & keys


def test_the_check_imports_neither_torch_nor_executorch(here_fs, programs):
    a, b = programs
    _saved_a(here_fs, a)
    code = ("import sys\n"
            "from trtet_store.inspector.neighbours import check_neighbours\n"
            "from trtet_store.io import NeededByAnotherError\n"
            "try:\n"
            f"    check_neighbours({os.fspath(here_fs)!r}, ['cpu.ptd'], program='b.pte')\n"
            "except NeededByAnotherError:\n"
            "    print('refused')\n"
            "print(sorted(m for m in ('torch', 'executorch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["refused", "[]"]
    check_neighbours(here_fs, ["cpu.ptd"], program="a.pte")  # its own: not refused
    check_neighbours(here_fs, ["cpu.ptd"], program=None, replace_needed=True)
    check_neighbours(here_fs, ["other.ptd"], program=None)  # replaces nothing


@needs_file_backed_data
def test_a_tensorrt_engine_key_is_needed(here_fs, monkeypatch):
    """Engines as named data (``engine_key`` in the delegate's metadata) in ``engines.ptd``."""
    from trtet_store.export import tensorrt as trt
    from trtet_store.io.units import MiB
    from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

    builder = FakeBuilder(engine_sizes=(MiB, MiB // 2))
    monkeypatch.setattr(trt, "build_engines", builder)
    monkeypatch.setattr(trt, "check_available", lambda: None)
    module, inputs = linear_relu()
    trtet_store.compile_and_save(module, inputs, here_fs / "a.pte",
                                 external_engine_data="engines")
    built = len(builder.built)
    keys = read_ptd_keys(here_fs / "engines.ptd")
    assert len(keys) == 2 and all(k.endswith("_trt_engine") for k in keys)
    assert set(read_program_needs(here_fs / "a.pte").needed_of(keys)) == keys
    before = _snapshot(here_fs)
    with pytest.raises(trtet_store.NeededByAnotherError, match="_trt_engine"):
        trtet_store.compile_and_save(module, inputs, here_fs / "b.pte",
                                     external_engine_data="engines")
    assert len(builder.built) == built and _snapshot(here_fs) == before


def test_a_consuming_save_refused_gives_everything_back(here_fs, programs):
    """consume=True: the refusal comes after the plan adopted payloads; they are given back."""
    a, b = programs
    before = _saved_a(here_fs, a)
    with pytest.raises(trtet_store.NeededByAnotherError):
        trtet_store.save_program(b.manager, here_fs / "b.pte", consume=True)
    assert _snapshot(here_fs) == before
    (here_fs / "b").mkdir()
    trtet_store.save_program(b.manager, here_fs / "b" / "b.pte", consume=True)
    assert verify(here_fs / "b" / "b.pte").ok and verify(here_fs / "a.pte").ok
