#!/usr/bin/env python3
"""The disk's floor for a save that writes every byte, beside ExecuTorch's save, move, copy.

A move must write every payload byte (it only saves disk space), so no move
can be faster than the same bytes streamed once into a new file and synced
once. This benchmark measures that floor beside ExecuTorch's own durable save
(``save`` + ``write_tensor_data_to_file`` + ``syncfs``) and beside
trtet_store's move and copy (``write_file(out, [header, *payloads],
consume=..., placements=(method,))`` + ``syncfs``), alternating all five
``--repeat`` times in one process (the order reversed every other repeat),
on a dedicated loop filesystem per type, with the payloads read into the
page cache first (``cached``) or written back and dropped from it
(``uncached``). Two streams are timed: ``floor`` streams the payloads behind
a ``--header`` of 128 bytes (ExecuTorch's alignment: no placement can share
extents) into one new file with ``pread``/``pwrite`` in 8 MiB windows,
starting writeback as each is written (``sync_file_range``), then one
``fdatasync`` and a ``syncfs``; ``plain`` is the same without write-behind.
No ``copy_file_range``, which XFS would turn into a reflink. The floor of a
run set is the faster of the two streams' medians (issue 26); the move and
the copy are reported as ratios to it and to ExecuTorch's save. The move
consumes its payloads, so it moves a fresh staging of the same bytes each
repeat.

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
from trtet_store.bench.measure import syncfs
from trtet_store.bench.methods import set_cached
from trtet_store.bench.program import stage_payloads
from trtet_store.io import BlobStore, fs, pagecache, write_file
from trtet_store.io.units import MiB
from trtet_store.testing import loopfs

WINDOW = 8 * MiB
METHODS = ("executorch", "floor", "plain", "move", "copy")


def executorch_save(program, out: Path) -> float:
    """ExecuTorch's save and its ``.ptd`` files, then ``syncfs``: seconds."""
    out.mkdir()
    t0 = time.perf_counter()
    program.save(os.fspath(out / bench.PTE_NAME))
    program.write_tensor_data_to_file(os.fspath(out))
    syncfs(out)
    return time.perf_counter() - t0


