"""The benchmark's plot: disk use over time, and peak extra disk, per method."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from trtet_store.bench.config import BenchConfig, format_size
from trtet_store.bench.results import BenchResult, RunResult
from trtet_store.io.units import MiB


def _zoom_inset(ax: Any, shown: dict[str, RunResult], cfg: BenchConfig) -> None:
    """Magnify the small peaks (a move's chunk) that vanish at the payload's scale."""
    peaks = {m: r.peak_extra_bytes for m, r in shown.items()}
    if not peaks:
        return
    top = max(peaks.values())
    small = {m: p for m, p in peaks.items() if p < 0.05 * top}
    if not small or top <= 0:
        return
    inset = ax.inset_axes([0.52, 0.1, 0.45, 0.3])
    limit = max(max(small.values()), cfg.effective_chunk_size) * 1.6 / MiB
    for m in small:
        pts = shown[m].timeline or [[0.0, 0]]
        inset.step(
            [p[0] for p in pts],
            [p[1] / MiB for p in pts],
            where="post",
            color=_COLORS.get(m),
            linewidth=1.2,
        )
    inset.axhline(cfg.effective_chunk_size / MiB, color="grey", linestyle=":", linewidth=1)
    inset.text(
        0.01,
        cfg.effective_chunk_size / MiB,
        " one chunk",
        va="bottom",
        fontsize=7,
        color="grey",
        transform=inset.get_yaxis_transform(),
    )
    inset.set_ylim(min(0, inset.get_ylim()[0]), limit)
    inset.set_title("zoom (MiB)", fontsize=7)
    inset.tick_params(labelsize=7)
    inset.grid(True, alpha=0.3)


_COLORS = {
    "executorch": "#d62728",
    "copy": "#1f77b4",
    "clone": "#9467bd",
    "move": "#2ca02c",
    "insert": "#ff7f0e",
}


def plot(result: BenchResult, path: os.PathLike | str) -> Path:
    """Draw disk use over time per method, and peak extra disk per method, to a PNG.

    Left: extra disk in use over the save call, one line per method (the
    repeat with the median peak), the payload size dashed. Right: peak extra
    disk per method (median bar, max whisker), labelled with the ratio to
    ExecuTorch's save.

    Args:
        result: A benchmark result.
        path: The PNG; its directory is created.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result.config
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [2.2, 1]}, constrained_layout=True
    )
    everything = result.summary()
    summary = [s for s in everything if s["median"]["peak_extra_bytes"] is not None]
    missing = [s["label"] for s in everything if s["median"]["peak_extra_bytes"] is None]
    shown: dict[str, RunResult] = {}
    for s in summary:
        runs = result.runs_of(s["method"])
        ok = [r for r in runs if r.ok] or runs
        target = statistics.median_low([r.peak_extra_bytes for r in ok])
        run = next(r for r in ok if r.peak_extra_bytes == target)
        shown[s["method"]] = run
        pts = run.timeline or [[0.0, 0]]
        xs = [p[0] for p in pts]
        ys = [p[1] / MiB for p in pts]
        status = "" if run.ok else f" ({run.outcome})"
        ax.step(
            xs,
            ys,
            where="post",
            color=_COLORS.get(s["method"]),
            linewidth=2,
            label=f"{s['label']}: {s['placement']}{status}, peak "
            f"{format_size(run.peak_extra_bytes)}",
        )
        ax.axvline(run.seconds, color=_COLORS.get(s["method"]), linestyle=":", linewidth=1)
    ax.axhline(
        cfg.total_payload_bytes / MiB,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"payload size {format_size(cfg.total_payload_bytes)}",
    )
    ax.set_xlabel("seconds since the save started (dotted: call returned; then sync)")
    ax.set_ylabel("extra disk in use (MiB)")
    ax.set_title(
        f"Disk use while saving {cfg.payloads} x {format_size(cfg.payload_size)} "
        f"on {result.filesystem.label}"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    _zoom_inset(ax, shown, cfg)

    names = [s["label"].replace(" ", "\n", 1) for s in summary]
    med = [s["median"]["peak_extra_bytes"] / MiB for s in summary]
    mx = [s["max"]["peak_extra_bytes"] / MiB for s in summary]
    colors = [_COLORS.get(s["method"], "grey") for s in summary]
    xpos = range(len(names))
    bx.bar(
        xpos,
        med,
        color=colors,
        yerr=[[0] * len(med), [b - a for a, b in zip(med, mx, strict=True)]],
        capsize=4,
    )
    for i, s in enumerate(summary):
        r = s["ratio_to_executorch"]["peak_extra_bytes"]
        text = format_size(s["median"]["peak_extra_bytes"]) + (
            f"\n{r:.3f}x" if r is not None and i else ""
        )
        if s["ok_runs"] < s["runs"]:
            text += f"\n{'/'.join(o for o in s['outcomes'] if o != 'ok')}"
        bx.annotate(
            text,
            (i, mx[i]),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    bx.set_xticks(list(xpos), names, fontsize=8)
    bx.set_ylabel("peak extra disk (MiB), median; whisker: max")
    bx.set_title(f"Peak extra disk, {cfg.repeat} repeat(s)")
    if missing:
        bx.set_xlabel("not possible on this filesystem: " + ", ".join(missing), fontsize=8)
    bx.set_ylim(0, max(mx + [1]) * 1.25)
    bx.grid(True, axis="y", alpha=0.3)

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
