#!/usr/bin/env python3
"""The engine cache: cold compile_and_save (miss) against warm (hit), and Torch-TensorRT's own.

Per filesystem (a dedicated sparse loop image, as root), alternating the
methods, ``--repeat`` runs each:

- ``cold``: ``compile_and_save(..., engine_cache=cache)`` on an emptied cache:
  the (stubbed) build stages the engines, they enter the cache, the save
  consumes the staged engines;
- ``warm``: the same call on the filled cache: no build, each engine placed
  from the cache (a clone on XFS, a copy on ext4), then the save;
- ``upstream``: torch-tensorrt 2.14.0's ``DiskEngineCache`` from its wheel
  (``trtet_store.testing.upstream_engine_cache``: its code unchanged, imports
  stubbed) with the same engine bytes: ``insert`` (``pack`` + ``save``) in one
  process, ``check`` (``load`` + ``unpack``) in a fresh one, as a later
  compile would;
- ``adapter``: the same two steps through our ``for_torch_tensorrt`` adapter
  (upstream's ``insert``/``check`` over our ``save``/``load``).

Measured: wall time, bytes the process wrote (``/proc/<pid>/io``
write_bytes), peak extra disk (``statvfs`` polled), bytes on disk after, and
for upstream/adapter the peak RSS above the process's RSS before the step
(the engines themselves are in memory before an insert, as torch-tensorrt
holds them). The stubbed TensorRT build (``trtet_store.testing.stub_tensorrt``)
takes the time of writing pseudo-random bytes, not hours: ``cold`` is a lower
bound. Medians and fastest runs, and their ratios.

    sudo .venv/bin/python benchmarks/engine_cache.py                      # 2 x 1 GiB, 5 runs
    sudo .venv/bin/python benchmarks/engine_cache.py --engine-mib 64 --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trtet_store.bench import measure
from trtet_store.io.units import MiB, format_mib

HERE = Path(__file__).resolve()


def fake_engine(size: int, seed: int) -> bytes:
    """The bytes ``stub_tensorrt.stage_fake_engine(store, size, seed)`` stages (same generator)."""
    import xxhash

    out = bytearray(size)
    rnd = xxhash.xxh3_128(seed=seed)
    pos = 0
    while pos < size:
        rnd.update(b"more")
        n = min(size - pos, MiB)
        out[pos:pos + n] = (rnd.digest() * (n // 16 + 1))[:n]
        pos += n
    return bytes(out)


def disk_usage(path: Path) -> int:
    """Bytes allocated under ``path`` (st_blocks), as ``du`` counts them."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


# -- upstream's cache and our adapter, each step in a child process --------------------------

def _upstream_cache(kind: str, directory: str, bound: int):
    from trtet_store.testing import upstream_engine_cache as uec

    mod = uec.load()
    if kind == "upstream":
        return mod.DiskEngineCache(directory, bound), uec
    from trtet_store.cache import BlobCache

    with uec.as_torch_tensorrt(mod):
        from trtet_store.export.trt_engine_cache import for_torch_tensorrt

        return for_torch_tensorrt(BlobCache(directory, max_bytes=bound),
                                  tensorrt_version="10.14.1", compute_capability="sm_90"), uec


def child(kind: str, step: str, directory: str, size: int, engines: int) -> dict:
    """One step (``save`` or ``load``) of ``kind`` (``upstream`` or ``adapter``), measured here."""
    import xxhash

    bound = engines * (size + MiB) + 64 * MiB
    cache, uec = _upstream_cache(kind, directory, bound)
    hashes = [f"{i:064x}" * 3 for i in range(engines)]
    if step == "save":
        entries = [(fake_engine(size, i), [f"input_{i}"], [f"output_{i}"],
                    [uec.Input((2, 16))], uec.CompilationSettings(), False, False, {})
                   for i in range(engines)]
    measure.reset_peak_rss()
    base = measure.current_rss_bytes()
    written = measure.bytes_written()
    start = time.monotonic()
    if step == "save":
        for h, e in zip(hashes, entries, strict=True):
            cache.insert(h, e)
        got = []
    else:
        got = [cache.check(h) for h in hashes]
    seconds = time.monotonic() - start
    peak = measure.peak_rss_bytes() - base
    written = measure.bytes_written() - written
    if step == "load":  # each engine came back whole (checked after the timing)
        want = [xxhash.xxh3_128_hexdigest(fake_engine(size, i)) for i in range(engines)]
        assert [g is not None and xxhash.xxh3_128_hexdigest(g[0]) for g in got] == want, \
            f"{kind}: an engine did not come back"
    return {"seconds": seconds, "peak_rss_extra": peak, "bytes_written": written}


