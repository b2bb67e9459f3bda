#!/usr/bin/env python3
"""The disk's floor for a save that writes every byte, against ExecuTorch's durable save.

A move must write every payload byte (it only saves disk space), so no move
can be faster than the same bytes streamed once into a new file and synced
once. This benchmark measures that floor beside ExecuTorch's own durable save
(``save`` + ``write_tensor_data_to_file`` + ``syncfs``), alternating the two
``--repeat`` times in one process, on a dedicated loop filesystem per type,
with the payloads read into the page cache first (``cached``) or written back
and dropped from it (``uncached``). The floor streams each payload with
``pread``/``pwrite`` in 8 MiB windows, starts writeback as each is written
(``sync_file_range``), and ends with one ``fdatasync`` per file and a
``syncfs``: no ``copy_file_range``, which XFS would turn into a reflink.

The ratio of medians, floor over ExecuTorch, is the best any byte-writing
placement can show on this machine; ``benchmarks/durable_move.py`` gives the
move's ratio.

    sudo .venv/bin/python benchmarks/write_floor.py               # ext4+xfs, 2 x 1 GiB, 5 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from trtet_store import bench
from trtet_store.bench import loopfs
from trtet_store.bench.measure import syncfs
from trtet_store.bench.methods import set_cached
from trtet_store.bench.program import stage_payloads
from trtet_store.io import BlobStore, fs, pagecache
from trtet_store.io.units import MiB

WINDOW = 8 * MiB



def executorch_save(program, out: Path) -> float:
    """ExecuTorch's save and its ``.ptd`` files, then ``syncfs``: seconds."""
    out.mkdir()
    t0 = time.perf_counter()
    program.save(os.fspath(out / bench.PTE_NAME))
    program.write_tensor_data_to_file(os.fspath(out))
    syncfs(out)
    return time.perf_counter() - t0


def stream_floor(sources: list[Path], out: Path) -> float:
    """Each source streamed into a new file, written behind, synced once: seconds."""
    out.mkdir()
    t0 = time.perf_counter()
    for i, src in enumerate(sources):
        sfd = os.open(src, os.O_RDONLY)
        dfd = os.open(out / f"payload{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pos = 0
            while data := os.pread(sfd, WINDOW, pos):
                fs.pwrite_all(dfd, data, pos)  # a short write would flatter the floor
                pagecache.supported(fs.sync_file_range, dfd, pos, len(data),
                                    fs.SYNC_FILE_RANGE_WRITE)
                pos += len(data)
            os.fdatasync(dfd)
        finally:
            os.close(sfd)
            os.close(dfd)
    syncfs(out)
    return time.perf_counter() - t0


def run(factory: loopfs.FilesystemFactory, fstype: str, cached: bool, size: int,
        payloads: int, repeat: int) -> dict:
    mnt = factory.make(fstype, (3 * payloads * size) // MiB + 1024)
    try:
        store = BlobStore(mnt / "staging")
        cfg = bench.BenchConfig(payload_size=size, payloads=payloads, layout="split")
        blobs = stage_payloads(store, cfg, seed=1, progress=None)
        program = bench.build_program(blobs, layout="split")
        sources = [Path(b.path) for b in blobs]
        times: dict[str, list[float]] = {"executorch": [], "floor": []}
        for r in range(repeat):
            order = ("executorch", "floor") if r % 2 == 0 else ("floor", "executorch")
            for method in order:
                set_cached(sources, cached)
                syncfs(mnt)
                out = mnt / f"out-{method}-{r}"
                seconds = (executorch_save(program, out) if method == "executorch"
                           else stream_floor(sources, out))
                times[method].append(seconds)
                shutil.rmtree(out)
                print(f"  {fstype} {'cached' if cached else 'uncached'} {method}: "
                      f"{seconds:.2f} s", flush=True)
        store.close()
    finally:
        factory.release(mnt)
    med = {m: statistics.median(t) for m, t in times.items()}
    return {"filesystem": fstype, "sources": "cached" if cached else "uncached",
            "runs": times, "median_s": med, "floor_ratio": med["floor"] / med["executorch"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["ext4", "xfs"])
    p.add_argument("--cache", type=bench.comma_list, default=["uncached", "cached"])
    p.add_argument("--payload-size", default="1G")
    p.add_argument("--payloads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if not bench.require_root():
        return 2
    size = bench.parse_size(args.payload_size)
    rows = []
    with loopfs.FilesystemFactory() as factory:
        for fstype in args.filesystems:
            for state in args.cache:
                rows.append(run(factory, fstype, state == "cached", size, args.payloads,
                                args.repeat))
    print("\n| filesystem | sources | ExecuTorch durable s | floor s | floor x ExecuTorch |")
    print("|---|---|---|---|---|")
    for r in rows:
        m = r["median_s"]
        print(f"| {r['filesystem']} | {r['sources']} | {m['executorch']:.2f} | {m['floor']:.2f} "
              f"| {r['floor_ratio']:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "write_floor.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
