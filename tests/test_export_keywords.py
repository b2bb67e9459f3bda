"""What export and compile_and_save take (issue 22, findings 3, 4, engine_reuse, lowering).

Unknown keywords and compile settings are refused by name before anything is
built; the caller's ExportedProgram is never changed; the build fingerprint
tells apart what builds different engines; and the lowering refusals the
mutation audit found untested are tested.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest
import torch

import trtet_store
from trtet_store.export import engine_reuse, trt_settings
from trtet_store.export import tensorrt as trt
from trtet_store.export.lowering import export
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu


class Recording(FakeBuilder):
    """A FakeBuilder that remembers the program and settings it was given."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple] = []

    def __call__(self, exported_program, arg_inputs, kwarg_inputs, store, settings):
        self.calls.append((exported_program, dict(settings)))
        return super().__call__(exported_program, arg_inputs, kwarg_inputs, store, settings)


def _refused(directory: Path, call, match: str) -> None:
    builder = Recording(engine_sizes=(1 * MiB,))
    with installed(builder), pytest.raises(TypeError, match=match):
        call()
    assert builder.calls == []
    assert list(directory.iterdir()) == []


# -- unknown keywords --------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["tensorrt", "xnnpack"])
def test_a_misspelt_keyword_is_refused_naming_the_closest(here_fs, backend):
    module, inputs = linear_relu()
    _refused(here_fs, lambda: trtet_store.compile_and_save(
        module, inputs, here_fs / "m.pte", backend=backend, extrnal_weights="cpu"),
        r"'extrnal_weights'.*did you mean 'external_weights'")


def test_export_refuses_a_keyword_it_does_not_know(here_fs):
    module, inputs = linear_relu()
    store = trtet_store.BlobStore(here_fs)
    builder = Recording(engine_sizes=(1 * MiB,))
    with installed(builder), pytest.raises(
            TypeError, match=r"export\(\) got an unexpected keyword argument 'segment_aligment'"):
        export(module, inputs=inputs, segment_aligment=4096, store=store)
    assert builder.calls == [] and list(here_fs.glob("*.blob*")) == []
    store.close()


def test_tensorrt_settings_must_be_known_to_the_compiler(here_fs):
    module, inputs = linear_relu()
    _refused(here_fs, lambda: trtet_store.compile_and_save(
        module, inputs, here_fs / "m.pte", min_blok_size=2),
        r"'min_blok_size'.*did you mean 'min_block_size'")
    builder = Recording(engine_sizes=(1 * MiB,))
    with installed(builder):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", min_block_size=2,
                                     use_python_runtime=True)
    assert builder.calls[0][1] == {"min_block_size": 2, "use_python_runtime": True}


def test_compile_settings_with_xnnpack_are_refused(here_fs):
    module, inputs = linear_relu()
    _refused(here_fs, lambda: trtet_store.compile_and_save(
        module, inputs, here_fs / "m.pte", backend="xnnpack", min_block_size=2),
        r"compile settings \['min_block_size'\] with backend='xnnpack'")