def run_child(kind: str, step: str, directory: Path, size: int, engines: int) -> dict:
    with measure.PeakDiskMonitor(directory.parent) as mon:
        done = subprocess.run([sys.executable, os.fspath(HERE), "--child", kind, step,
                               os.fspath(directory), str(size), str(engines)],
                              capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{kind} {step} failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["peak_extra_disk"] = mon.peak_extra_bytes
    return out


def upstream_run(kind: str, mnt: Path, size: int, engines: int) -> dict:
    """Save in one process, load in a fresh one; the cache directory removed afterwards."""
    import shutil

    directory = mnt / f"{kind}-cache"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700)
    save = run_child(kind, "save", directory, size, engines)
    on_disk = disk_usage(directory)
    load = run_child(kind, "load", directory, size, engines)
    shutil.rmtree(directory)
    return {"save_s": save["seconds"], "load_s": load["seconds"],
            "seconds": save["seconds"] + load["seconds"],
            "save_rss": save["peak_rss_extra"], "load_rss": load["peak_rss_extra"],
            "bytes_written": save["bytes_written"] + load["bytes_written"],
            "peak_extra_disk": max(save["peak_extra_disk"], load["peak_extra_disk"]),
            "on_disk": on_disk}


# -- compile_and_save through the cache, in this process ----------------------------------------

def compile_run(cache, mnt: Path, size: int, engines: int, *, cold: bool) -> dict:
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    if cold:
        cache.clear()
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    out = mnt / "model.pte"
    builder = FakeBuilder(engine_sizes=(size,) * engines)
    with installed(builder):
        written = measure.bytes_written()
        start = time.monotonic()
        with measure.PeakDiskMonitor(mnt) as mon:
            report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
        seconds = time.monotonic() - start
        written = measure.bytes_written() - written
    events = getattr(report, "engine_cache", None) or []
    outcomes = sorted({f"{e.outcome}:{e.placement}" for e in events})
    built = len(builder.built)
    assert built == (engines if cold else 0), f"{'cold' if cold else 'warm'} run built {built}"
    out.unlink()
    return {"seconds": seconds, "bytes_written": written,
            "peak_extra_disk": mon.peak_extra_bytes, "built": built,
            "outcomes": ",".join(outcomes), "on_disk": disk_usage(cache.directory)}


def settle(mnt: Path) -> None:
    """Let the last run's frees finish before the next baseline.

    XFS frees a removed file's blocks in the background (inode GC) for
    seconds after ``rmtree``, and its free space moves meanwhile: measured
    here, 128 MiB came back over 5 s, and a warm run started before then
    showed a 64 MiB "peak" it did not take. Wait for 2 s of stable free space.
    """
    measure.quiesce(mnt, polls=20, interval=0.1, timeout=60)


# -- the table -------------------------------------------------------------------------------

METHODS = ("cold", "warm", "upstream", "adapter")


def order(run: int) -> list[str]:
    """Alternate the order each run; a warm run always finds the build the last cold one cached."""
    return list(METHODS) if run % 2 == 0 else list(reversed(METHODS))


