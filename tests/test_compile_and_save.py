"""compile_and_save on CPU: the TensorRT build stubbed at its one seam, everything after it real."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
import xxhash
from digests import file_digest
from versions import needs_file_backed_data, needs_ptd_runtime

import trtet_store
from trtet_store.export import tensorrt as trt
from trtet_store.export import trt_blob
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

# The staging store sits beside the output on the root ext4, and engines are
# page aligned: the larger engine hosts the file (insert), the other is moved.
ZERO_COPY_THEN_MOVE = ["insert", "move"]


@pytest.fixture
def fake_builder(monkeypatch):
    builder = FakeBuilder(engine_sizes=(6 * MiB, 3 * MiB))
    monkeypatch.setattr(trt, "build_engines", builder)
    # The CUDA check is the only other thing standing between CPU and the seam.
    monkeypatch.setattr(trt, "check_available", lambda: None)
    return builder


def read_named_data(ptd: Path, key: str) -> bytes:
    """The bytes stored under ``key`` in a ``.ptd``, read with ExecuTorch's own reader."""
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(ptd.read_bytes()))
    return bytes(payload.buffers[payload.named_data[key].buffer_index])


def delegate_blobs(pte: Path) -> list[bytes]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes())
    program = getattr(program, "program", program)
    blobs = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            assert d.id == trt.BACKEND_ID
            ref = d.processed
            if ref.location == 0:
                blobs.append(bytes(program.backend_delegate_data[ref.index].data))
            else:
                seg = program.segments[ref.index]
                raw = pte.read_bytes()
                base = int.from_bytes(raw[24:32], "little")
                blobs.append(raw[base + seg.offset: base + seg.offset + seg.size])
    return blobs


@needs_file_backed_data
def test_compile_and_save_moves_the_engines_into_the_ptd(here_fs, fake_builder):
    module, inputs = linear_relu()
    out = here_fs / "model.pte"
    report = trtet_store.compile_and_save(module, inputs, out,
                                          external_engine_data="engines")
    assert report.data_paths == [here_fs / "engines.ptd"]
    assert report.placements == ZERO_COPY_THEN_MOVE
    for engine, _ in fake_builder.built:
        assert engine.blob.consumed and not Path(engine.blob.path).exists()
    # The delegate blob: documented header and metadata, engine_key set, engine size 0.
    blobs = delegate_blobs(out)
    assert len(blobs) == 2
    keys = []
    for raw, (engine, digest) in zip(blobs, fake_builder.built, strict=True):
        header, meta, engine_bytes = trt_blob.decode(raw)
        assert header.magic == b"TR01" and header.metadata_offset == 32
        assert header.engine_size == 0 and engine_bytes == b""
        assert header.engine_offset % 16 == 0 and header.reserved == b"\x01" + b"\0" * 7
        assert meta.engine_key == f"{engine.blob.digest}_trt_engine"
        assert list(json.loads(raw[32:32 + header.metadata_size])) == [
            "io_bindings", "aliased_io", "hardware_compatible", "device_id",
            "serialized_metadata", "target_platform", "engine_key"]
        keys.append(meta.engine_key)
        data = read_named_data(here_fs / "engines.ptd", meta.engine_key)
        assert xxhash.xxh3_128_hexdigest(data) == digest
    assert sorted(p.name for p in here_fs.iterdir()) == ["engines.ptd", "model.pte"]


def _load_forward_error(pte: Path) -> str:
    """Load the program in the ExecuTorch runtime; return the error load_method raises."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(os.fspath(pte))
    assert program.method_names == {"forward"}
    with pytest.raises(RuntimeError) as info:
        program.load_method("forward")
    return str(info.value)


def test_engines_in_the_pte_by_default_and_the_runtime_loads_the_program(here_fs,
                                                                            fake_builder):
    module, inputs = linear_relu()
    out = here_fs / "model.bin"  # any name works, unlike ExecuTorch's own save
    report = trtet_store.compile_and_save(module, inputs, out)
    assert report.data_paths == [] and report.placements == ZERO_COPY_THEN_MOVE
    # The program loads. Its method does not, here: executorch 1.5 plans its cuda:0
    # I/O buffers first and stops for want of CUDA; 1.4 has no device planning and
    # stops for want of the TensorRT backend (0x20, NotFound).
    assert _load_forward_error(out) in (
        "Failed to allocate 256 bytes for buffer 1 on device 1:0",
        "Failed to load method forward, error: 0x:20")


@needs_file_backed_data
def test_a_cpu_targeted_program_fails_only_for_want_of_the_tensorrt_backend(here_fs,
                                                                           fake_builder):
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    module, inputs = linear_relu()
    out = here_fs / "model.pte"
    trtet_store.compile_and_save(module, inputs, out, external_engine_data="engines",
                                 compile_specs=[CompileSpec("target_device", b"cpu")])
    # 0x20 is Error::NotFound: "Backend TensorRTBackend is not registered".
    assert _load_forward_error(out) == "Failed to load method forward, error: 0x:20"


def test_a_plain_save_never_consumes(here_fs, fake_builder, tmp_path):
    """Only compile_and_save moves; the public save copies (consume=False by default)."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    store = trtet_store.BlobStore(here_fs / "staging")
    module, inputs = linear_relu()
    built = fake_builder(torch.export.export(module, inputs), inputs, None, store, {})
    edge = to_edge_transform_and_lower(
        built.exported_program, partitioner=[trt.TensorRTPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False))
    program = edge.to_executorch()
    before = [file_digest(e.blob.path) for e in built.engines]
    trtet_store.save(program, here_fs / "m.pte")
    assert [file_digest(e.blob.path) for e in built.engines] == before
    trt.unregister_engines(built.engines)
    store.close()


