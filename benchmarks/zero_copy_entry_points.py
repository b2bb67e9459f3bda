#!/usr/bin/env python3
"""Zero-copy save time against payload size, through every entry point, adopted payloads included.

For clone on XFS and insert on ext4 (a dedicated sparse loop filesystem each,
as root), one payload of each ``--sizes`` is written through each entry point,
``--repeat`` times, the sizes alternating in each repeat (ascending, then
descending) so that drift in this disk's speed falls on every size alike:

``write_file``
    ``trtet_store.write_file(out, [header, store.adopt(path)], consume=True)``:
    a file the user made, adopted by the store.
``save``
    ``trtet_store.save(program, out.pte, consume=True)`` of a program whose
    payload is ExecuTorch's own (``FileBackedData.move_from``), inline in the
    ``.pte``: the save adopts the file.
``save_program``
    ``trtet_store.save_program(program, out.pte, consume=True)`` of a program
    whose payload is a blob adopted into the store, in a ``.ptd``.
``compile_and_save``
    ``trtet_store.compile_and_save(model, inputs, out.pte)`` with the TensorRT
    builder stubbed at its seam; the engine is streamed through the store's
    writer as a real build would stream it. The time is that of its
    ``save_program`` call (lowering and staging do not depend on where the
    bytes go); the whole call's time is printed beside it.

Which bytes are real: the payloads of the first three entry points are
``fallocate``d (unwritten extents that read as zeros); a clone or an insert
reads and writes none of them, so what such a save writes (header, journal,
metadata) is real, and what it does not write is the point. The engine of
``compile_and_save`` is really written (pseudo-random bytes) while staging.

Durable time is the call plus a ``syncfs`` of the dedicated filesystem.
Growth is the median at the largest size over the median at the smallest
(target: under 1.5x). Writes ``--out``/zero_copy_entry_points.json.

    sudo .venv/bin/python benchmarks/zero_copy_entry_points.py      # 256M,4G,16G x 3 (~15 min)
    sudo .venv/bin/python benchmarks/zero_copy_entry_points.py --sizes 64M,256M --repeat 1
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
from trtet_store.bench.measure import device_bytes_written, syncfs
from trtet_store.io import BlobStore, fs
from trtet_store.io.units import PAGE, MiB
from trtet_store.testing import loopfs

ENTRY_POINTS = ("write_file", "save", "save_program", "compile_and_save")
#: The zero-copy placement each filesystem offers a page-aligned payload.
PLACEMENT = {"xfs": "clone", "ext4": "insert"}



def fallocated(path: Path, size: int) -> Path:
    """A file of ``size`` bytes in unwritten extents (reads as zeros, nothing written)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


class Run:
    """One entry point's write of one payload into a fresh directory of the filesystem."""

    def __init__(self, mnt: Path, entry: str, size: int, placement: str) -> None:
        self.work = mnt / f"run-{entry}-{size}"
        self.work.mkdir()
        self.entry, self.size, self.placement = entry, size, placement
        self.store: BlobStore | None = None
        self.extra: dict[str, float] = {}

    def prepare(self) -> Callable[[], list]:
        """Build what the timed call needs; return the call (it returns WriteReports)."""
        import trtet_store

        out = self.work / "out"
        out.mkdir()
        payload = fallocated(self.work / "payload.bin", self.size)
        allowed = {self.placement} if self.placement == "clone" else {"insert", "move"}
        if self.entry == "write_file":
            self.store = BlobStore(self.work / "staging")
            blob = self.store.adopt(payload)
            return lambda: [trtet_store.write_file(out / "model.ptd", [b"H" * PAGE, blob],
                                                   consume=True, placements=allowed)]
        if self.entry == "save":
            from executorch.exir._serialize._cord import FileBackedData

            owned = FileBackedData.move_from(os.fspath(payload))
            program = bench.build_program([owned], layout="pte", segment_alignment=PAGE)
            return lambda: [trtet_store.save(program, out / "model.pte", consume=True,
                                             placements=allowed)]
        if self.entry == "save_program":
            self.store = BlobStore(self.work / "staging")
            program = bench.build_program([self.store.adopt(payload)], layout="ptd",
                                          segment_alignment=PAGE)
            return lambda: trtet_store.save_program(program, out / "model.pte", consume=True,
                                                    placements=allowed)
        if self.entry == "compile_and_save":
            os.unlink(payload)  # the stub builder streams its own engine
            return self._compile_and_save(out / "model.pte")
        raise ValueError(f"unknown entry point {self.entry!r}")

    def _compile_and_save(self, pte: Path) -> Callable[[], list]:
        import trtet_store
        from trtet_store.export import executorch as et_adapter
        from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

        def timed_save(*args, **kwargs):
            # A real build takes minutes, and the writer's write-behind has the
            # engine on disk by the time it ends; the stub stages in
            # milliseconds, so wait for that writeback here (reported apart)
            # rather than count it as the save's.
            t0 = time.perf_counter()
            syncfs(self.work)
            self.extra["staging_writeback_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                return real_save(*args, **kwargs)
            finally:
                self.extra["save_program_s"] = time.perf_counter() - t0

        def call() -> list:
            module, inputs = linear_relu()
            store = BlobStore(self.work / "staging")
            with installed(FakeBuilder(engine_sizes=(self.size,))) as builder:
                et_adapter.save_program = timed_save
                try:
                    t0 = time.perf_counter()
                    report = trtet_store.compile_and_save(module, inputs, pte, store=store)
                finally:
                    et_adapter.save_program = real_save
            self.extra["whole_call_s"] = time.perf_counter() - t0
            self.extra["staging_s"] = builder.seconds
            store.close()
            return report.writes

        real_save = et_adapter.save_program
        return call

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.work, ignore_errors=True)


