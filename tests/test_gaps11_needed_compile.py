"""compile_and_save (trtet_store/export/compile.py: ``_destinations``, the neighbours check
before the build) refuses a ``.ptd`` that another ``.pte`` beside ``path`` needs BEFORE the
build for every ``.ptd`` named up front: the lowering's ``external_weights`` as well as its
``external_engine_data`` (tests/test_neighbours.py covers the latter). A ``.ptd`` left out
of the destinations would be found only at the write, after the build was paid for (minutes
to hours with real TensorRT), or never. ``replace_needed=True`` is the opt-in.
"""

from __future__ import annotations

import pytest
from digests import file_digest
from lowered import xnnpack_linear_program

import trtet_store

pytestmark = pytest.mark.executorch(reason="real programs and a stub TensorRT build")


@pytest.fixture(scope="module")
def program_a():
    """An XNNPACK program whose weights are in ``cpu.ptd``."""
    return xnnpack_linear_program(external_tag="cpu", seed=0)


@pytest.fixture
def builder(monkeypatch):
    from trtet_store.export import tensorrt as trt
    from trtet_store.io.units import MiB
    from trtet_store.testing.stub_tensorrt import FakeBuilder

    built = FakeBuilder(engine_sizes=(MiB,))
    monkeypatch.setattr(trt, "build_engines", built)
    monkeypatch.setattr(trt, "check_available", lambda: None)
    yield built
    trt.unregister_engines(list(trt._engines.values()))


def _snapshot(directory):
    return {p.name: (file_digest(p) if p.is_file() else "dir") for p in directory.iterdir()}


@pytest.mark.parametrize("how", ["lowering", "keyword"])
def test_compile_and_save_refuses_external_weights_another_program_needs_before_the_build(
        here_fs, program_a, builder, how) -> None:
    from trtet_store.testing.stub_tensorrt import linear_relu

    trtet_store.save_program(program_a.manager, here_fs / "a.pte")
    before = _snapshot(here_fs)
    assert sorted(before) == ["a.pte", "cpu.ptd"]
    module, inputs = linear_relu()
    given = {"lowering": trtet_store.LoweringOptions(external_weights="cpu")} \
        if how == "lowering" else {"external_weights": "cpu"}
    with pytest.raises(trtet_store.NeededByAnotherError):
        trtet_store.compile_and_save(module, inputs, here_fs / "b.pte", **given)
    assert builder.built == []  # refused before the build: no build was paid for
    assert _snapshot(here_fs) == before  # a's files byte-identical, nothing stray


def test_compile_and_save_external_weights_with_replace_needed_builds(here_fs, program_a,
                                                                      builder) -> None:
    """The control: the opt-in goes on to the build and the write."""
    from trtet_store.testing.stub_tensorrt import linear_relu

    trtet_store.save_program(program_a.manager, here_fs / "a.pte")
    module, inputs = linear_relu()
    trtet_store.compile_and_save(module, inputs, here_fs / "b.pte", external_weights="cpu",
                                 replace_needed=True)
    assert len(builder.built) == 1 and (here_fs / "b.pte").stat().st_size > 0
