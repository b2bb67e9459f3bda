"""export() and compile_and_save at parity with torch_tensorrt.executorch.export.

Several methods in one ``.pte``, extra partitioners after TensorRT's, constant
methods, transform passes, compile and backend configs, and every refusal
before anything is built or written. XNNPACK programs run in the ExecuTorch
runtime; TensorRT programs (stubbed builder) are held to torch-tensorrt
2.14.0's own blob parser.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import xxhash
from test_inline_engines import delegates, engine_layout
from versions import needs_ptd_runtime

import trtet_store
from trtet_store.export import tensorrt as trt
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed


def mlp(seed: int, width: int = 16) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width)).eval()


def two_methods() -> tuple[dict, dict]:
    """``prefill`` and ``decode``: different modules and input shapes."""
    prefill, decode = mlp(1), mlp(2)
    x_prefill, x_decode = torch.randn(8, 16), torch.randn(1, 16)
    programs = {"prefill": torch.export.export(prefill, (x_prefill,)),
                "decode": torch.export.export(decode, (x_decode,))}
    eager = {"prefill": (prefill, x_prefill), "decode": (decode, x_decode)}
    return programs, eager


def run_method(pte: Path, name: str, inputs: list, ptd: Path | None = None) -> list:
    from executorch.runtime import Runtime

    extra = {"data_path": os.fspath(ptd)} if ptd else {}
    program = Runtime.get().load_program(os.fspath(pte), **extra)
    return program.load_method(name).execute(inputs)


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))


def test_two_methods_run_in_the_runtime_with_eager_outputs(here_fs):
    programs, eager = two_methods()
    out = here_fs / "m.pte"
    trtet_store.compile_and_save(programs, None, out, backend="xnnpack")
    for name, (module, x) in eager.items():
        (got,) = run_method(out, name, [x])
        torch.testing.assert_close(got, module(x))


def test_two_stubbed_methods_parse_and_share_their_engine_once(here_fs, upstream_trt):
    programs, _ = two_methods()
    builder = FakeBuilder(engine_sizes=(3 * MiB,), seeds=(5,))
    out = here_fs / "m.pte"
    with installed(builder):
        report = trtet_store.compile_and_save(programs, None, out)
    assert len(builder.built) == 2  # one build per method, the same engine bytes
    found = delegates(out)
    assert len(found) == 2
    for _, blob in found:
        engine, _meta = upstream_trt.deserialize_engine(blob)
        assert xxhash.xxh3_128_hexdigest(engine) == builder.built[0][1]
    offsets = {e["file_offset"] for e in engine_layout(out)}
    assert len(offsets) == 1 and out.stat().st_size < 4 * MiB  # in the file once
    assert len(report.placements) == 1


@needs_ptd_runtime
def test_hybrid_tensorrt_then_xnnpack_with_weights_in_a_ptd(here_fs, upstream_trt):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.runtime import Runtime

    from trtet_store import inspector

    builder = FakeBuilder(engine_sizes=(2 * MiB,), cpu_tail=32)
    module, x = mlp(3), torch.randn(4, 16)
    out = here_fs / "hybrid.pte"
    with installed(builder):
        report = trtet_store.compile_and_save(module, (x,), out,
                                              partitioners=[XnnpackPartitioner()],
                                              external_weights="cpu_weights")
    assert report.data_paths == [here_fs / "cpu_weights.ptd"]
    ids = [d for d, _ in delegates(out)]
    assert ids == [trt.BACKEND_ID, "XnnpackBackend"]
    upstream_trt.deserialize_engine(delegates(out)[0][1])
    ptd = inspector.inspect_file(here_fs / "cpu_weights.ptd")
    assert ptd.problems == [] and len(ptd.named_data) == 2  # the tail's weight and bias
    program = Runtime.get().load_program(os.fspath(out),
                                         data_path=os.fspath(here_fs / "cpu_weights.ptd"))
    assert program.method_names == {"forward"}


def test_constant_methods_are_readable_from_the_runtime(here_fs):
    module, x = mlp(4), torch.randn(2, 16)
    out = here_fs / "m.pte"
    trtet_store.compile_and_save(module, (x,), out, backend="xnnpack",
                                 constant_methods={"vocab_size": 32000, "eos_id": 2})
    assert run_method(out, "vocab_size", []) == [32000]
    assert run_method(out, "eos_id", []) == [2]


def test_transform_passes_are_applied(here_fs):
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    class ReluToSigmoid(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == exir_ops.edge.aten.relu.default:
                op = exir_ops.edge.aten.sigmoid.default
            return super().call_operator(op, args, kwargs, meta)

    module, x = mlp(5), torch.randn(2, 16)
    out = here_fs / "m.pte"
    trtet_store.compile_and_save(module, (x,), out, backend="xnnpack",
                                 transform_passes=[ReluToSigmoid()])
    (got,) = run_method(out, "forward", [x])
    torch.testing.assert_close(got, module[2](torch.sigmoid(module[0](x))))


def test_backend_config_segment_alignment_shows_in_inspect(here_fs):
    from executorch.exir import ExecutorchBackendConfig

    from trtet_store import inspector

    builder = FakeBuilder(engine_sizes=(1 * MiB, 1 * MiB))
    module, x = mlp(6), torch.randn(2, 16)
    out = here_fs / "m.pte"
    with installed(builder):
        trtet_store.compile_and_save(module, (x,), out,
                                     backend_config=ExecutorchBackendConfig(
                                         segment_alignment=16384))
    ins = inspector.inspect_file(out)
    assert ins.header["segment_base_offset"] % 16384 == 0
    assert all(s["absolute_offset"] % 16384 == 0 for s in ins.segments)
    # Left at ExecuTorch's default, a TensorRT program is page aligned.
    with installed(FakeBuilder(engine_sizes=(1 * MiB,))):
        trtet_store.compile_and_save(module, (x,), here_fs / "d.pte",
                                     backend_config=ExecutorchBackendConfig())
    assert all(e["file_offset"] % 4096 == 0 for e in engine_layout(here_fs / "d.pte"))


def test_compile_config_is_honoured(here_fs, monkeypatch):
    import executorch.exir
    from executorch.exir import EdgeCompileConfig

    seen = []
    original = executorch.exir.to_edge_transform_and_lower

    def spy(*args, **kwargs):
        seen.append(kwargs["compile_config"])
        return original(*args, **kwargs)

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", spy)
    module, x = mlp(7), torch.randn(2, 16)
    config = EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True)
    store = trtet_store.BlobStore(here_fs / "staging")
    with installed(FakeBuilder(engine_sizes=(1 * MiB,))):
        trtet_store.export_program(module, arg_inputs=(x,), compile_config=config, store=store)
        trtet_store.export_program(module, arg_inputs=(x,), store=store)
    trtet_store.export_program(module, arg_inputs=(x,), backend="xnnpack", store=store)
    assert seen[0] is config
    # TensorRT's default skips the IR check (placeholders are not core ATen); XNNPACK's
    # is ExecuTorch's own.
    assert seen[1]._check_ir_validity is False and seen[2] is None
    store.close()


def test_export_returns_an_edge_program_that_save_program_writes_without_copying(
        here_fs, upstream_trt):
    from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig

    programs, _ = two_methods()
    store = trtet_store.BlobStore(here_fs / "staging")
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    with installed(builder):
        edge = trtet_store.export.export(programs, store=store)
    assert isinstance(edge, EdgeProgramManager) and trtet_store.export_program is \
        trtet_store.export.export
    assert sorted(edge.methods) == ["decode", "prefill"]
    program = edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096))
    (report,) = trtet_store.save_program(program, here_fs / "m.pte", consume=True)
    assert {p.placement for p in report.placements} <= {"insert", "move", "clone"}
    # Both methods built the same engine: the second copy was released as soon as
    # it was staged (issue 22, finding 6), and the one file was placed once.
    assert len({id(e.blob) for e, _ in builder.built}) == 1
    assert builder.built[0][0].blob.consumed
    for _, blob in delegates(here_fs / "m.pte"):
        engine, _ = upstream_trt.deserialize_engine(blob)
        assert xxhash.xxh3_128_hexdigest(engine) in {d for _, d in builder.built}
    store.close()


# -- refusals: early, clear, nothing written ---------------------------------------------


class NamedPartitioner:
    """A partitioner whose compile specs name a method, as upstream's CUDA partitioner's do."""

    def __init__(self, method: str) -> None:
        from executorch.exir.backend.compile_spec_schema import CompileSpec
        from executorch.exir.backend.partitioner import DelegationSpec

        self.delegation_spec = DelegationSpec("Nothing", [CompileSpec("method_name",
                                                                      method.encode())])

    def partition(self, program):  # pragma: no cover - refused before partitioning
        raise AssertionError("not reached")


def _refusals():
    programs, _ = two_methods()
    ep = programs["prefill"]
    shared = NamedPartitioner("prefill")
    return {
        "method name not an identifier": (
            {"not-a-name": ep}, {}, ValueError, "not a Python identifier"),
        "constant method naming a method": (
            programs, {"constant_methods": {"decode": 1}}, ValueError, "would replace"),
        "constant method not an identifier": (
            programs, {"constant_methods": {"1st": 1}}, ValueError, "identifiers"),
        "partitioner shared across methods naming one": (
            programs, {"partitioners": [shared]}, ValueError,
            r"partitioners\['decode'\] .* name method 'prefill'"),
        "per-method dict naming no method": (
            programs, {"partitioners": {"prefill": [], "encode": []}}, ValueError,
            r"do not exist: \['encode'\]"),
        "per-method compile_specs for no method": (
            programs, {"compile_specs": {"other": []}}, ValueError, "do not exist"),
        "per-method passes for no method": (
            programs, {"transform_passes": {"other": []}}, ValueError, "do not exist"),
        "inputs for an exported program": (
            ep, {"arg_inputs": (torch.randn(8, 16),)}, ValueError, "already exported"),
        "one program under two names": (
            {"a": ep, "b": ep}, {}, ValueError, "same ExportedProgram"),
        "a module without inputs": (mlp(0), {}, ValueError, "example inputs"),
        "partitioners not a sequence": (programs, {"partitioners": "xnnpack"}, TypeError,
                                        "sequence"),
    }


@pytest.mark.parametrize("case", list(_refusals()))
def test_refusals_come_before_anything_is_built_or_written(here_fs, case):
    source, kwargs, error, message = _refusals()[case]
    builder = FakeBuilder(engine_sizes=(1 * MiB,))
    with installed(builder), pytest.raises(error, match=message):
        trtet_store.compile_and_save(source, None, here_fs / "m.pte", **kwargs)
    assert builder.built == [] and list(here_fs.iterdir()) == []