def stream_floor(sources: list[Path], out: Path, header: int = 128, behind: bool = True) -> float:
    """The sources streamed behind ``header`` bytes into one new file, synced once: seconds.

    ``behind``: writeback of each window is started as soon as it is written.
    """
    out.mkdir()
    t0 = time.perf_counter()
    dfd = os.open(out / "payloads.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fs.pwrite_all(dfd, b"H" * header, 0)
        off = header
        for src in sources:
            sfd = os.open(src, os.O_RDONLY)
            try:
                pos = 0
                while data := os.pread(sfd, WINDOW, pos):
                    fs.pwrite_all(dfd, data, off)  # a short write would flatter the floor
                    if behind:
                        pagecache.supported(fs.sync_file_range, dfd, off, len(data),
                                            fs.SYNC_FILE_RANGE_WRITE)
                    pos += len(data)
                    off += len(data)
            finally:
                os.close(sfd)
        os.fdatasync(dfd)
    finally:
        os.close(dfd)
    syncfs(out)
    return time.perf_counter() - t0


def place(blobs: list, out: Path, method: str, header: int = 128) -> float:
    """``write_file`` of the header and the payloads by ``method`` alone, ``syncfs``: seconds."""
    out.mkdir()
    t0 = time.perf_counter()
    write_file(out / "payloads.bin", [b"H" * header, *blobs], consume=method == "move",
               placements=(method,))
    syncfs(out)
    return time.perf_counter() - t0


def run(factory: loopfs.FilesystemFactory, fstype: str, cached: bool, size: int,
        payloads: int, repeat: int, header: int = 128,
        methods: tuple[str, ...] = METHODS) -> dict:
    """Every method ``repeat`` times, alternating, on a fresh filesystem: seconds and ratios."""
    mnt = factory.make(fstype, (4 * payloads * size) // MiB + 1024)
    try:
        store = BlobStore(mnt / "staging")
        cfg = bench.BenchConfig(payload_size=size, payloads=payloads, layout="split")
        blobs = stage_payloads(store, cfg, seed=1, progress=None)
        program = bench.build_program(blobs, layout="split") if "executorch" in methods else None
        times: dict[str, list[float]] = {m: [] for m in methods}
        for r in range(repeat):
            order = methods if r % 2 == 0 else tuple(reversed(methods))
            for method in order:
                # The move consumes its payloads: a fresh staging of the same bytes.
                moved = stage_payloads(store, cfg, seed=1, progress=None) \
                    if method == "move" else blobs
                paths = [Path(b.path) for b in moved]
                set_cached(paths, cached)
                syncfs(mnt)
                out = mnt / f"out-{method}-{r}"
                if method == "executorch":
                    seconds = executorch_save(program, out)
                elif method in ("floor", "plain"):
                    seconds = stream_floor(paths, out, header, behind=method == "floor")
                else:
                    seconds = place(moved, out, method, header)
                times[method].append(seconds)
                shutil.rmtree(out)
                if method == "move":
                    for b in moved:
                        b.close()
                print(f"  {fstype} {'cached' if cached else 'uncached'} {method}: "
                      f"{seconds:.2f} s", flush=True)
        store.close()
    finally:
        factory.release(mnt)
    return summarize(fstype, cached, times)


def summarize(fstype: str, cached: bool, times: dict[str, list[float]]) -> dict:
    """Medians, the floor (the faster stream), and each method's ratios to it and to ExecuTorch."""
    med = {m: statistics.median(t) for m, t in times.items()}
    fastest = {m: min(t) for m, t in times.items()}
    streams = [m for m in ("floor", "plain") if m in med]
    floor = min(med[m] for m in streams)
    floor_fastest = min(fastest[m] for m in streams)
    et, et_fastest = med.get("executorch"), fastest.get("executorch")
    return {"filesystem": fstype, "sources": "cached" if cached else "uncached",
            "runs": times, "median_s": med, "floor_s": floor,
            "x_floor": {m: med[m] / floor for m in med},
            "fastest_x_fastest_floor": {m: fastest[m] / floor_fastest for m in fastest},
            "x_executorch": {m: med[m] / et for m in med} if et else {},
            "fastest_x_fastest_executorch": ({m: fastest[m] / et_fastest for m in fastest}
                                             if et_fastest else {}),
            # The old report's figure: the written-behind stream over ExecuTorch's save.
            "floor_ratio": med["floor"] / et if et and "floor" in med else None}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_rows(rows: list[dict]) -> None:
    print("\n| filesystem | sources | ExecuTorch s | floor s (written behind) | plain s "
          "| move s | move x floor | move x ExecuTorch | copy s | copy x floor "
          "| copy x ExecuTorch | fastest move, copy x fastest floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        med, xf, xe = r["median_s"], r["x_floor"], r["x_executorch"]
        fx = r["fastest_x_fastest_floor"]
        print(f"| {r['filesystem']} | {r['sources']} | {_s(med.get('executorch'))} "
              f"| {_s(med.get('floor'))} | {_s(med.get('plain'))} "
              f"| {_s(med.get('move'))} | {_x(xf.get('move'))} | {_x(xe.get('move'))} "
              f"| {_s(med.get('copy'))} | {_x(xf.get('copy'))} | {_x(xe.get('copy'))} "
              f"| {_x(fx.get('move'))}, {_x(fx.get('copy'))} |")
    print("\nevery run, s:")
    for r in rows:
        print(f"  {r['filesystem']} {r['sources']}: " + "; ".join(
            f"{m} {' '.join(f'{t:.2f}' for t in ts)}" for m, ts in r["runs"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["ext4", "xfs"])
    p.add_argument("--cache", type=bench.comma_list, default=["uncached", "cached"])
    p.add_argument("--methods", type=bench.comma_list, default=list(METHODS))
    p.add_argument("--payload-size", default="1G")
    p.add_argument("--payloads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--header", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    methods = tuple(args.methods)
    if set(methods) - set(METHODS) or not {"floor", "plain"} & set(methods):
        p.error(f"methods: a subset of {','.join(METHODS)} with floor or plain")
    if not bench.require_root():
        return 2
    size = bench.parse_size(args.payload_size)
    rows = []
    with loopfs.FilesystemFactory() as factory:
        for fstype in args.filesystems:
            for state in args.cache:
                rows.append(run(factory, fstype, state == "cached", size, args.payloads,
                                args.repeat, args.header, methods))
    print_rows(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "write_floor.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
