"""publish, then fetch, through the real publisher and the runtimes users have.

A program with stubbed TensorRT engines (staged blobs) in its ``.pte`` and
XNNPACK weights in ``cpu.ptd`` is published with ``trtet_store.publish`` and
fetched with ``trtet_store.fetch``: the files equal ``save_program``'s output
byte for byte, ExecuTorch's runtime loads the program with its data file,
and torch-tensorrt 2.14.0's own blob parser (from its wheel) gives back every
engine exactly. An XNNPACK program with external weights is fetched and run
in the runtime, with the eager module's outputs. Then the CLI fetches an
update in which one engine changed, downloading that engine and the headers.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import xxhash
from programs import xnnpack_linear_program
from versions import needs_ptd_runtime

import trtet_store
from trtet_store import cli
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu


def hybrid_program(store: trtet_store.BlobStore, sizes: tuple[int, ...],
                   seeds: tuple[int, ...]):
    """Stubbed TensorRT engines staged in ``store``, XNNPACK weights in cpu.ptd; and the builder."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig

    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=sizes, seeds=seeds, cpu_tail=16)
    with installed(builder):
        edge = trtet_store.export_program(module, arg_inputs=inputs, store=store,
                                          partitioners=[XnnpackPartitioner()],
                                          external_weights="cpu")
    return edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096)), builder


def digests(directory: Path) -> dict[str, str]:
    return {p.name: xxhash.xxh3_128_hexdigest(p.read_bytes())
            for p in sorted(directory.iterdir()) if p.is_file()}


def trt_engines(pte: Path, upstream_trt) -> list[bytes]:
    """Every TensorRT delegate's engine, parsed by torch-tensorrt 2.14.0's deserialize_engine."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    raw = pte.read_bytes()
    program = deserialize_pte_binary(raw)
    program = getattr(program, "program", program)
    base = int.from_bytes(raw[24:32], "little")
    engines = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            if d.id != "TensorRTBackend":
                continue
            ref = d.processed
            if ref.location == 0:
                blob = bytes(program.backend_delegate_data[ref.index].data)
            else:
                seg = program.segments[ref.index]
                blob = raw[base + seg.offset: base + seg.offset + seg.size]
            engine, _meta = upstream_trt.deserialize_engine(blob)
            engines.append(bytes(engine))
    return engines


@needs_ptd_runtime
def test_publish_then_fetch_gives_save_programs_bytes_and_the_runtimes_load_them(
        s3env, here_fs, upstream_trt):
    url = f"s3://{s3env.bucket}/models/model.pte"
    with trtet_store.BlobStore(here_fs / "staging") as store:
        program, builder = hybrid_program(store, (3 * MiB, 2 * MiB), (1, 2))
        (here_fs / "saved").mkdir()
        trtet_store.save_program(program, here_fs / "saved" / "model.pte")
        trtet_store.publish(program, url, endpoint_url=s3env.endpoint.url,
                            journal_dir=s3env.journal_dir)
    out = here_fs / "out"
    out.mkdir()
    report = trtet_store.fetch(url, out / "model.pte", endpoint_url=s3env.endpoint.url)
    assert digests(out) == digests(here_fs / "saved")
    assert sorted(digests(out)) == ["cpu.ptd", "model.pte"]
    assert report.verified and report.bytes_downloaded == report.size
    assert [xxhash.xxh3_128_hexdigest(e) for e in trt_engines(out / "model.pte", upstream_trt)] \
        == [digest for _, digest in builder.built]
    from executorch.runtime import Runtime

    loaded = Runtime.get().load_program(os.fspath(out / "model.pte"),
                                        data_path=os.fspath(out / "cpu.ptd"))
    assert "forward" in loaded.method_names


@needs_ptd_runtime
def test_an_xnnpack_program_fetched_runs_with_the_eager_outputs(s3env, here_fs):
    built = xnnpack_linear_program(in_features=256, hidden=512, external_tag="model")
    url = f"s3://{s3env.bucket}/x/model.pte"
    trtet_store.publish(built.manager, url, endpoint_url=s3env.endpoint.url,
                        journal_dir=s3env.journal_dir)
    trtet_store.fetch(url, here_fs / "model.pte", endpoint_url=s3env.endpoint.url)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(os.fspath(here_fs / "model.pte"),
                                         data_path=os.fspath(here_fs / "model.ptd"))
    (got,) = program.load_method("forward").execute(list(built.inputs))
    torch.testing.assert_close(got, built.module(*built.inputs))


def test_the_cli_fetches_an_update_downloading_the_changed_engine_and_the_headers(
        s3env, here_fs, capsys):
    url = f"s3://{s3env.bucket}/u/model.pte"
    sizes = (4 * MiB, 4 * MiB)
    with trtet_store.BlobStore(here_fs / "staging") as store:
        v1, _ = hybrid_program(store, sizes, (5, 6))
        trtet_store.publish(v1, url, endpoint_url=s3env.endpoint.url,
                            journal_dir=s3env.journal_dir)
    assert cli.main(["fetch", url, os.fspath(here_fs / "model.pte"), "--endpoint-url",
                     s3env.endpoint.url, "--no-progress"]) == 0
    with trtet_store.BlobStore(here_fs / "staging") as store:
        v2, _ = hybrid_program(store, sizes, (5, 7))  # the second engine changed
        (here_fs / "saved").mkdir()
        trtet_store.save_program(v2, here_fs / "saved" / "model.pte")
        trtet_store.publish(v2, url, endpoint_url=s3env.endpoint.url, replace=True,
                            journal_dir=s3env.journal_dir)
    capsys.readouterr()
    assert cli.main(["fetch", url, os.fspath(here_fs / "model.pte"), "--endpoint-url",
                     s3env.endpoint.url, "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert digests(here_fs / "saved") == {n: d for n, d in digests(here_fs).items()
                                         if n in ("model.pte", "cpu.ptd")}
    # One engine of the two, plus the pieces that are not engines (flatbuffer, headers).
    engine_and_headers = sizes[1] + 256 * 1024
    assert sizes[1] <= report["bytes_downloaded"] <= engine_and_headers
    assert report["bytes_reused"] >= sizes[0]
    # Errors are one clear line, and change nothing.
    assert cli.main(["fetch", f"s3://{s3env.bucket}/none.pte", os.fspath(here_fs / "n.pte"),
                     "--endpoint-url", s3env.endpoint.url, "--no-progress"]) == 1
    assert "not found" in capsys.readouterr().err
    assert not (here_fs / "n.pte").exists()
