#!/usr/bin/env python3
"""Peak-disk benchmark over a matrix of filesystems and filesystem sizes.

Runs :func:`trtet_store.bench.run_bench` once per (filesystem, size) pair and
writes, under ``--out`` (default ``bench-out/matrix``):

- ``<fs>-<size>/bench.json`` and ``<fs>-<size>/bench.png`` per case, as
  ``trtet-store bench`` writes them;
- ``summary.md``: every case's table, one after the other.

Dedicated filesystems need root (loop mounts); without it every case runs in
a temp directory on the current filesystem and says so. Examples::

    .venv/bin/python benchmarks/peak_disk.py
    .venv/bin/python benchmarks/peak_disk.py --filesystems ext4 --fs-sizes tight \\
        --payload-size 512M --repeat 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trtet_store import bench


def main(argv: list[str] | None = None) -> int:
    """Run the matrix; return 0 when every case ran (a method may still have failed)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--filesystems",
        type=bench.comma_list,
        default=["ext4", "xfs", "btrfs", "tmpfs"],
        help="comma-separated, from: " + ",".join(bench.FILESYSTEMS),
    )
    p.add_argument(
        "--fs-sizes",
        type=bench.comma_list,
        default=["fit", "tight"],
        help="comma-separated: fit, tight, or sizes such as 1500M",
    )
    p.add_argument("--payload-size", type=bench.parse_size, default=256 << 20)
    p.add_argument("--payloads", type=int, default=2)
    p.add_argument("--chunk-size", type=bench.parse_size, default=None)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--methods", type=bench.comma_list, default=list(bench.METHODS))
    p.add_argument("--out", type=Path, default=Path("bench-out/matrix"))
    args = p.parse_args(argv)

    sections = []
    failed = 0
    for fstype in args.filesystems:
        for size_text in args.fs_sizes:
            size: str | int = (
                size_text if size_text in ("fit", "tight") else bench.parse_size(size_text)
            )
            name = f"{fstype}-{size_text}"
            config = bench.BenchConfig(
                payload_size=args.payload_size,
                payloads=args.payloads,
                chunk_size=args.chunk_size,
                filesystem=fstype,
                fs_size=size,
                repeat=args.repeat,
                methods=tuple(args.methods),
            )
            print(f"== {name}", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                result = bench.run_bench(config)
            except (bench.BenchError, ValueError) as exc:
                failed += 1
                sections.append(f"## {name}\n\nnot run: {exc}\n")
                print(f"   not run: {exc}", file=sys.stderr)
                continue
            table = bench.format_table(result)
            print(table, flush=True)
            bench.write_json(result, args.out / name / "bench.json")
            bench.plot(result, args.out / name / "bench.png")
            sections.append(
                f"## {name} ({time.monotonic() - t0:.0f} s)\n\n```\n{table}\n```\n\n"
                f"![{name}]({name}/bench.png)\n"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "summary.md"
    summary.write_text("# Peak-disk benchmark matrix\n\n" + "\n".join(sections))
    print(f"\nsummary: {summary}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
