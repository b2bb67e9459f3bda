#!/usr/bin/env python3
"""Durable save time, syncs, bytes written and peak disk: ExecuTorch's save against each placement.

For each filesystem (ext4, XFS; a dedicated loop filesystem each, as root)
and each source state (payloads dropped from the page cache before every
method, or read into it), one :func:`trtet_store.bench.run_bench` run saves
a real program of ``--payloads`` x ``--payload-size`` with ExecuTorch's
``save`` + ``write_tensor_data_to_file`` and with trtet_store limited to
each placement, ``--repeat`` times, the methods interleaved in one process
(ExecuTorch's save and ours alternate; the order of the non-consuming ones
is reversed every other repeat). Durable time is the call plus a ``syncfs``
of the dedicated filesystem, for ExecuTorch too (which does not sync).
Medians and the ratio of medians to ExecuTorch's, in the same run.

``--big`` adds the 16 GiB rows: one payload of ``--big-size`` placed by
clone on XFS and by insert on ext4, and ``--big-move`` moved on ext4 and
XFS, on sparse loop images. These payloads are ``fallocate``d (unwritten
extents, read as zeros): a clone or an insert reads and writes none of them,
so only the header, the journal and the metadata are real writes; the move
really writes every byte of its payload (zeros), so its time is real.

The move and the copy are also given as ratios to the disk's floor
(``--floor``, on by default): before each filesystem and source state's
``run_bench``, ``benchmarks/write_floor.py`` streams the same payload sizes
behind a 128-byte header into one file on a fresh filesystem of the same
type, with and without write-behind, alternating, ``--repeat`` times; the
floor is the faster of the two medians (issue 26). It is measured in the
same invocation, not alternated run by run with the placements (that is
``write_floor.py``'s own table).

    .venv/bin/python benchmarks/durable_move.py --big     # 2 x 1 GiB x 5 on ext4+xfs, 16 GiB rows
    .venv/bin/python benchmarks/durable_move.py --big --no-small      # only the 16 GiB rows
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trtet_store import bench
from trtet_store.bench.measure import (
    PeakDiskMonitor,
    bytes_written,
    device_bytes_written,
    syncfs,
)
from trtet_store.io import BlobStore, fs, write_file
from trtet_store.io.units import GiB, MiB
from trtet_store.testing import loopfs


def measure_floor(fstype: str, cached: bool, args: argparse.Namespace) -> dict:
    """write_floor.py's two streams on a fresh ``fstype``: medians, fastest runs and the floor."""
    import write_floor  # beside this file

    with loopfs.FilesystemFactory() as factory:
        r = write_floor.run(factory, fstype, cached, bench.parse_size(args.payload_size),
                            args.payloads, args.repeat, header=128, methods=("floor", "plain"))
    fastest = min(min(r["runs"]["floor"]), min(r["runs"]["plain"]))
    print(f"   floor {r['floor_s']:.2f} s (written behind {r['median_s']['floor']:.2f}, "
          f"plain {r['median_s']['plain']:.2f}), fastest {fastest:.2f} s", flush=True)
    return {"floor_s": r["floor_s"], "floor_fastest_s": fastest, "floor_runs": r["runs"]}


def small_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for fstype in args.filesystems:
        for cached in args.cache:
            floor = (measure_floor(fstype, cached == "cached", args) if args.floor
                     else {"floor_s": None, "floor_fastest_s": None, "floor_runs": None})
            cfg = bench.BenchConfig(
                payload_size=bench.parse_size(args.payload_size), payloads=args.payloads,
                filesystem=fstype, repeat=args.repeat, methods=tuple(bench.METHODS),
                layout="split", segment_alignment=args.segment_alignment,
                cached_sources=cached == "cached", verify_outputs=False)
            print(f"== {fstype}, sources {cached}", flush=True)
            result = bench.run_bench(cfg)
            print(bench.format_table(result), flush=True)
            for s in result.summary():
                med, r = s["median"], s["ratio_to_executorch"]
                rows.append({
                    # What it ran on: "here:ext4" when no dedicated filesystem
                    # of the type asked for could be made.
                    "filesystem": result.filesystem.label, "sources": cached, "method": s["method"],
                    "placement": s["placement"], "ok": f"{s['ok_runs']}/{s['runs']}",
                    "durable_s": med["seconds_durable"], "durable_ratio": r["seconds_durable"],
                    "durable_all": [round(x.seconds_durable, 2)
                                    for x in result.runs_of(s["method"])],
                    "syncs": med["syncs"], "bytes_written": med["bytes_written"],
                    "device_bytes_written": med["device_bytes_written"],
                    "peak_extra_bytes": med["peak_extra_bytes"],
                    "peak_over_final_bytes": med["peak_over_final_bytes"],
                    **floor,
                })
    return rows


