#!/usr/bin/env python3
"""safetensors and ONNX external data: their own writers against trtet_store.formats.

Alternating ``--repeat`` times in one process, on a dedicated loop filesystem
per type (as root), each method timed until its output is durable (the method,
then an ``fsync`` of every output file and its directory; ours syncs anyway):

- ``memory``: 2 GiB of torch tensors (8 x 256 MiB float32) in memory,
  ``safetensors.torch.save_file`` against ``formats.safetensors.save_file``
  (byte-identical output);
- ``blobs``: the same 2 GiB staged as blobs on the output's filesystem, saved
  with ``alignment=4096``: cloned on XFS (sources kept), inserted and moved on
  ext4 (``consume=True``; one payload hosts a file, so ``ours-sharded`` also
  writes one shard per blob, each inserted). ``save_file``, which cannot take
  files, saves the same tensors from memory: its best case;
- ``onnx``: a ModelProto with 1 GiB of initializers (8 x 128 MiB),
  ``onnx.save_model(save_as_external_data=True)`` (given a fresh copy each
  time: it clears the caller's raw_data) against ``formats.onnx.save_model``
  (``alignment=4096``), without and with ``store=`` (each tensor staged as it
  is copied out of the protobuf, then cloned on XFS, inserted/moved on ext4).

Each row: durable seconds (median and fastest), the ratio of medians to the
reference, peak extra disk beyond the finished output (statvfs, polled), and
peak RSS growth over the process's RSS before the call (VmHWM).

    sudo .venv/bin/python benchmarks/formats.py                 # xfs+ext4, 5 repeats
    sudo .venv/bin/python benchmarks/formats.py --scenarios memory --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trtet_store import bench
from trtet_store.bench.measure import (
    PeakDiskMonitor,
    current_rss_bytes,
    drop_caches,
    peak_rss_bytes,
    quiesce,
    reset_peak_rss,
)
from trtet_store.io import BlobStore, fs
from trtet_store.io.units import MiB
from trtet_store.testing import loopfs

TENSORS, TENSOR_BYTES = 8, 256 * MiB
ONNX_TENSORS, ONNX_BYTES = 8, 128 * MiB


def make_tensors() -> dict:
    import torch

    return {f"layer.{i}.weight": torch.full((TENSOR_BYTES // 4,), float(i) + 0.5)
            for i in range(TENSORS)}


def stage(store: BlobStore, tensors: dict) -> dict:
    from trtet_store.formats import StagedTensor

    out = {}
    for name, t in tensors.items():
        with store.writer() as w:
            w.write(t.numpy().view("uint8"))
        out[name] = StagedTensor(w.blob, "F32", tuple(t.shape))
    return out


def durable(paths: list[Path]) -> None:
    """What "durable" adds to each method: fsync every output and its directory."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in {p.parent for p in paths}:
        fs.fsync_dir(d)


def measure(mnt: Path, action: Callable[[], list[Path]]) -> dict:
    """Run ``action`` (it returns its outputs) durably: seconds, peak extra disk, RSS growth.

    Each run starts from the same state: the filesystem flushed and settled
    (the previous output's removal freed its blocks), and the page cache
    dropped, so no run pays for the previous one's pages (timed by hand on
    the 2-core VM: either method's write into the page cache took 0.5-2.0 s
    without this).
    """
    quiesce(mnt)
    drop_caches(mnt)
    base = current_rss_bytes()
    reset_peak_rss()
    with PeakDiskMonitor(mnt) as mon:
        t0 = time.perf_counter()
        outputs = action()
        durable(outputs)
        seconds = time.perf_counter() - t0
        mon.sample()
    kept = sum(p.stat().st_size for p in outputs)
    return {"seconds": seconds, "rss_growth": max(0, peak_rss_bytes() - base),
            "peak_extra_disk": mon.peak_extra_bytes, "output_bytes": kept,
            "over_output": max(0, mon.peak_extra_bytes - kept)}


