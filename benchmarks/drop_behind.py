#!/usr/bin/env python3
"""What the blob writer's drop-behind costs at staging and saves at an insert placement.

``BlobStore(drop_behind=True)`` (the default) writes each blob back and drops
it from the page cache while it is being written. ext4's INSERT_RANGE drops
the host file's cached pages itself, so with a cached blob an insert's time
grows with the blob; the question is whether drop-behind only moves that cost
into staging. For each filesystem, payload size and setting, on a fresh
dedicated loop filesystem, this measures:

- staging: streaming the blob through ``BlobStore.writer`` in 16 MiB writes,
  plus ``fsync`` (the write syncs its sources anyway before its journal);
- insert: ``write_file`` of a 4 KiB header + the blob, consumed, limited to
  the insert placement, plus ``syncfs``;
- the bytes of the blob left in the page cache after staging (``fincore``, via
  :func:`trtet_store.bench.measure.cached_bytes`).

Ratios are drop-behind on / off in the same run. Writes ``--out``/drop_behind.json.

    .venv/bin/python benchmarks/drop_behind.py                     # ext4 and xfs; 256M, 1G, 4G
    .venv/bin/python benchmarks/drop_behind.py --filesystems ext4 --sizes 256M --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from trtet_store import bench
from trtet_store.bench import measure
from trtet_store.io.blobstore import BlobStore
from trtet_store.io.units import MiB
from trtet_store.io.writer import write_file
from trtet_store.testing.loopfs import FilesystemFactory

WRITE = 16 * MiB



def one_run(root: Path, size: int, drop_behind: bool, block: bytes) -> dict:
    """Stage one blob of ``size`` bytes and insert it into an output on ``root``."""
    with BlobStore(root / "staging", drop_behind=drop_behind) as store:
        t0 = time.perf_counter()
        with store.writer() as w:
            for i in range(0, size, WRITE):
                w.write(i.to_bytes(8, "little") + block[8: min(WRITE, size - i)])
        fd = os.open(w.blob.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        staging = time.perf_counter() - t0
        cached = measure.cached_bytes(w.blob.path)
        out = root / "out.ptd"
        t0 = time.perf_counter()
        report = write_file(out, [b"\0" * 4096, w.blob], consume=True,
                            placements={"insert", "move"})
        measure.syncfs(root)
        insert = time.perf_counter() - t0
        placement = report.placements[0].placement
    os.unlink(out)
    measure.quiesce(root)
    return {"staging_s": staging, "insert_s": insert, "cached_bytes": cached,
            "placement": placement}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list, default=["ext4", "xfs"])
    p.add_argument("--sizes", type=bench.comma_list, default=["256M", "1G", "4G"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out/drop_behind"))
    args = p.parse_args(argv)
    sizes = [bench.parse_size(s) for s in args.sizes]
    args.out.mkdir(parents=True, exist_ok=True)
    block = os.urandom(WRITE)

    rows = []
    with FilesystemFactory() as factory:
        for fstype in args.filesystems:
            for size in sizes:
                root = factory.make(fstype, size // MiB + 256)
                runs: dict[bool, list[dict]] = {False: [], True: []}
                for _ in range(args.repeat):
                    # Alternate off/on so drift on the host disk hits both alike.
                    for drop_behind in (False, True):
                        runs[drop_behind].append(one_run(root, size, drop_behind, block))
                for drop_behind, done in runs.items():
                    row = {"filesystem": fstype, "payload_bytes": size,
                           "drop_behind": drop_behind,
                           "placement": sorted({r["placement"] for r in done}), "runs": done}
                    for key in ("staging_s", "insert_s", "cached_bytes"):
                        row[key] = statistics.median(r[key] for r in done)
                    rows.append(row)
                    print(f"{fstype} {bench.format_size(size)} drop_behind={drop_behind}: "
                          f"{row['placement']}, staging {row['staging_s']:.2f} s, "
                          f"insert {row['insert_s']:.3f} s", file=sys.stderr, flush=True)
                factory.release(root)
    (args.out / "drop_behind.json").write_text(json.dumps({"rows": rows}, indent=1))
    table = render(rows)
    (args.out / "drop_behind.md").write_text(table + "\n")
    print(table)
    return 0


def render(rows: list[dict]) -> str:
    """A markdown table: per filesystem and size, off vs on, medians and on/off ratios."""
    lines = ["| filesystem | payload | cached after staging (off / on) "
             "| staging s (off / on, ratio) | insert s (off / on, ratio) "
             "| staging + insert s (off / on, ratio) |",
             "|---|---|---|---|---|---|"]
    keys = sorted({(r["filesystem"], r["payload_bytes"]) for r in rows})
    for fstype, size in keys:
        off, on = (next(r for r in rows if (r["filesystem"], r["payload_bytes"],
                                              r["drop_behind"]) == (fstype, size, flag))
                   for flag in (False, True))

        def cell(a: float, b: float, fmt: str = ".2f") -> str:
            return f"{a:{fmt}} / {b:{fmt}} ({b / a:.2f}x)" if a else f"{a:{fmt}} / {b:{fmt}}"

        lines.append(
            f"| {fstype} | {bench.format_size(size)} "
            f"| {bench.format_size(off['cached_bytes'])} / {bench.format_size(on['cached_bytes'])} "
            f"| {cell(off['staging_s'], on['staging_s'])} "
            f"| {cell(off['insert_s'], on['insert_s'], '.3f')} "
            f"| {cell(off['staging_s'] + off['insert_s'], on['staging_s'] + on['insert_s'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