@pytest.mark.gpu
def test_the_pinned_settings_are_torch_tensorrts_own():
    """Where torch_tensorrt imports, the restated lists are its dataclass and compile()."""
    if importlib.util.find_spec("torch_tensorrt") is None:
        pytest.skip("torch_tensorrt is not installed: the pinned lists are what is used")
    import dataclasses
    import inspect

    from torch_tensorrt.dynamo import compile as trt_compile
    from torch_tensorrt.dynamo._settings import CompilationSettings

    assert set(trt_settings.COMPILATION_SETTINGS_FIELDS) == {
        f.name for f in dataclasses.fields(CompilationSettings)}
    keywords = {p.name for p in inspect.signature(trt_compile).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(trt_settings.COMPILE_ONLY_KEYWORDS) == keywords - set(
        trt_settings.COMPILATION_SETTINGS_FIELDS) - {"arg_inputs", "kwarg_inputs"}


# -- the caller's program is never changed ---------------------------------------------------

def _meta(program) -> dict:
    return {n.name: repr(sorted(n.meta.get("custom", {}).items()))
            for n in program.graph_module.graph.nodes}


def test_external_weights_never_changes_the_callers_program(tmp_path):
    module, inputs = linear_relu()
    program = torch.export.export(module, inputs)
    graph, meta = str(program.graph_module.graph), _meta(program)
    first, second, fresh = (tmp_path / d for d in ("first", "second", "fresh"))
    for d in (first, second, fresh):
        d.mkdir()
    report = trtet_store.compile_and_save(program, None, first / "m.pte", backend="xnnpack",
                                          external_weights="w")
    assert report.data_paths == [first / "w.ptd"]
    assert _meta(program) == meta and str(program.graph_module.graph) == graph
    # The same program saved again without external_weights needs no .ptd ...
    report = trtet_store.compile_and_save(program, None, second / "m.pte", backend="xnnpack")
    assert report.data_paths == [] and sorted(p.name for p in second.iterdir()) == ["m.pte"]
    # ... and is byte for byte the program of an untouched export.
    trtet_store.compile_and_save(torch.export.export(module, inputs), None, fresh / "m.pte",
                                 backend="xnnpack")
    assert (second / "m.pte").read_bytes() == (fresh / "m.pte").read_bytes()


# -- the build fingerprint ---------------------------------------------------------------------

def test_the_fingerprint_follows_the_range_constraints():
    from torch.export import Dim

    module, inputs = linear_relu()
    small = torch.export.export(module, inputs, dynamic_shapes=({0: Dim("b", max=8)},))
    large = torch.export.export(module, inputs, dynamic_shapes=({0: Dim("b", max=64)},))
    assert str(small.graph_module.graph) == str(large.graph_module.graph)
    assert engine_reuse.build_fingerprint(small, inputs, None, {}) != \
        engine_reuse.build_fingerprint(large, inputs, None, {})
    again = torch.export.export(module, inputs, dynamic_shapes=({0: Dim("b", max=8)},))
    assert engine_reuse.build_fingerprint(small, inputs, None, {}) == \
        engine_reuse.build_fingerprint(again, inputs, None, {})


def _fake_wheel(site: Path, dist: str, version: str) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


@pytest.mark.parametrize("dist", ["tensorrt-cu12", "tensorrt-cu13-libs", "tensorrt_cu12_libs"])
def test_the_fingerprint_follows_every_tensorrt_wheel(tmp_path, monkeypatch, dist):
    """A TensorRT upgrade changes the fingerprint, whichever wheels carry TensorRT."""
    module, inputs = linear_relu()
    program = torch.export.export(module, inputs)
    prints = []
    for version in ("10.3.0", "10.4.0"):
        site = tmp_path / version
        _fake_wheel(site, dist, version)
        monkeypatch.syspath_prepend(os.fspath(site))
        importlib.invalidate_caches()
        name = dist.replace("_", "-")
        assert (name, version) in engine_reuse.build_versions()
        prints.append(engine_reuse.build_fingerprint(program, inputs, None, {}))
        monkeypatch.undo()
    assert prints[0] != prints[1]


# -- lowering refusals (mutation survivors) -------------------------------------------------

def test_retrace_true_is_refused_for_an_exported_program(here_fs):
    module, inputs = linear_relu()
    program = torch.export.export(module, inputs)
    with pytest.raises(ValueError, match="retrace=True are invalid"):
        export(program, retrace=True, backend="xnnpack")
    with pytest.raises(ValueError, match="retrace are not supported"):
        export({"forward": program}, retrace=True, backend="xnnpack")
    export(program, retrace=False, backend="xnnpack")  # False is what it always does


def test_inputs_and_arg_inputs_together_are_refused():
    module, inputs = linear_relu()
    with pytest.raises(ValueError, match="inputs or arg_inputs, not both"):
        export(module, inputs=inputs, arg_inputs=inputs, backend="xnnpack")


def test_dynamic_shapes_reach_torch_export(here_fs):
    from torch.export import Dim

    module, inputs = linear_relu()
    builder = Recording(engine_sizes=(1 * MiB,))
    store = trtet_store.BlobStore(here_fs / "s")
    with installed(builder):
        export(module, inputs=inputs, dynamic_shapes=({0: Dim("b", max=8)},), store=store)
    (program, _), = builder.calls
    (bounds,) = program.range_constraints.values()
    assert bounds.upper == 8
    store.close()


def _compile_specs(edge) -> list[dict]:
    return [{s.key: bytes(s.value) for s in m.compile_specs}
            for _, m in edge.exported_program().graph_module.named_children()
            if hasattr(m, "compile_specs")]


def test_weight_streaming_budget_goes_to_every_engine_and_bad_ones_are_refused(here_fs):
    module, inputs = linear_relu()
    store = trtet_store.BlobStore(here_fs / "s")
    builder = Recording(engine_sizes=(1 * MiB, 1 * MiB))
    with installed(builder):
        edge = export(module, inputs=inputs, store=store,
                      weight_streaming_budget_per_engine=1 << 20)
        specs = _compile_specs(edge)
        assert [s[trt.STREAMING_SPEC] for s in specs] == [b"1048576"] * 2
        for bad in (-1, 2**63):
            with pytest.raises(ValueError, match="weight_streaming_budget_per_engine"):
                export(module, inputs=inputs, store=store,
                       weight_streaming_budget_per_engine=bad)
    with pytest.raises(ValueError, match="applies to backend='tensorrt'"):
        export(module, inputs=inputs, backend="xnnpack", weight_streaming_budget_per_engine=1)
    assert len(builder.calls) == 1  # the refusals built nothing
    store.close()


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))