def run_safetensors(mnt: Path, fstype: str, scenario: str, repeat: int) -> list[dict]:
    from safetensors.torch import save_file as reference

    from trtet_store.formats import safetensors as sf

    tensors = make_tensors()
    store = BlobStore(mnt / "staging")
    staged = stage(store, tensors) if scenario == "blobs" else None
    consume = scenario == "blobs" and fstype != "xfs"
    methods: dict[str, Callable[[Path], list[Path]]] = {}

    def ref(out: Path) -> list[Path]:
        reference(tensors, out / "model.safetensors")
        return [out / "model.safetensors"]

    def ours(out: Path) -> list[Path]:
        if scenario == "memory":
            sf.save_file(tensors, out / "model.safetensors")
        else:
            sf.save_file(staged, out / "model.safetensors", alignment=4096, consume=consume)
        return [out / "model.safetensors"]

    def ours_sharded(out: Path) -> list[Path]:
        reports = sf.save_sharded(staged, out, max_shard_size=TENSOR_BYTES, alignment=4096,
                                  consume=True)
        return [r.path for r in reports]

    methods = {"safetensors.save_file": ref, "ours": ours}
    if consume:
        methods["ours-sharded"] = ours_sharded
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for r in range(repeat):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for name in order:
            if consume and name != "safetensors.save_file":
                for t in staged.values():
                    t.blob.close()
                staged = stage(store, tensors)  # consumed by the last run; not timed
            out = mnt / f"out-{name}-{r}"
            out.mkdir()
            row = measure(mnt, lambda out=out, name=name: methods[name](out))
            runs[name].append(row)
            print(f"  {fstype} {scenario} {name}: {row['seconds']:.2f} s, over output "
                  f"{row['over_output'] / MiB:.1f} MiB, RSS +{row['rss_growth'] / MiB:.0f} MiB",
                  flush=True)
            shutil.rmtree(out)
    store.close()
    return summarize(fstype, scenario, runs, "safetensors.save_file")


def make_model():
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    inits, nodes = [], []
    prev = "x"
    n = int((ONNX_BYTES // 4) ** 0.5)
    for i in range(ONNX_TENSORS):
        w = np.full((n, n), 0.001 * (i + 1), dtype=np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [1, n])], inits)
    return helper.make_model(graph)


def run_onnx(mnt: Path, fstype: str, repeat: int) -> list[dict]:
    import onnx

    from trtet_store.formats import onnx as fo

    model = make_model()
    store = BlobStore(mnt / "staging")
    runs: dict[str, list[dict]] = {"onnx.save_model": [], "ours": [], "ours-store": []}
    for r in range(repeat):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            out = mnt / f"out-{name}-{r}"
            out.mkdir()
            if name == "onnx.save_model":
                fresh = onnx.ModelProto()
                fresh.CopyFrom(model)  # it clears raw_data in what it is given; not timed

                def action(out=out, fresh=fresh):
                    onnx.save_model(fresh, os.fspath(out / "m.onnx"), save_as_external_data=True,
                                    location="m.data")
                    return [out / "m.onnx", out / "m.data"]
            else:
                def action(out=out, name=name):
                    fo.save_model(model, out / "m.onnx", location="m.data", alignment=4096,
                                  store=store if name == "ours-store" else None)
                    return [out / "m.onnx", out / "m.data"]
            row = measure(mnt, action)
            runs[name].append(row)
            print(f"  {fstype} onnx {name}: {row['seconds']:.2f} s, over output "
                  f"{row['over_output'] / MiB:.1f} MiB, RSS +{row['rss_growth'] / MiB:.0f} MiB",
                  flush=True)
            shutil.rmtree(out)
            fresh = None
    store.close()
    return summarize(fstype, "onnx", runs, "onnx.save_model")


def summarize(fstype: str, scenario: str, runs: dict[str, list[dict]], ref: str) -> list[dict]:
    ref_med = statistics.median(r["seconds"] for r in runs[ref])
    rows = []
    for name, rs in runs.items():
        med = statistics.median(r["seconds"] for r in rs)
        rows.append({
            "filesystem": fstype, "scenario": scenario, "method": name, "runs": rs,
            "median_s": med, "fastest_s": min(r["seconds"] for r in rs),
            "ratio": med / ref_med,
            "over_output": statistics.median(r["over_output"] for r in rs),
            "rss_growth": statistics.median(r["rss_growth"] for r in rs),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["xfs", "ext4"])
    p.add_argument("--scenarios", type=bench.comma_list, default=["memory", "blobs", "onnx"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if not bench.require_root():
        return 2
    rows: list[dict] = []
    with loopfs.FilesystemFactory() as factory:
        for fstype in args.filesystems:
            mnt = factory.make(fstype, 7 * 1024)
            try:
                fs.capabilities.clear()
                for scenario in args.scenarios:
                    if scenario == "onnx":
                        rows += run_onnx(mnt, fstype, args.repeat)
                    else:
                        rows += run_safetensors(mnt, fstype, scenario, args.repeat)
            finally:
                factory.release(mnt)
    print(f"\n{args.repeat} alternating runs each; durable seconds: median (fastest); "
          "ratio of medians to the reference in the same run")
    print("| fs | scenario | method | durable s | ratio | over output | peak RSS growth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['filesystem']} | {r['scenario']} | {r['method']} | {r['median_s']:.2f} "
              f"({r['fastest_s']:.2f}) | {r['ratio']:.2f}x | {r['over_output'] / MiB:.1f} MiB "
              f"| {r['rss_growth'] / MiB:.0f} MiB |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "formats.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