def big_row(factory: loopfs.FilesystemFactory, fstype: str, placement: str, size: int) -> dict:
    """One payload of ``size`` fallocated bytes placed by ``placement``; timed, measured."""
    mnt = factory.make(fstype, (size + 2 * GiB) // MiB)
    try:
        fs.capabilities.clear()
        raw = mnt / "engine.bin"
        fd = os.open(raw, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        store = BlobStore(mnt / "staging")
        blob = store.adopt(raw)
        header = b"H" * 4096
        consume = placement != "clone"
        syncfs(mnt)
        dev0, io0 = device_bytes_written(mnt), bytes_written()
        with PeakDiskMonitor(mnt) as mon:
            t0 = time.perf_counter()
            # An insert's host is chosen among the payloads the writer may move.
            allowed = {placement, "move"} if placement == "insert" else {placement}
            report = write_file(mnt / "model.ptd", [header, blob], consume=consume,
                                placements=allowed)
            out = os.open(mnt / "model.ptd", os.O_RDONLY)
            os.fsync(out)
            os.close(out)
            seconds = time.perf_counter() - t0
        row = {
            "filesystem": fstype, "method": placement, "payload_bytes": size,
            "placement": "+".join(sorted({p.placement for p in report.placements})),
            "durable_s": seconds, "bytes_written": bytes_written() - io0,
            "device_bytes_written": device_bytes_written(mnt) - dev0,
            "peak_extra_bytes": mon.peak_extra_bytes,
            "peak_over_final_bytes": mon.peak_extra_bytes - max(0, mon.extra_after_bytes),
            "real_bytes": "header, journal, metadata" if placement != "move"
            else "every payload byte written (zeros read from unwritten extents)",
        }
        store.close()
        return row
    finally:
        factory.release(mnt)


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_small(rows: list[dict]) -> None:
    # The fastest run of each beside the medians: ExecuTorch's save writes
    # everything before its sync and some runs stall behind this VM's disk,
    # so the ratio of the fastest runs shows what each does when nothing stalls.
    fastest_et = {(r["filesystem"], r["sources"]): min(r["durable_all"])
                  for r in rows if r["method"] == "executorch" and r["durable_all"]}
    print("\n| filesystem | sources | method | placement | durable s (median) | x ExecuTorch "
          "| x floor | fastest s | x ExecuTorch's fastest | x fastest floor | every run, s "
          "| syncs | bytes written (/proc) | device written | peak extra | peak over final |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["durable_s"] is None:
            continue
        fastest = min(r["durable_all"])
        base = fastest_et.get((r["filesystem"], r["sources"]))
        fl, fl_fast = r.get("floor_s"), r.get("floor_fastest_s")
        print(f"| {r['filesystem']} | {r['sources']} | {r['method']} | {r['placement']} "
              f"| {r['durable_s']:.2f} | {_fmt_ratio(r['durable_ratio'])} "
              f"| {_fmt_ratio(r['durable_s'] / fl if fl else None)} "
              f"| {fastest:.2f} | {_fmt_ratio(fastest / base if base else None)} "
              f"| {_fmt_ratio(fastest / fl_fast if fl_fast else None)} "
              f"| {' '.join(f'{t:.2f}' for t in r['durable_all'])} "
              f"| {r['syncs']:.0f} "
              f"| {bench.format_size(r['bytes_written'])} "
              f"| {bench.format_size(r['device_bytes_written'])} "
              f"| {bench.format_size(r['peak_extra_bytes'])} "
              f"| {bench.format_size(r['peak_over_final_bytes'])} |")


def print_big(rows: list[dict]) -> None:
    print("\n| filesystem | placement | payload | durable s | bytes written (/proc) "
          "| device written | peak extra | peak over final | real bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['filesystem']} | {r['placement']} | {bench.format_size(r['payload_bytes'])} "
              f"| {r['durable_s']:.3f} | {bench.format_size(r['bytes_written'])} "
              f"| {bench.format_size(r['device_bytes_written'])} "
              f"| {bench.format_size(r['peak_extra_bytes'])} "
              f"| {bench.format_size(r['peak_over_final_bytes'])} | {r['real_bytes']} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["ext4", "xfs"])
    p.add_argument("--cache", type=bench.comma_list, default=["uncached", "cached"])
    p.add_argument("--payload-size", default="1G")
    p.add_argument("--payloads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--segment-alignment", type=int, default=4096)
    p.add_argument("--big", action="store_true", help="add the 16 GiB rows")
    p.add_argument("--big-size", default="16G")
    p.add_argument("--big-move", default="8G")
    p.add_argument("--no-small", action="store_true", help="skip the 2 x 1 GiB runs")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the disk's floor per filesystem and source state (issue 26)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if not bench.require_root():
        return 2
    small = [] if args.no_small else small_rows(args)
    big = []
    if args.big:
        size, move = bench.parse_size(args.big_size), bench.parse_size(args.big_move)
        with loopfs.FilesystemFactory() as factory:
            for fstype, placement, n in (("xfs", "clone", size), ("ext4", "insert", size),
                                         ("ext4", "move", move), ("xfs", "move", move)):
                print(f"== {placement} of {bench.format_size(n)} on {fstype}", flush=True)
                big.append(big_row(factory, fstype, placement, n))
    if small:
        print_small(small)
    if big:
        print_big(big)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "durable_move.json").write_text(json.dumps({"small": small, "big": big},
                                                           indent=1))
    floored = [r for r in small if r["method"] in ("move", "copy") and r.get("floor_s")]
    if floored:
        print("\nratio to the floor (issue 26: move <= 1.15x, copy <= 1.05x): "
              + ", ".join(f"{r['filesystem']} {r['sources']} {r['method']} "
                          f"{r['durable_s'] / r['floor_s']:.2f}x" for r in floored))
    return 0


if __name__ == "__main__":
    sys.exit(main())