def test_engines_are_copied_across_filesystems_and_the_report_says_so(make_fs, fake_builder):
    staging = make_fs("tmpfs", 64)
    out_fs = make_fs("ext4", 128)
    store = trtet_store.BlobStore(staging)
    module, inputs = linear_relu()
    report = trtet_store.compile_and_save(module, inputs, out_fs / "m.pte", store=store)
    assert report.placements == ["copy", "copy"]
    reasons = [p.reason for w in report.writes for p in w.placements]
    assert all("different filesystems" in r for r in reasons)
    store.close()


@needs_file_backed_data
def test_etrecord_failure_keeps_the_program_and_is_raised(here_fs, fake_builder, monkeypatch):
    from executorch.devtools.etrecord._etrecord import ETRecord

    def broken_save(self, path):
        raise OSError("disk said no to the ETRecord")

    monkeypatch.setattr(ETRecord, "save", broken_save)
    module, inputs = linear_relu()
    with pytest.raises(OSError, match="ETRecord"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte",
                                     external_engine_data="eng", generate_etrecord=True)
    assert (here_fs / "m.pte").stat().st_size > 0 and (here_fs / "eng.ptd").exists()
    # The engines are in the program: nothing is kept for a next call (no orphaned record).
    assert sorted(p.name for p in here_fs.iterdir()) == ["eng.ptd", "m.pte"]


def test_etrecord_is_written_before_the_engines_move(here_fs, fake_builder):
    module, inputs = linear_relu()
    report = trtet_store.compile_and_save(module, inputs, here_fs / "m.pte",
                                          generate_etrecord=True)
    assert report.etrecord == here_fs / "m_etrecord.bin" and report.etrecord.stat().st_size
    assert report.placements == ZERO_COPY_THEN_MOVE


def test_tensorrt_without_torch_tensorrt_or_cuda_says_what_is_missing(here_fs):
    module, inputs = linear_relu()
    with pytest.raises(trt.TensorRTUnavailableError, match=r"trtet-store\[tensorrt\]|CUDA"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte")
    assert list(here_fs.iterdir()) == []


def test_bad_external_name_is_refused_before_anything_is_written(here_fs, fake_builder):
    module, inputs = linear_relu()
    with pytest.raises(ValueError):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte",
                                     external_engine_data="../escape")
    assert list(here_fs.iterdir()) == [] and fake_builder.built == []


@needs_ptd_runtime
def test_xnnpack_backend_runs_in_the_runtime_with_eager_outputs(here_fs):
    from executorch.runtime import Runtime

    module, inputs = linear_relu()
    report = trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", backend="xnnpack",
                                          external_engine_data="weights")
    assert report.data_paths == [here_fs / "weights.ptd"]
    program = Runtime.get().load_program(os.fspath(here_fs / "m.pte"),
                                         data_path=os.fspath(here_fs / "weights.ptd"))
    (out,) = program.load_method("forward").execute(list(inputs))
    torch.testing.assert_close(out, module(*inputs))


@pytest.mark.gpu
def test_real_tensorrt_compile_and_save(here_fs):
    if importlib.util.find_spec("torch_tensorrt") is None or not torch.cuda.is_available():
        pytest.skip("needs torch_tensorrt and a CUDA device (pip install 'trtet-store[tensorrt]' "
                    "on an NVIDIA GPU machine)")
    module, inputs = linear_relu()
    module, inputs = module.cuda(), tuple(x.cuda() for x in inputs)
    for external in (None, "engines"):
        out = here_fs / f"m_{external}.pte"
        report = trtet_store.compile_and_save(module, inputs, out, external_engine_data=external)
        assert report.engines and all(p in ("move", "copy") for p in report.placements)
        for raw in delegate_blobs(out):
            header, meta, engine = trt_blob.decode(raw)
            if external is None:  # inline: what the released runtime reads
                assert meta.engine_key is None and len(engine) == header.engine_size > 0
            else:
                assert meta.engine_key and header.engine_size == 0
        if importlib.util.find_spec("torch_tensorrt_executorch_runtime"):
            import torch_tensorrt

            loaded = torch_tensorrt.load(os.fspath(out), format="executorch")
            torch.testing.assert_close(loaded(*inputs), module(*inputs))
    # A module Torch-TensorRT already compiled: its engines are staged, not rebuilt.
    import torch_tensorrt

    compiled = torch_tensorrt.compile(module, ir="dynamo", inputs=list(inputs))
    report = trtet_store.compile_and_save(compiled, inputs, here_fs / "compiled.pte")
    assert report.engines and delegate_blobs(here_fs / "compiled.pte")
