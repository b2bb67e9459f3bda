#!/usr/bin/env python3
"""Publish benchmark: save_program + boto3 upload_file against trtet_store.publish.

On one SeaweedFS server (``weed mini`` from this environment, started on free
loopback ports by :mod:`trtet_store.testing.s3server`, or ``--endpoint-url``),
in the same run, alternating ``--repeat`` times (default 5), for a program
with two stubbed TensorRT engines of ``--engine-size`` (default 1 GiB) and
XNNPACK weights in a ``.ptd``:

- (a) ``save_program`` to a local file, then boto3's ``upload_file`` of each
  file (s3transfer's defaults);
- (b) ``trtet_store.publish`` (its defaults).

For each: wall time, peak extra local disk (statvfs polled on the loop
filesystem that holds the staged engines and (a)'s output), bytes sent and
bytes copied server-side. Then a re-publish with nothing changed, and with
one of the two engines changed. Prints a table and writes ``--out`` (JSON).

Needs root (a loop-mounted ext4 for the local side). Example::

    .venv/bin/python benchmarks/publish.py --engine-size 1G --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trtet_store
from trtet_store import bench
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.testing.loopfs import FilesystemFactory
from trtet_store.testing.s3server import running_server
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

MiB = 1 << 20


# --- the program -------------------------------------------------------------------------


def build_program(store: trtet_store.BlobStore, size: int, seeds: tuple[int, int]) -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig

    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(size, size), seeds=seeds, cpu_tail=16)):
        edge = trtet_store.export_program(module, arg_inputs=inputs, store=store,
                                          partitioners=[XnnpackPartitioner()],
                                          external_weights="cpu")
    return edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096))


# --- the methods ---------------------------------------------------------------------------


def save_and_upload(program: Any, client: Any, bucket: str, prefix: str, local: Path,
                    mnt: Path) -> dict[str, Any]:
    out = local / uuid.uuid4().hex
    out.mkdir()
    start = time.monotonic()
    with PeakDiskMonitor(mnt) as disk:
        trtet_store.save_program(program, out / "model.pte")
        disk.sample()
        sent = 0
        for f in sorted(out.iterdir()):
            client.upload_file(os.fspath(f), bucket, prefix + f.name)
            sent += f.stat().st_size
            disk.sample()
        seconds = time.monotonic() - start
        shutil.rmtree(out)
    return {"seconds": seconds, "peak_disk": disk.peak_extra_bytes, "sent": sent, "copied": 0}


def publish(program: Any, url: str, endpoint: str, mnt: Path, **kw: Any) -> dict[str, Any]:
    start = time.monotonic()
    with PeakDiskMonitor(mnt) as disk:
        report = trtet_store.publish(program, url, endpoint_url=endpoint,
                                     journal_dir=mnt / "journal",
                                     progress=lambda p: disk.sample(), **kw)
    return {"seconds": time.monotonic() - start, "peak_disk": disk.peak_extra_bytes,
            "sent": report.bytes_sent, "copied": report.bytes_copied,
            "unchanged": report.bytes_unchanged}


def _clean(client: Any, bucket: str, prefix: str) -> None:
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=o["Key"])


def _row(name: str, runs: list[dict[str, Any]], base: float | None) -> str:
    med = statistics.median(r["seconds"] for r in runs)
    ratio = f"{med / base:.2f}x" if base else "-"
    return (f"| {name} | {len(runs)} | {med:.1f} ({min(r['seconds'] for r in runs):.1f}-"
            f"{max(r['seconds'] for r in runs):.1f}) | {ratio} | "
            f"{bench.format_size(max(r['peak_disk'] for r in runs))} | "
            f"{bench.format_size(runs[0]['sent'])} | {bench.format_size(runs[0]['copied'])} | "
            f"{bench.format_size(runs[0].get('unchanged', 0))} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-size", type=bench.parse_size, default=1 << 30)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--endpoint-url", default=None,
                   help="an S3 server with AWS_* credentials (default: start weed mini)")
    p.add_argument("--out", type=Path, default=Path("bench-out/publish.json"))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the local side is a loop-mounted ext4")

    size = args.engine_size
    factory = FilesystemFactory()
    results: dict[str, list[dict[str, Any]]] = {"a": [], "b": [], "none": [], "one": []}
    try:
        # staged engines (2 + 1 changed) and (a)'s output (2 x size), with room to spare
        mnt = factory.make("ext4", int(5 * size / MiB) + 512)
        with contextlib.ExitStack() as stack:
            if args.endpoint_url is None:
                server = stack.enter_context(running_server("trtet-s3b-"))
                endpoint = server.endpoint.url
                os.environ.update(server.endpoint.environ())
                client = server.endpoint.client()
            else:
                import boto3

                endpoint = args.endpoint_url
                client = boto3.client("s3", endpoint_url=endpoint)
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=bucket)
            store = stack.enter_context(trtet_store.BlobStore(mnt / "staging"))
            print(f"staging 2 x {bench.format_size(size)} engines ...", flush=True)
            program = build_program(store, size, (1, 2))
            local = mnt / "out"
            local.mkdir()
            for i in range(args.repeat):
                for method in ("a", "b"):
                    prefix = f"{method}{i}/"
                    if method == "a":
                        r = save_and_upload(program, client, bucket, prefix, local, mnt)
                    else:
                        r = publish(program, f"s3://{bucket}/{prefix}model.pte", endpoint, mnt,
                                    index=False)
                    results[method].append(r)
                    print(f"run {i + 1} ({method}): {r['seconds']:.1f} s", flush=True)
                    if i < args.repeat - 1:
                        _clean(client, bucket, prefix)
            target = f"s3://{bucket}/b{args.repeat - 1}/model.pte"
            for _ in range(max(1, args.repeat // 2)):
                results["none"].append(publish(program, target, endpoint, mnt, replace=True,
                                               index=False))
            store.close()
            store = stack.enter_context(trtet_store.BlobStore(mnt / "staging-2"))
            changed = build_program(store, size, (1, 3))
            results["one"].append(publish(changed, target, endpoint, mnt, replace=True,
                                          index=False))
    finally:
        problems = factory.close()
        if problems:
            print("teardown: " + "; ".join(problems), file=sys.stderr)

    base = statistics.median(r["seconds"] for r in results["a"])
    total = 2 * size
    lines = [f"2 x {bench.format_size(size)} engines + cpu.ptd "
             f"({bench.format_size(total)}), SeaweedFS 4.48 on 127.0.0.1, alternating "
             f"{args.repeat}x",
             "",
             "| method | runs | wall s, median (min-max) | ratio | peak local disk | sent "
             "| copied server-side | kept unchanged |",
             "|---|---|---|---|---|---|---|---|",
             _row("(a) save_program + upload_file", results["a"], base),
             _row("(b) trtet_store.publish", results["b"], base),
             _row("re-publish, nothing changed", results["none"], base),
             _row("re-publish, one engine changed", results["one"], base)]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"engine_size": size, "runs": results, "table": lines},
                                   indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
