#!/usr/bin/env python3
"""compile_and_save with TensorRT engines inline: placements, peak disk, bytes written, time.

The TensorRT build is stubbed at its one seam (``trtet_store.testing.stub_tensorrt``:
engines of pseudo-random bytes streamed into the staging store, as the real
builder streams them); everything after it is real: lowering, the inline
delegate blobs, the program's serialization and the transactional write. Each
filesystem is a dedicated sparse loop image (as root). Per run it reports the
placements chosen, the peak extra disk beyond the staged engines (statvfs
polled), the bytes the save wrote (the process's write counter less the
staged engines' bytes) and the time of the whole call, of staging and of the
rest. Medians over ``--repeat`` runs.

    sudo .venv/bin/python benchmarks/compile_and_save.py                    # 2 x 1 GiB, ext4 + xfs
    sudo .venv/bin/python benchmarks/compile_and_save.py --engine-mib 256 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import trtet_store
from trtet_store.bench import measure
from trtet_store.io.units import MiB, format_mib
from trtet_store.testing.loopfs import FilesystemFactory
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed


def one_run(mnt, engine_bytes: int, engines: int) -> dict:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    out = mnt / "model.pte"
    builder = FakeBuilder(engine_sizes=(engine_bytes,) * engines)
    with installed(builder):
        written = measure.bytes_written()
        start = time.monotonic()
        with measure.PeakDiskMonitor(mnt) as mon:
            report = trtet_store.compile_and_save(module, inputs, out)
        seconds = time.monotonic() - start
        written = measure.bytes_written() - written
    staged = engine_bytes * engines
    out.unlink()
    return {
        "placements": report.placements,
        "peak_extra_beyond_engines": mon.peak_extra_bytes - staged,
        "save_bytes_written": written - staged,
        "seconds": seconds,
        "staging_seconds": builder.seconds,
        "rest_seconds": seconds - builder.seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", default="ext4,xfs")
    p.add_argument("--engine-mib", type=int, default=1024)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    size = args.engine_mib * MiB
    image_mib = args.engines * args.engine_mib + max(1024, args.engine_mib)
    print(f"{args.engines} x {args.engine_mib} MiB stubbed engines, medians of {args.repeat}")
    print("| filesystem | placements | peak extra beyond the engines | bytes the save wrote "
          "| compile_and_save s | staging s | after staging s |")
    print("|---|---|---|---|---|---|---|")
    with FilesystemFactory() as factory:
        for fstype in args.filesystems.split(","):
            mnt = factory.make(fstype, image_mib)
            runs = [one_run(mnt, size, args.engines) for _ in range(args.repeat)]
            factory.release(mnt)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "placements"}
            placements = sorted({"+".join(r["placements"]) for r in runs})
            print(f"| {fstype} | {', '.join(placements)} "
                  f"| {format_mib(med['peak_extra_beyond_engines'])} "
                  f"| {med['save_bytes_written'] / MiB:.2f} MiB | {med['seconds']:.2f} "
                  f"| {med['staging_seconds']:.2f} | {med['rest_seconds']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
