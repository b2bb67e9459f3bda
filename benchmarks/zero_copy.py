#!/usr/bin/env python3
"""Save time per filesystem, placement and payload size, against ExecuTorch's own save.

For every filesystem (a dedicated loop filesystem each, as root) and payload
size, one :func:`trtet_store.bench.run_bench` run saves the same program with
ExecuTorch's ``save`` + ``write_tensor_data_to_file`` and with trtet_store
limited to each placement in turn. It prints, per filesystem and placement,
the durable save time (``syncfs`` included for every method, since
ExecuTorch's save does not sync) at each size, its ratio to ExecuTorch's in
the same run, and how a zero-copy placement's time grows from the smallest
size to the largest. Writes ``--out``/zero_copy.json and zero_copy.md.

    .venv/bin/python benchmarks/zero_copy.py                       # 256M,1G,4G on 4 filesystems
    .venv/bin/python benchmarks/zero_copy.py --sizes 64M,256M --filesystems xfs
    .venv/bin/python benchmarks/zero_copy.py --methods clone,insert --repeat 3   # medians
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtet_store import bench

ZERO_COPY = ("clone", "insert")



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filesystems", type=bench.comma_list,
                   default=["xfs", "btrfs", "ext4", "tmpfs"])
    p.add_argument("--sizes", type=bench.comma_list, default=["256M", "1G", "4G"])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--methods", type=bench.comma_list, default=list(bench.METHODS),
                   help="methods to run (executorch, the baseline, always runs)")
    p.add_argument("--out", type=Path, default=Path("bench-out/zero_copy"))
    args = p.parse_args(argv)
    sizes = [bench.parse_size(s) for s in args.sizes]
    args.out.mkdir(parents=True, exist_ok=True)

    rows = []  # one per (fs, size, method)
    for fstype in args.filesystems:
        for size in sizes:
            config = bench.BenchConfig(payload_size=size, payloads=1, filesystem=fstype,
                                       fs_size="fit", repeat=args.repeat, layout="ptd",
                                       segment_alignment=4096,
                                       methods=tuple(dict.fromkeys(["executorch",
                                                                    *args.methods])))
            print(f"{fstype} {bench.format_size(size)} ...", file=sys.stderr, flush=True)
            result = bench.run_bench(config)
            for s in result.summary():
                rows.append({
                    "filesystem": fstype, "dedicated": result.filesystem.dedicated,
                    "payload_bytes": size, "method": s["method"], "placement": s["placement"],
                    "ok_runs": s["ok_runs"], "errors": s["errors"], "outcomes": s["outcomes"],
                    "seconds_durable": s["median"].get("seconds_durable"),
                    "seconds": s["median"].get("seconds"),
                    "bytes_written": s["median"].get("bytes_written"),
                    "peak_extra_bytes": s["median"].get("peak_extra_bytes"),
                    "ratio_seconds_durable": s["ratio_to_executorch"].get("seconds_durable"),
                })
    (args.out / "zero_copy.json").write_text(json.dumps({"rows": rows}, indent=1))
    table = render(rows, sizes)
    (args.out / "zero_copy.md").write_text(table + "\n")
    print(table)
    return 0


def render(rows: list[dict], sizes: list[int]) -> str:
    """A markdown table: per filesystem and method, durable seconds (ratio) at each size."""
    heads = [bench.format_size(s) for s in sizes]
    lines = ["| filesystem | method | " + " | ".join(f"{h} s (x ES)" for h in heads)
             + f" | growth {heads[0]}->{heads[-1]} |",
             "|---|---|" + "---|" * (len(sizes) + 1)]
    keys = sorted({(r["filesystem"], r["method"]) for r in rows},
                  key=lambda k: (k[0], bench.METHODS.index(k[1])))
    for fstype, method in keys:
        cells, times = [], []
        for size in sizes:
            r = next((r for r in rows if (r["filesystem"], r["method"], r["payload_bytes"])
                      == (fstype, method, size)), None)
            if r is None or not r["ok_runs"]:
                why = ("unavailable" if r is None or "unavailable" in r["outcomes"]
                       else "failed")
                cells.append(why)
                times.append(None)
                continue
            t, ratio = r["seconds_durable"], r["ratio_seconds_durable"]
            cells.append(f"{t:.2f} ({ratio:.2f}x)" if ratio is not None else f"{t:.2f}")
            times.append(t)
        growth = (f"{times[-1] / times[0]:.2f}x" if times[0] and times[-1] else "-")
        lines.append(f"| {fstype} | {method} | " + " | ".join(cells) + f" | {growth} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
