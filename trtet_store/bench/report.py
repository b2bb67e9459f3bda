"""The benchmark's text table and JSON file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from trtet_store.bench.config import format_size
from trtet_store.bench.results import BenchResult


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def format_table(result: BenchResult) -> str:
    """The summary as a plain-text table (median, max in parentheses, ratio to ExecuTorch).

    Args:
        result: A benchmark result.

    Returns:
        The table with a heading line and notes underneath.
    """
    cfg = result.config
    head = (
        f"{cfg.payloads} x {format_size(cfg.payload_size)} payloads "
        f"({format_size(cfg.total_payload_bytes)}, layout {cfg.layout}) on "
        f"{result.filesystem.label}"
        + (
            f" ({format_size(result.filesystem.size_bytes)} image, "
            f"{format_size(result.filesystem.free_bytes)} free)"
            if result.filesystem.dedicated and result.filesystem.size_bytes
            else ""
        )
        + f", chunk {format_size(cfg.effective_chunk_size)}, {cfg.repeat} repeat(s); "
        "median (max), ratio to ExecuTorch's save"
    )
    cols = [
        "method",
        "placement",
        "ok",
        "peak extra disk",
        "ratio",
        "over final",
        "bytes written",
        "ratio",
        "seconds",
        "ratio",
        "durable s",
        "ratio",
        "syncs",
        "device written",
        "RSS growth",
    ]
    rows = []
    for s in result.summary():
        med, mx, r = s["median"], s["max"], s["ratio_to_executorch"]
        rows.append(
            [
                s["label"],
                s["placement"],
                f"{s['ok_runs']}/{s['runs']}",
                f"{format_size(med['peak_extra_bytes'])} ({format_size(mx['peak_extra_bytes'])})",
                _ratio(r["peak_extra_bytes"]),
                format_size(med["peak_over_final_bytes"]),
                format_size(med["bytes_written"]),
                _ratio(r["bytes_written"]),
                f"{_secs(med['seconds'])} ({_secs(mx['seconds'])})",
                _ratio(r["seconds"]),
                _secs(med["seconds_durable"]),
                _ratio(r["seconds_durable"]),
                "-" if med["syncs"] is None else f"{med['syncs']:.0f}",
                format_size(med["device_bytes_written"]),
                format_size(med["rss_growth_bytes"]),
            ]
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [head, "", line(cols), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    if result.notes:
        out.append("")
        out += [f"note: {n}" for n in result.notes]
    for other in result.also:
        out += ["", "", format_table(other)]
    return "\n".join(out)


def write_json(result: BenchResult, path: os.PathLike | str, *, timelines: bool = True) -> Path:
    """Write the result as JSON (``{"runs": [...], "summary": [...], ...}``).

    Args:
        result: A benchmark result.
        path: The file; its directory is created.
        timelines: Include each run's disk-use timeline.

    Returns:
        The path written.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(result.to_json(timelines=timelines), indent=1) + "\n")
    os.replace(tmp, p)
    return p


def format_failures(result: BenchResult) -> list[str]:
    """One line per run that fails ``trtet-store bench``: wrong output, or trtet_store failing.

    ExecuTorch's own save failing (on a tight filesystem, say) is a finding,
    not a failure of the benchmark.
    """
    return [
        f"{r.method} repeat {r.repeat}: {r.outcome}: {r.error}"
        for r in result.runs
        if r.outcome == "wrong output" or (r.method != "executorch" and r.outcome == "failed")
    ]
