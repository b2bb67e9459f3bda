#!/usr/bin/env python3
"""Free-space dip of an XFS clone: one FICLONERANGE call against bounded ranges.

A bare ``FICLONERANGE`` of a gigabyte on XFS was seen to make free space
dip by up to the whole length while it runs (XFS reserves blocks for the
remap transactions, one extent of at most one call at a time: see
``transfer.CLONE_RANGE``), although it leaves nothing allocated afterwards.
A 2 ms poll catches it rarely; tests/test_zero_copy.py polls without pause.
This
clones one source of ``--size`` real bytes into a fresh file at offset 4096
(as the writer does), alternating a single call with calls of ``--ranges``
bytes each, ``--repeat`` times, with ``statvfs`` polled every 2 ms, and
prints the peak extra disk and the time of each way (medians and maxima).

    .venv/bin/python benchmarks/xfs_clone_dip.py --size 2G --repeat 5

``--busy-poll SECONDS`` measures the dip without sampling luck instead: for
each way, a separate process reads ``statvfs`` without pause while this one
clones the source again and again for that long, and the worst dip is
printed with the number of clones:

    .venv/bin/python benchmarks/xfs_clone_dip.py --size 256M --ranges 16M,256M --busy-poll 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from trtet_store import bench
from trtet_store.bench.measure import FreeSpaceDipPoller, PeakDiskMonitor, syncfs
from trtet_store.io import fs
from trtet_store.io.units import MiB
from trtet_store.testing import loopfs


def clone(src: int, dst: int, size: int, step: int) -> None:
    """Clone ``size`` bytes of ``src`` to offset 4096 of ``dst`` in calls of ``step`` bytes."""
    for pos in range(0, size, step):
        fs.clone_range(src, pos, min(step, size - pos), dst, 4096 + pos)


def busy_poll(mnt, src: int, size: int, step: int, seconds: float) -> tuple[int, int]:
    """Clone ``src`` again and again for ``seconds`` beside a poller; (worst dip, clones)."""
    clones = 0
    with FreeSpaceDipPoller(mnt) as dip:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                clone(src, dst, size, step)
            finally:
                os.close(dst)
            os.unlink(mnt / "out.bin")
            clones += 1
    worst = dip.worst_bytes
    return worst, clones


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="2G")
    p.add_argument("--ranges", default="64M,256M")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--busy-poll", type=float, default=0.0, metavar="SECONDS")
    args = p.parse_args(argv)
    size = bench.parse_size(args.size)
    ways = {"one call": size} | {f"{r} calls": bench.parse_size(r)
                                 for r in args.ranges.split(",")}
    peaks: dict[str, list[int]] = {w: [] for w in ways}
    secs: dict[str, list[float]] = {w: [] for w in ways}
    with loopfs.FilesystemFactory() as factory:
        mnt = factory.make("xfs", (2 * size) // MiB + 512)
        src_path = mnt / "engine.bin"
        block = os.urandom(16 * MiB)
        with open(src_path, "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        src = os.open(src_path, os.O_RDONLY)
        if args.busy_poll:
            syncfs(mnt)
            print(f"XFS clone of {bench.format_size(size)} (real bytes), {args.busy_poll:g} s "
                  "of clones per way beside a poller that never sleeps\n")
            print("| way | clones | worst dip |")
            print("|---|---|---|")
            try:
                for way, step in ways.items():
                    worst, clones = busy_poll(mnt, src, size, step, args.busy_poll)
                    print(f"| {way} | {clones} | {bench.format_size(worst)} |", flush=True)
            finally:
                os.close(src)
            factory.release(mnt)
            return 0
        try:
            for rep in range(args.repeat):
                order = list(ways) if rep % 2 == 0 else list(reversed(ways))
                for way in order:
                    dst_path = mnt / "out.bin"
                    dst = os.open(dst_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        os.ftruncate(dst, 4096 + size)
                        with PeakDiskMonitor(mnt) as mon:
                            t0 = time.perf_counter()
                            clone(src, dst, size, ways[way])
                            os.fsync(dst)
                            secs[way].append(time.perf_counter() - t0)
                        peaks[way].append(mon.peak_extra_bytes)
                    finally:
                        os.close(dst)
                    os.unlink(dst_path)
                    syncfs(mnt)
        finally:
            os.close(src)
        factory.release(mnt)
    print(f"XFS clone of {bench.format_size(size)} (real bytes), {args.repeat} alternating "
          "repeats; peak extra disk and durable seconds, median (max)\n")
    print("| way | peak extra disk | seconds |")
    print("|---|---|---|")
    for way in ways:
        print(f"| {way} | {bench.format_size(statistics.median(peaks[way]))} "
              f"({bench.format_size(max(peaks[way]))}) | {statistics.median(secs[way]):.3f} "
              f"({max(secs[way]):.3f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
