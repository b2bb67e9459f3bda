"""LoweringOptions: ``lowering=`` of export and compile_and_save, the old keywords beside it.

The two spellings write byte-identical programs (the TensorRT build stubbed
at its seam, everything after it real); a keyword given beside the object
with another value, and a keyword nobody knows, are refused before anything
is built or written; the caller's object is the same after the call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

import trtet_store
from trtet_store import LoweringOptions
from trtet_store.export import tensorrt as trt
from trtet_store.export.lowering import export
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

# What reaches the program: the budget is a compile spec of every delegate, the
# constant method is a method of the .pte.
OPTIONS = dict(weight_streaming_budget_per_engine=1 << 20, constant_methods={"vocab": 7})


def _files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


def _nothing_built(builder: FakeBuilder, directory: Path) -> None:
    assert builder.built == []
    assert list(directory.iterdir()) == []


def test_lowering_and_the_old_keywords_write_byte_identical_programs(here_fs):
    module, inputs = linear_relu()
    runs = {}
    for how in ("keywords", "lowering", "both"):
        out = here_fs / how
        out.mkdir()
        kw = {"keywords": OPTIONS, "lowering": {"lowering": LoweringOptions(**OPTIONS)},
              # the same value both ways is no conflict
              "both": {"lowering": LoweringOptions(**OPTIONS),
                       "weight_streaming_budget_per_engine": 1 << 20}}[how]
        with installed(FakeBuilder(engine_sizes=(MiB, MiB))):
            report = trtet_store.compile_and_save(module, inputs, out / "m.pte", **kw)
        assert report.data_paths == []
        runs[how] = _files(out)
    plain = here_fs / "plain"
    plain.mkdir()
    with installed(FakeBuilder(engine_sizes=(MiB, MiB))):
        trtet_store.compile_and_save(module, inputs, plain / "m.pte")
    assert runs["keywords"] == runs["lowering"] == runs["both"]
    assert _files(plain) != runs["lowering"]  # the options reached the program


def test_export_takes_lowering_as_its_keywords(here_fs):
    module, inputs = linear_relu()
    programs = []
    for n, kw in enumerate((OPTIONS, {"lowering": LoweringOptions(**OPTIONS)})):
        with trtet_store.BlobStore(here_fs / str(n)) as store, \
                installed(FakeBuilder(engine_sizes=(MiB,))):
            buffer = export(module, inputs=inputs, store=store, **kw).to_executorch().buffer
            programs.append(hashlib.sha256(buffer).hexdigest())
    assert programs[0] == programs[1]


def test_a_keyword_beside_lowering_with_another_value_is_refused_before_a_build(here_fs):
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(MiB,))
    with installed(builder), pytest.raises(
            TypeError, match=r"compile_and_save\(\): backend given both as keyword "
                             r"\(backend='tensorrt'\) and in lowering \(backend='xnnpack'\)"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", backend="tensorrt",
                                     lowering=LoweringOptions(backend="xnnpack"))
    _nothing_built(builder, here_fs)
    with installed(builder), pytest.raises(TypeError, match=r"export\(\): constant_methods "
                                                            "given both"):
        export(module, inputs=inputs, constant_methods={"a": 1},
               lowering=LoweringOptions(constant_methods={"a": 2}))
    with installed(builder), pytest.raises(TypeError, match="lowering must be a "
                                                            "trtet_store.export.options"):
        export(module, inputs=inputs, lowering={"backend": "xnnpack"})
    _nothing_built(builder, here_fs)


def test_an_unknown_keyword_beside_lowering_is_still_refused(here_fs):
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(MiB,))
    with installed(builder), pytest.raises(
            TypeError, match=r"unexpected keyword argument 'extrnal_weights'.*"
                             r"did you mean 'external_weights'"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte",
                                     lowering=LoweringOptions(), extrnal_weights="w")
    _nothing_built(builder, here_fs)


def test_a_bad_option_is_refused_when_the_object_is_made():
    with pytest.raises(ValueError, match="backend must be one of"):
        LoweringOptions(backend="tensorrtt")
    with pytest.raises(ValueError, match="applies to backend='tensorrt'"):
        LoweringOptions(backend="xnnpack", weight_streaming_budget_per_engine=1)
    for field in ("external_engine_data", "external_weights"):
        with pytest.raises(ValueError, match="escape"):
            LoweringOptions(**{field: "../escape"})


def test_the_callers_lowering_is_not_changed(here_fs):
    module, inputs = linear_relu()
    methods = {"vocab": 7}
    options = LoweringOptions(backend="xnnpack", external_engine_data="w",
                              constant_methods=methods)
    before = dataclasses.asdict(options)
    report = trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", lowering=options)
    assert report.data_paths == [here_fs / "w.ptd"]
    # With xnnpack external_engine_data is where the weights go: the call's own reading,
    # not written back into the caller's object.
    assert dataclasses.asdict(options) == before and options.external_weights is None
    assert options.constant_methods is methods and methods == {"vocab": 7}


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))