def summarize(fstype: str, runs: dict[str, list[dict]]) -> list[str]:
    lines = []

    def med(m: str, k: str) -> float:
        return statistics.median(r[k] for r in runs[m])

    def best(m: str, k: str) -> float:
        return min(r[k] for r in runs[m])

    for m in METHODS:
        if not runs[m]:
            continue
        rss = (f"{format_mib(med(m, 'save_rss'))} / {format_mib(med(m, 'load_rss'))}"
               if "save_rss" in runs[m][0] else "-")
        split = (f" (save {med(m, 'save_s'):.2f} + load {med(m, 'load_s'):.2f})"
                 if "save_s" in runs[m][0] else "")
        note = runs[m][0].get("outcomes", "")
        lines.append(f"| {fstype} | {m}{f' ({note})' if note else ''} | {med(m, 'seconds'):.2f}"
                     f"{split} | {best(m, 'seconds'):.2f} | {format_mib(med(m, 'bytes_written'))} "
                     f"| {format_mib(med(m, 'peak_extra_disk'))} | {rss} "
                     f"| {format_mib(med(m, 'on_disk'))} |")
    return lines


def ratios(fstype: str, runs: dict[str, list[dict]]) -> str:
    """Wall-time ratios of medians and of fastest runs: cold/warm, upstream/adapter."""
    out = []
    for a, b in (("cold", "warm"), ("upstream", "adapter")):
        if runs[a] and runs[b]:
            med = [statistics.median(r["seconds"] for r in runs[m]) for m in (a, b)]
            best = [min(r["seconds"] for r in runs[m]) for m in (a, b)]
            out.append(f"{a}/{b} {med[0] / med[1]:.2f}x (medians), "
                       f"{best[0] / best[1]:.2f}x (fastest)")
    return f"{fstype}: " + "; ".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, step, directory, size, engines = argv[1:6]
        print(json.dumps(child(kind, step, directory, int(size), int(engines))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", default="xfs,ext4")
    p.add_argument("--engine-mib", type=int, default=1024)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="runs of each method (>= 5 for the "
                   "README's table; fewer to try it)")
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    from trtet_store import EngineCache
    from trtet_store.testing.loopfs import FilesystemFactory

    methods = set(args.methods.split(","))
    size = args.engine_mib * MiB
    engine_bytes = args.engines * size
    # Staging + cache + program (cold, ext4: three copies at the peak) and upstream's
    # and the adapter's caches, each removed after its run, plus room to spare.
    image_mib = 4 * args.engines * args.engine_mib + 1024
    print(f"{args.engines} x {args.engine_mib} MiB stubbed engines, {args.repeat} runs each, "
          f"alternating; medians (fastest)")
    print("| filesystem | method | wall s (median) | fastest s | bytes written | peak extra "
          "disk | peak RSS extra save / load | on disk after |")
    print("|---|---|---|---|---|---|---|---|")
    notes: list[str] = []
    with FilesystemFactory() as factory:
        for fstype in args.filesystems.split(","):
            mnt = factory.make(fstype, image_mib)
            try:
                cache = EngineCache(mnt / "engine-cache", max_bytes=engine_bytes + 256 * MiB,
                                    min_free=0)
                runs: dict[str, list[dict]] = {m: [] for m in METHODS}
                for r in range(args.repeat):
                    for m in order(r):
                        if m not in methods or (m == "warm" and "cold" not in methods):
                            continue
                        settle(mnt)
                        if m in ("cold", "warm"):
                            res = compile_run(cache, mnt, size, args.engines, cold=m == "cold")
                        else:
                            res = upstream_run(m, mnt, size, args.engines)
                        runs[m].append(res)
                        print(f"  {fstype} run {r} {m}: {res['seconds']:.2f} s, wrote "
                              f"{format_mib(res['bytes_written'])}, peak extra disk "
                              f"{format_mib(res['peak_extra_disk'])}", file=sys.stderr,
                              flush=True)
            finally:
                factory.release(mnt)
            for line in summarize(fstype, runs):
                print(line, flush=True)
            notes.append(ratios(fstype, runs))
    print("\nWall-time ratios:")
    for line in notes:
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