def measure(mnt: Path, entry: str, size: int, placement: str) -> dict:
    """Time one write (call + syncfs), with the device's written bytes; clean up after."""
    run = Run(mnt, entry, size, placement)
    try:
        call = run.prepare()
        syncfs(mnt)
        dev0 = device_bytes_written(mnt)
        t0 = time.perf_counter()
        reports = call()
        t1 = time.perf_counter()
        syncfs(mnt)
        t2 = time.perf_counter()
        dev = device_bytes_written(mnt)
        placements = sorted({p.placement for r in reports for p in r.placements})
        row = {"entry": entry, "size": size, "placements": placements,
               "durable_s": t2 - t0,
               "device_bytes": None if dev is None or dev0 is None else dev - dev0}
        if entry == "compile_and_save":
            # Lowering and staging left out: the save plus the syncfs after it.
            row["durable_s"] = run.extra["save_program_s"] + (t2 - t1)
            row["device_bytes"] = None  # staging's writes are in the window too
            row.update(run.extra)
        return row
    finally:
        run.close()


def run_filesystem(factory: loopfs.FilesystemFactory, fstype: str, sizes: list[int],
                   entries: list[str], repeat: int) -> list[dict]:
    placement = PLACEMENT[fstype]
    mnt = factory.make(fstype, (max(sizes) + 4 * (1 << 30)) // MiB)
    rows = []
    try:
        for r in range(repeat):
            for size in (sizes if r % 2 == 0 else sizes[::-1]):
                for entry in entries:
                    fs.capabilities.clear()
                    row = measure(mnt, entry, size, placement)
                    row.update(filesystem=fstype, expected=placement, repeat=r)
                    print(f"  {fstype} {entry} {bench.format_size(size)}: "
                          f"{row['durable_s'] * 1e3:.1f} ms {'+'.join(row['placements'])}",
                          flush=True)
                    rows.append(row)
    finally:
        factory.release(mnt)
    return rows


def summarize(rows: list[dict], sizes: list[int]) -> list[dict]:
    out = []
    keys = dict.fromkeys((r["filesystem"], r["entry"]) for r in rows)
    for fstype, entry in keys:
        mine = [r for r in rows if (r["filesystem"], r["entry"]) == (fstype, entry)]
        med = {s: statistics.median(r["durable_s"] for r in mine if r["size"] == s)
               for s in sizes}
        dev = {s: max((r["device_bytes"] for r in mine
                       if r["size"] == s and r["device_bytes"] is not None), default=None)
               for s in sizes}
        placed = sorted({p for r in mine for p in r["placements"]})
        out.append({"filesystem": fstype, "entry": entry, "placements": placed,
                    "expected": mine[0]["expected"], "median_s": med, "max_device_bytes": dev,
                    "growth": med[sizes[-1]] / med[sizes[0]], "runs": len(mine)})
    return out


def render(summary: list[dict], sizes: list[int]) -> str:
    head = " | ".join(bench.format_size(s) for s in sizes)
    lines = [f"| filesystem | entry point | placement | {head} | growth "
             f"{bench.format_size(sizes[0])} -> {bench.format_size(sizes[-1])} "
             "| most written by the device |",
             "|---|---|---|" + "---|" * len(sizes) + "---|---|"]
    for s in summary:
        times = " | ".join(f"{s['median_s'][z] * 1e3:.1f} ms" for z in sizes)
        written = [v for v in s["max_device_bytes"].values() if v is not None]
        lines.append(f"| {s['filesystem']} | {s['entry']} | {'+'.join(s['placements'])} "
                     f"| {times} | {s['growth']:.2f}x "
                     f"| {bench.format_size(max(written)) if written else '(staging too)'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["xfs", "ext4"])
    p.add_argument("--sizes", type=bench.comma_list, default=["256M", "4G", "16G"])
    p.add_argument("--entries", type=bench.comma_list, default=list(ENTRY_POINTS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if not bench.require_root():
        return 2
    unknown = set(args.filesystems) - set(PLACEMENT) | set(args.entries) - set(ENTRY_POINTS)
    if unknown:
        p.error(f"unknown filesystem or entry point: {', '.join(sorted(unknown))}")
    sizes = sorted(bench.parse_size(s) for s in args.sizes)
    rows = []
    with loopfs.FilesystemFactory() as factory:
        for fstype in args.filesystems:
            print(f"== {fstype}", flush=True)
            rows += run_filesystem(factory, fstype, sizes, args.entries, args.repeat)
    summary = summarize(rows, sizes)
    print()
    print(render(summary, sizes))
    wrong = [s for s in summary if s["placements"] != [s["expected"]]]
    for s in wrong:
        print(f"NOTE: {s['filesystem']} {s['entry']} placed by {s['placements']}, "
              f"not {s['expected']} alone", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zero_copy_entry_points.json").write_text(
        json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
