"""What a benchmark measured: :class:`RunResult`, :class:`BenchFilesystem`, :class:`BenchResult`."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.bench.config import METHOD_LABELS, BenchConfig

#: Fields every entry of ``runs`` in the JSON has (the issue's schema); more follow them.
RUN_FIELDS: tuple[str, ...] = (
    "method",
    "placement",
    "filesystem",
    "payload_bytes",
    "peak_extra_bytes",
    "bytes_written",
    "seconds",
    "peak_rss_bytes",
)
#: Metrics summarised as median and max, and compared to ExecuTorch's save.
METRICS: tuple[str, ...] = (
    "peak_extra_bytes",
    "bytes_written",
    "seconds",
    "seconds_durable",
    "peak_rss_bytes",
    "rss_growth_bytes",
    "syncs",
    "device_bytes_written",
    "peak_over_final_bytes",
)


@dataclass
class RunResult:
    """One method, one repeat.

    The first eight attributes are the JSON schema of the issue; the rest add
    what is needed to trust them.

    Attributes:
        method: One of :data:`METHODS`.
        placement: How the payloads got into the output: ``copy`` for
            ExecuTorch's read/write loop, else what the io layer reported
            (several joined with ``+`` when payloads differed).
        filesystem: The filesystem type measured on (``here:<type>`` when shared).
        payload_bytes: Total payload bytes of the program.
        peak_extra_bytes: Start free space minus the least free space seen.
        bytes_written: ``write_bytes`` of ``/proc/self/io`` over the call.
        seconds: Wall seconds of the save call.
        peak_rss_bytes: Peak resident set size during the call (VmHWM after a reset).
        repeat: Repetition index, from 0.
        outcome: ``ok``, ``failed`` (an exception), ``failed silently`` (no
            exception, but an error was logged or the output is short),
            ``refused`` (InsufficientSpaceError before anything was written),
            ``unavailable`` (the filesystem cannot do the placement asked
            for; the io layer fell back, and ``reasons`` says why), or
            ``wrong output`` (the bytes differ from the other methods').
        error: The exception or logged error, if any.
        output_bytes: Sizes of the files found after the call, by name.
        expected_output_bytes: Sizes they should have, by name.
        extra_after_bytes: Extra disk still in use after the call and a sync.
        seconds_durable: Seconds of the call plus a ``syncfs`` of the filesystem.
        rss_before_bytes: RSS just before the call.
        rss_growth_bytes: ``peak_rss_bytes - rss_before_bytes``.
        rss_reset: Whether the peak RSS could be reset before the call
            (otherwise ``peak_rss_bytes`` is the process's peak so far).
        reasons: The io layer's reason for each placement (trtet_store only).
        output_digest: xxh3-128 over the outputs, when verified.
        timeline: ``[seconds, extra bytes]`` points of disk use during the call.
        syncs: ``fsync`` and ``fdatasync`` calls of the call, plus the one
            ``syncfs`` that makes it durable.
        device_bytes_written: Bytes the filesystem's block device wrote over
            the call and its ``syncfs`` (the filesystem's journal included),
            from ``/sys/block``; None without a dedicated loop device.
        peak_over_final_bytes: ``peak_extra_bytes`` minus what the finished
            output keeps (``extra_after_bytes``, if positive): the disk a
            method needs on the way beyond its result.
    """

    method: str
    placement: str
    filesystem: str
    payload_bytes: int
    peak_extra_bytes: int
    bytes_written: int
    seconds: float
    peak_rss_bytes: int
    repeat: int = 0
    outcome: str = "ok"
    error: str | None = None
    output_bytes: dict[str, int] = field(default_factory=dict)
    expected_output_bytes: dict[str, int] = field(default_factory=dict)
    extra_after_bytes: int = 0
    seconds_durable: float = 0.0
    rss_before_bytes: int = 0
    rss_growth_bytes: int = 0
    rss_reset: bool = True
    reasons: list[str] = field(default_factory=list)
    output_digest: str | None = None
    timeline: list[list[float]] = field(default_factory=list)
    syncs: int = 0
    device_bytes_written: int | None = None
    peak_over_final_bytes: int = 0

    @property
    def ok(self) -> bool:
        """Whether the method produced the complete, correct output."""
        return self.outcome == "ok"

    def to_json(self, *, timeline: bool = True) -> dict[str, Any]:
        """The run as a JSON-ready dict, schema fields first."""
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return {k: d[k] for k in (*RUN_FIELDS, *[k for k in d if k not in RUN_FIELDS])}


@dataclass
class BenchFilesystem:
    """Where a benchmark ran.

    Attributes:
        path: The directory all files went to.
        fstype: ``ext4``, ``xfs``, ``btrfs``, ``tmpfs``, or the type under ``here``.
        dedicated: True for a filesystem made for the run (nothing else writes to it).
        size_bytes: Size of the image or tmpfs (dedicated only).
        free_bytes: Free bytes when it was ready.
        device: The loop device or mount source.
        note: What the reader should know (fallbacks, sharing).
    """

    path: Path
    fstype: str
    dedicated: bool
    size_bytes: int | None = None
    free_bytes: int = 0
    device: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        """``ext4`` for a dedicated filesystem, ``here:ext4`` for a shared one."""
        return self.fstype if self.dedicated else f"here:{self.fstype}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "path": os.fspath(self.path),
            "type": self.fstype,
            "label": self.label,
            "dedicated": self.dedicated,
            "size_bytes": self.size_bytes,
            "free_bytes": self.free_bytes,
            "device": self.device,
            "note": self.note,
        }


@dataclass
class BenchResult:
    """Everything a benchmark measured.

    Attributes:
        config: The configuration run.
        filesystem: Where it ran.
        runs: One entry per method and repeat.
        notes: Remarks for the reader (fallbacks, failures, caveats).
        environment: Versions and machine facts.
        also: Results of the same configuration on further filesystems
            (``auto`` as root runs ext4, then XFS).
    """

    config: BenchConfig
    filesystem: BenchFilesystem
    runs: list[RunResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    also: list[BenchResult] = field(default_factory=list)

    def runs_of(self, method: str) -> list[RunResult]:
        """The runs of one method, in repeat order."""
        return [r for r in self.runs if r.method == method]

    def summary(self) -> list[dict[str, Any]]:
        """Per method: outcomes, median and max of every metric, ratios to ExecuTorch's save.

        Medians and maxima are over the runs that succeeded (over all runs when
        none did, so a failure's cost still shows). Ratios are medians divided
        by ExecuTorch's medians, and are None when either side never
        succeeded or ExecuTorch's value is 0.
        """
        out = []
        base = self._stats("executorch")
        for method in self.config.methods:
            runs = self.runs_of(method)
            if not runs:
                continue
            stats = self._stats(method)
            ratios: dict[str, float | None] = {}
            for m in METRICS:
                b = base["median"].get(m) if base and base["ok_runs"] else None
                v = stats["median"].get(m) if stats["ok_runs"] else None
                ratios[m] = (v / b) if (b and v is not None) else None
            out.append(
                {
                    "method": method,
                    "label": METHOD_LABELS[method],
                    "placement": "/".join(sorted({r.placement for r in runs})),
                    "runs": len(runs),
                    "ok_runs": stats["ok_runs"],
                    "outcomes": sorted({r.outcome for r in runs}),
                    "errors": sorted({r.error for r in runs if r.error}),
                    "median": stats["median"],
                    "max": stats["max"],
                    "ratio_to_executorch": ratios,
                }
            )
        return out

    def _stats(self, method: str) -> dict[str, Any]:
        runs = self.runs_of(method)
        if not runs:
            return {}
        ok = [r for r in runs if r.ok]
        use = ok or runs
        med: dict[str, float | None] = {}
        mx: dict[str, float | None] = {}
        if all(r.outcome == "unavailable" for r in runs):
            # What was measured is a fallback, not this method: show nothing.
            return {"ok_runs": 0, "median": dict.fromkeys(METRICS), "max": dict.fromkeys(METRICS)}
        for m in METRICS:
            # None: not measurable here (no dedicated block device).
            values = [v for v in (getattr(r, m) for r in use) if v is not None]
            med[m] = statistics.median(values) if values else None
            mx[m] = max(values) if values else None
        return {"ok_runs": len(ok), "median": med, "max": mx}

    def to_json(self, *, timelines: bool = True) -> dict[str, Any]:
        """The whole result as a JSON-ready dict: ``{"runs": [...], "summary": [...], ...}``."""
        cfg = asdict(self.config)
        cfg["workdir"] = os.fspath(self.config.workdir) if self.config.workdir else None
        cfg["image_dir"] = os.fspath(self.config.image_dir) if self.config.image_dir else None
        cfg["methods"] = list(self.config.methods)
        cfg["effective_chunk_size"] = self.config.effective_chunk_size
        cfg["total_payload_bytes"] = self.config.total_payload_bytes
        return {
            "runs": [r.to_json(timeline=timelines) for r in self.runs],
            "summary": self.summary(),
            "config": cfg,
            "filesystem": self.filesystem.to_json(),
            "notes": list(self.notes),
            "environment": dict(self.environment),
            "also": [o.to_json(timelines=timelines) for o in self.also],
        }
