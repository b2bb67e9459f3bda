"""Peak-disk benchmark: ExecuTorch's own save against trtet_store, side by side.

The benchmark builds a real ExecuTorch program whose delegates carry large
file-backed payloads (engine-sized blobs staged in a :class:`~trtet_store.io.BlobStore`,
handed to ExecuTorch as ``FileBackedData`` named data), then writes it with
each method on one filesystem, in one run:

``executorch``
    ExecuTorch's ``program.save(pte)`` plus ``write_tensor_data_to_file(dir)``
    (a Python read/write copy, no fsync, errors in ``save`` only logged).
``copy``, ``clone``
    trtet_store's transactional write with ``consume=False`` (the payloads
    stay intact), limited to that placement.
``move``, ``insert``
    The same with ``consume=True``, the payloads staged as owned blobs on the
    output's filesystem (a move goes back to front, one chunk at a time; an
    insert renames a payload into place and makes room for the header).

A zero-copy placement the filesystem cannot do (clone on ext4, insert on
btrfs) is tried once, reported as ``unavailable`` with the io layer's reason,
and not repeated.

Per method and repeat it records peak extra disk (``statvfs`` polled in a
thread, sampled after every step), bytes written (``/proc/self/io``), wall
seconds (and seconds until the data is durable), and peak RSS. As root it
measures on a dedicated loop-mounted filesystem (or tmpfs) of the chosen type,
made for the run and torn down afterwards; otherwise, or with
``filesystem="here"``, in a temporary directory on the current filesystem,
and the result says so.

Library code only: :mod:`trtet_store.cli` is the command line. Heavy imports
(torch, executorch, matplotlib) happen inside the functions that need them.

Example::

    from trtet_store import bench
    result = bench.run_bench(bench.BenchConfig(payload_size=64 << 20, repeat=1))
    print(bench.format_table(result))
    bench.write_json(result, "bench.json")
    bench.plot(result, "bench.png")
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import platform
import random
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trtet_store import loopfs
from trtet_store.measure import (
    PeakDiskMonitor,
    current_rss_bytes,
    free_bytes,
    io_counters,
    peak_rss_bytes,
    reset_peak_rss,
    syncfs,
)

__all__ = [
    "FILESYSTEMS",
    "METHODS",
    "BenchConfig",
    "BenchError",
    "BenchFilesystem",
    "BenchResult",
    "RunResult",
    "bench_filesystem",
    "build_program",
    "format_size",
    "format_table",
    "parse_size",
    "plot",
    "run_bench",
    "write_json",
]

log = logging.getLogger("trtet_store.bench")

MiB = 1 << 20
GiB = 1 << 30

#: The methods compared, in table order; ``executorch`` is the baseline of every ratio.
METHODS: tuple[str, ...] = ("executorch", "copy", "clone", "move", "insert")
METHOD_LABELS: dict[str, str] = {
    "executorch": "ExecuTorch save",
    "copy": "trtet_store copy",
    "clone": "trtet_store clone",
    "move": "trtet_store move",
    "insert": "trtet_store insert",
}
#: The methods that use the staged payloads up (``consume=True``).
CONSUMING: frozenset[str] = frozenset({"move", "insert"})
#: ``here`` is a temporary directory on the current filesystem (no mount).
FILESYSTEMS: tuple[str, ...] = ("ext4", "xfs", "btrfs", "tmpfs", "here")
LAYOUTS: tuple[str, ...] = ("split", "pte", "ptd")
#: Named-data tag of the payloads that go to a ``.ptd`` (``engines.ptd``).
PTD_TAG = "engines"
PTE_NAME = "model.pte"
BACKEND_ID = "TrtetBenchBackend"
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
_SESSION_PREFIX = "trtet-bench-"
_TMPFS_SOURCE = "trtet-bench"

ProgressFn = Callable[[str, int, int], None]


class BenchError(RuntimeError):
    """The benchmark could not be set up (no space, bad configuration)."""


# --- sizes -------------------------------------------------------------------------


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``512M``, ``1.5GiB``, ``4096`` or ``16 MiB``.

    Units are binary (``K``/``KB``/``KiB`` all mean 1024), case-insensitive.

    Args:
        text: The size, or an int (returned as is).

    Returns:
        The size in bytes.

    Raises:
        ValueError: If the text is not a size, or is negative.
    """
    if isinstance(text, int):
        value = text
    else:
        s = text.strip().lower().replace(" ", "")
        i = len(s)
        while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
            i -= 1
        number, unit = s[:i], s[i:]
        if not number or unit not in _UNITS:
            raise ValueError(f"not a size: {text!r} (examples: 512M, 1GiB, 4096)")
        try:
            value = (
                int(float(number) * _UNITS[unit]) if "." in number else int(number) * _UNITS[unit]
            )
        except ValueError:
            raise ValueError(f"not a size: {text!r}") from None
    if value < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return value


def format_size(n: float | None, *, signed: bool = False) -> str:
    """Format a byte count with a binary unit, e.g. ``512.0 MiB``.

    Args:
        n: Bytes, or None (formatted as ``-``).
        signed: Prefix positive values with ``+``.

    Returns:
        The text.
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    a = abs(n)
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if a >= div:
            return f"{sign}{a / div:.1f} {unit}"
    return f"{sign}{int(a)} B"


# --- configuration and results ----------------------------------------------------------


@dataclass
class BenchConfig:
    """What to benchmark.

    Attributes:
        payload_size: Bytes per payload (one per delegate, like one TensorRT engine).
        payloads: Number of payloads.
        chunk_size: Bytes per step of trtet_store's move/copy; None for its default (8 MiB).
        filesystem: ``ext4``, ``xfs``, ``btrfs``, ``tmpfs`` (a dedicated
            filesystem, root only), ``here`` (a temp directory on the
            filesystem of ``workdir``), or ``auto`` (as root ext4, then XFS
            where it can be made, so that a first run shows insert and clone;
            else here).
        fs_size: Size of the dedicated filesystem: ``"fit"`` (every method
            fits: the staged payloads plus a full copy of them), ``"tight"``
            (the staged payloads fit once, plus a move's chunk, but not
            twice), or a byte count (used as given).
        repeat: Repetitions of every method; results give median and max.
        methods: Which of :data:`METHODS` to run.
        layout: Where the payloads go: ``split`` (even-numbered ones in the
            ``.pte``, odd ones in ``engines.ptd``), ``pte`` or ``ptd``.
        segment_alignment: ExecuTorch's ``segment_alignment`` (4096 gives
            page-aligned payloads, which zero-copy placements need).
        workdir: Directory for ``here`` runs; default the current directory.
        image_dir: Where loop images live (on a disk, never a tmpfs); default
            ``$TRTET_FS_ROOT`` or ``/var/tmp``.
        verify_outputs: Hash each method's outputs (outside the measured
            window) and check every method wrote the same bytes.
        cached_sources: Read the payloads into the page cache before each
            method (a blob just built and still cached); otherwise each is
            dropped from the cache before each method (an engine built long
            ago), so that a method never reads what the one before it cached.
    """

    payload_size: int = 512 * MiB
    payloads: int = 2
    chunk_size: int | None = None
    filesystem: str = "auto"
    fs_size: str | int = "fit"
    repeat: int = 3
    methods: tuple[str, ...] = METHODS
    layout: str = "split"
    segment_alignment: int = 4096
    workdir: Path | None = None
    image_dir: Path | None = None
    verify_outputs: bool = True
    cached_sources: bool = False

    def validate(self) -> None:
        """Raise ValueError on an impossible configuration."""
        if self.payload_size <= 0:
            raise ValueError("payload_size must be positive")
        if self.payloads < 1:
            raise ValueError("payloads must be at least 1")
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        if self.repeat < 1:
            raise ValueError("repeat must be at least 1")
        if self.filesystem not in (*FILESYSTEMS, "auto"):
            raise ValueError(f"filesystem must be one of {FILESYSTEMS} or 'auto'")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {bad}")
        if isinstance(self.fs_size, str) and self.fs_size not in ("fit", "tight"):
            raise ValueError("fs_size must be 'fit', 'tight' or a byte count")
        sa = self.segment_alignment
        if sa <= 0 or sa & (sa - 1):
            raise ValueError("segment_alignment must be a power of two")

    @property
    def total_payload_bytes(self) -> int:
        """All payload bytes together."""
        return self.payload_size * self.payloads

    @property
    def effective_chunk_size(self) -> int:
        """The chunk size trtet_store will use."""
        from trtet_store.io.writer import DEFAULT_CHUNK_SIZE

        return self.chunk_size or DEFAULT_CHUNK_SIZE


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


# --- the dedicated filesystem ----------------------------------------------------------


#: ext4 without lazy inode-table init: its background writes would disturb timings.
_MKFS_OPTIONS: dict[str, list[str]] = {"ext4": ["-E", "lazy_itable_init=0,lazy_journal_init=0"]}


def _warm_up(path: Path, keep_free: int = 64 * MiB) -> None:
    """Write a file over the free space of a fresh filesystem once, then delete it.

    On a freshly made filesystem the first write into never-used space is much
    slower (block groups initialised on first allocation, the sparse image
    allocated on the host): whichever method ran first looked up to three
    times slower than the same method later (measured: 6.7 s vs 2.3 s for one
    1 GiB save). Touching the space once takes that out of every measurement.
    """
    filler = path / ".trtet-bench-warm-up"
    zeros = bytes(16 * MiB)
    try:
        with open(filler, "wb") as f:
            left = max(0, free_bytes(path) - keep_free)
            while left > 0:
                n = min(left, len(zeros))
                try:
                    f.write(zeros[:n])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                left -= n
            with contextlib.suppress(OSError):
                f.flush()
                os.fsync(f.fileno())
    finally:
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()
    with contextlib.suppress(OSError):
        syncfs(path)


#: Filesystem overhead guesses (fraction usable, fixed MiB lost) for the first try.
_OVERHEAD = {"ext4": (0.92, 8), "xfs": (0.98, 110), "btrfs": (0.97, 130), "tmpfs": (1.0, 0)}


@contextlib.contextmanager
def bench_filesystem(
    fstype: str,
    *,
    min_free: int,
    max_free: int | None = None,
    size: int | None = None,
    image_dir: Path | None = None,
    workdir: Path | None = None,
) -> Iterator[BenchFilesystem]:
    """A place to benchmark in: a dedicated filesystem, or a temp dir on the current one.

    A dedicated filesystem (root only) is an image under ``image_dir``,
    formatted, loop-mounted and, on exit (also on an exception or Ctrl-C),
    unmounted, detached and deleted. It is sized so that its free space lies
    in ``[min_free, max_free]`` (made again, bigger or smaller, if the first
    guess missed), or exactly ``size`` bytes when given. When it cannot be
    made (not root, tool missing, mount refused), or ``fstype == "here"``, a
    temporary directory under ``workdir`` is used instead and
    :attr:`BenchFilesystem.note` says why.

    Args:
        fstype: One of :data:`FILESYSTEMS`.
        min_free: Free bytes the benchmark needs.
        max_free: Free bytes it must not have (for a tight filesystem), or None.
        size: Exact image size in bytes, overriding the sizing.
        image_dir: Directory for images; default ``$TRTET_FS_ROOT`` or ``/var/tmp``.
        workdir: Directory for ``here``; default the current directory.

    Yields:
        The filesystem.

    Raises:
        BenchError: ``here`` lacks ``min_free`` bytes, or a tight filesystem
            could not be sized.
    """
    note = ""
    if fstype != "here":
        if os.geteuid() != 0:
            note = f"not root, so no dedicated {fstype} filesystem could be mounted"
        else:
            try:
                with _dedicated(fstype, min_free, max_free, size, image_dir) as fs:
                    yield fs
                return
            except _Unavailable as exc:
                note = f"no dedicated {fstype} filesystem: {exc}"
    base = Path(workdir or Path.cwd()).absolute()
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".trtet-bench-", dir=base))
    try:
        real_type = loopfs.fstype_of(path)
        free = free_bytes(path)
        shared = (
            f"measured in a temp directory on the shared {real_type} filesystem of {base}: "
            "other processes' writes there show up in the figures"
        )
        note = f"{note}; {shared}" if note else shared
        if free < min_free:
            raise BenchError(
                f"{base} has {format_size(free)} free, the benchmark needs {format_size(min_free)}"
            )
        yield BenchFilesystem(path, real_type, False, None, free, None, note)
    finally:
        shutil.rmtree(path, ignore_errors=True)


class _Unavailable(Exception):
    pass


@contextlib.contextmanager
def _dedicated(
    fstype: str, min_free: int, max_free: int | None, size: int | None, image_dir: Path | None
) -> Iterator[BenchFilesystem]:
    factory = loopfs.FilesystemFactory(
        image_dir, prefix=_SESSION_PREFIX, tmpfs_source=_TMPFS_SOURCE
    )
    for stale in factory.stale_cleaned:
        log.info("removed a stale benchmark filesystem in %s", stale)
    min_bytes = loopfs.MIN_SIZE_MIB[fstype] * MiB
    try:
        target = min_free if max_free is None else (min_free + max_free) // 2
        frac, fixed = _OVERHEAD[fstype]
        guess = size or max(int(target / frac) + fixed * MiB, min_bytes)
        for _attempt in range(4):
            try:
                mnt = factory.make(
                    fstype, max(1, -(-guess // MiB)), mkfs_options=_MKFS_OPTIONS.get(fstype)
                )
            except (loopfs.FilesystemUnavailable, ValueError) as exc:
                raise _Unavailable(str(exc)) from None
            free = free_bytes(mnt)
            fits = free >= min_free and (max_free is None or free <= max_free)
            if size is not None or fits:
                break
            # Resize by what was missed, and try again.
            problems = factory.release(mnt)
            if problems:
                raise BenchError("; ".join(problems))
            guess = max(guess + (target - free) + MiB, min_bytes)
        else:
            raise BenchError(
                f"could not size a {fstype} filesystem to {format_size(min_free)}"
                + (f"..{format_size(max_free)}" if max_free is not None else "")
                + " free"
            )
        if fstype != "tmpfs":
            _warm_up(mnt)
        device = "tmpfs" if fstype == "tmpfs" else factory.mounted_at(mnt).loop_device
        yield BenchFilesystem(mnt, fstype, True, guess, free, device, "")
    finally:
        problems = factory.close()
        if problems:
            log.error("benchmark filesystem teardown: %s", "; ".join(problems))


# --- the program -------------------------------------------------------------------


#: (key, blob, external tag) per delegate of the program being built.
_PENDING: list[tuple[str, Any, str | None]] = []
_BUILD_LOCK = threading.Lock()
_BACKEND: type | None = None


def _backend() -> type:
    """Define the benchmark's backend once (``to_backend`` finds it by class name)."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    from typing import final

    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    from trtet_store.export import trt_blob
    from trtet_store.export.executorch import add_blob_as_named_data

    @final
    class TrtetBenchBackend(BackendDetails):
        """One delegate per payload; the payload is named data, the blob a TR01 header."""

        @staticmethod
        def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
            specs = {c.key: c.value.decode() for c in compile_specs}
            key, blob, tag = _PENDING[int(specs["engine_index"])]
            store = NamedDataStore()
            add_blob_as_named_data(store, key, blob, alignment=16, external_tag=tag)
            meta = trt_blob.BlobMetadata(
                io_bindings=(
                    trt_blob.IOBinding("x", "float32", (4,), True),
                    trt_blob.IOBinding("output", "float32", (4,), False),
                ),
                target_platform="benchmark (no engine: payload bytes are random)",
                engine_key=key,
            )
            return PreprocessResult(
                processed_bytes=trt_blob.encode(meta),
                data_store_output=store.get_named_data_store_output(),
            )

    _BACKEND = TrtetBenchBackend
    return _BACKEND


def build_program(
    blobs: Sequence[Any], *, layout: str = "split", segment_alignment: int = 4096
) -> Any:
    """A real ExecuTorch program with one delegate per blob, each blob file-backed named data.

    The module is a chain of ``x * 2.0`` steps, each lowered by its own
    partition to the benchmark backend (as Torch-TensorRT makes one partition
    per engine). Each delegate's blob is a TensorRT-format header (``TR01``)
    whose ``engine_key`` names its payload; the payload is registered with
    :func:`trtet_store.export.executorch.add_blob_as_named_data`, so ExecuTorch
    only ever sees its length. The runtime can load the program but not its
    methods (the backend exists only at export time).

    Args:
        blobs: Live :class:`~trtet_store.io.Blob` payloads.
        layout: ``split`` (blob *i* in the ``.pte`` when *i* is even, else in
            ``engines.ptd``), ``pte`` or ``ptd``.
        segment_alignment: ExecuTorch's segment alignment.

    Returns:
        The ``ExecutorchProgramManager``.
    """
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import (
        DelegationSpec,
        Partitioner,
        PartitionResult,
    )

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    _backend()
    n = len(blobs)

    def tag_of(i: int) -> str | None:
        if layout == "pte" or (layout == "split" and i % 2 == 0):
            return None
        return PTD_TAG

    entries = [(f"engine{i}_trt_engine", b, tag_of(i)) for i, b in enumerate(blobs)]

    class PerStepPartitioner(Partitioner):
        def partition(self, exported_program: Any) -> Any:
            tags = {}
            i = 0
            for node in exported_program.graph_module.graph.nodes:
                if node.op != "call_function":
                    continue
                tag = f"trtet_bench_{i}"
                node.meta["delegation_tag"] = tag
                tags[tag] = DelegationSpec(
                    BACKEND_ID,
                    [CompileSpec("engine_index", str(i).encode())],
                )
                i += 1
            return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(n):
                x = x * 2.0
            return x

    # preprocess runs inside to_backend and finds its payload here; no token
    # goes into the program, so equal payloads give byte-identical outputs.
    with _BUILD_LOCK:
        _PENDING[:] = entries
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ep = torch.export.export(Chain(), (torch.randn(4),))
                edge = to_edge(ep).to_backend(PerStepPartitioner())
                config = ExecutorchBackendConfig(segment_alignment=segment_alignment)
                return edge.to_executorch(config)
        finally:
            _PENDING.clear()


def _stage_payloads(
    store: Any, config: BenchConfig, seed: int, progress: Callable[[int], None] | None
) -> list[Any]:
    """Write ``config.payloads`` payloads of random-looking bytes as blobs of ``store``.

    A 16 MiB pseudo-random block (from ``seed``) is reused with each chunk's
    first 16 bytes made unique (payload, chunk, seed), so payloads differ
    (ExecuTorch's dedup fingerprint is the first 32 bytes) without generating
    gigabytes of randomness, and the same seed gives the same bytes (outputs
    of different stagings can be compared).
    """
    block = bytearray(random.Random(seed).randbytes(min(16 * MiB, config.payload_size)))
    blobs = []
    done = 0
    for i in range(config.payloads):
        left = config.payload_size
        k = 0
        with store.writer() as w:
            while left:
                n = min(left, len(block))
                if n >= 16:
                    block[:16] = struct.pack("<IQI", i, k, seed & 0xFFFFFFFF)
                w.write(memoryview(block)[:n])
                left -= n
                k += 1
                done += n
                if progress:
                    progress(done)
        blobs.append(w.blob)
    return blobs


# --- running the methods ---------------------------------------------------------------


class _LogCapture(logging.Handler):
    """Collects ERROR records of the root logger (where ExecuTorch's ``save`` logs)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(record.getMessage())


def _expected_outputs(program: Any, out: Path) -> dict[str, int]:
    """File name -> size of every output of ``program`` (the Cords' lengths)."""
    from trtet_store.export import _executorch_private as priv
    from trtet_store.export.executorch import ptd_paths

    sizes = {PTE_NAME: len(priv.pte_cord(program))}
    cords = priv.ptd_cords(program)
    for tag, path in ptd_paths(program, out).items():
        sizes[path.name] = len(cords[tag])
    return sizes


def _executorch_save(program: Any, out: Path) -> None:
    """What a user of ExecuTorch 1.5.1 runs: ``save`` then ``write_tensor_data_to_file``."""
    program.save(os.fspath(out / PTE_NAME))
    if program._tensor_data:
        program.write_tensor_data_to_file(os.fspath(out))


def _trtet_save(
    program: Any,
    out: Path,
    *,
    consume: bool,
    placements: set[str] | None,
    chunk_size: int | None,
    progress: Callable[[int, int], None],
) -> list[Any]:
    """trtet_store's write of the ``.pte`` and its ``.ptd`` files, one transaction."""
    import inspect

    from trtet_store.export import executorch as adapter
    from trtet_store.io import write_files

    save_program = getattr(adapter, "save_program", None)
    if save_program is not None and "placements" in inspect.signature(save_program).parameters:
        return list(
            save_program(
                program,
                out / PTE_NAME,
                consume=consume,
                chunk_size=chunk_size,
                progress=progress,
                placements=placements,
            )
        )
    layouts = adapter.program_layouts(program, out / PTE_NAME, consume=consume)
    return write_files(
        layouts, consume=consume, chunk_size=chunk_size, progress=progress, placements=placements
    )


class _SizeWatcher:
    """Reports the growth of output files while a call without a progress hook runs."""

    def __init__(self, out: Path, total: int, report: Callable[[int, int], None]) -> None:
        self.out = out
        self.total = total
        self.report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-size-watcher", daemon=True)

    def __enter__(self) -> _SizeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            done = 0
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.out):
                    with contextlib.suppress(OSError):
                        done += entry.stat().st_size
            self.report(min(done, self.total), self.total)


def _digest_outputs(out: Path, names: Sequence[str]) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    for name in sorted(names):
        h.update(name.encode() + b"\0")
        with open(out / name, "rb") as f:
            while chunk := f.read(16 * MiB):
                h.update(chunk)
    return h.hexdigest()


class _SyncCounter:
    """Counts ``fsync`` and ``fdatasync`` calls through the io layer's call table.

    Wraps the real calls (and puts them back on exit); ExecuTorch's save does
    not go through the table, and does not sync at all.
    """

    def __init__(self, calls: Any) -> None:
        self.calls = calls
        self.count = 0
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> _SyncCounter:
        for name in ("fsync", "fdatasync"):
            real = self.saved[name] = getattr(self.calls, name)

            def counted(fd: int, _real: Any = real) -> None:
                self.count += 1
                _real(fd)

            setattr(self.calls, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self.saved.items():
            setattr(self.calls, name, real)


def _set_cached(paths: Sequence[Path], cached: bool) -> None:
    """Read ``paths`` into the page cache, or write them back and drop them from it."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # consumed by a method before
            continue
        try:
            if cached:
                while os.read(fd, 16 * MiB):
                    pass
            else:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _device_written(path: Path) -> int | None:
    """Bytes written so far by the block device under ``path`` (a loop device), or None."""
    source = loopfs.mount_source(path)
    if not source or not source.startswith("/dev/"):
        return None
    try:
        with open(f"/sys/block/{os.path.basename(source)}/stat") as f:
            return int(f.read().split()[6]) * 512  # sectors written
    except (OSError, IndexError, ValueError):
        return None


def _run_method(
    method: str,
    program: Any,
    fs: BenchFilesystem,
    config: BenchConfig,
    repeat: int,
    progress: ProgressFn | None,
    sources: Sequence[Path] = (),
) -> RunResult:
    """Run one method once, measured; leave no output behind."""
    from trtet_store.io import InsufficientSpaceError
    from trtet_store.io import fs as io_fs

    out = fs.path / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    expected = _expected_outputs(program, out)
    total = sum(expected.values())
    label = f"{METHOD_LABELS[method]} [{repeat + 1}/{config.repeat}]"
    result = RunResult(
        method=method,
        placement="copy" if method == "executorch" else "?",
        filesystem=fs.label,
        payload_bytes=config.total_payload_bytes,
        peak_extra_bytes=0,
        bytes_written=0,
        seconds=0.0,
        peak_rss_bytes=0,
        repeat=repeat,
        expected_output_bytes=expected,
    )
    if method == "executorch":
        result.reasons = ["ExecuTorch copies every payload (Cord.write_to_file, 8 MiB reads)"]
    gc.collect()
    _set_cached(sources, config.cached_sources)
    use_syncfs = fs.fstype == "btrfs"
    capture = _LogCapture()
    reports: list[Any] = []
    mon = PeakDiskMonitor(fs.path, use_syncfs=use_syncfs)
    syncs = _SyncCounter(io_fs.calls)
    with mon, syncs:
        rss_before = current_rss_bytes()
        result.rss_reset = reset_peak_rss()
        io_before = io_counters()["write_bytes"]
        dev_before = _device_written(fs.path)
        t0 = time.perf_counter()
        try:
            if method == "executorch":
                root = logging.getLogger()
                root.addHandler(capture)
                try:
                    with _SizeWatcher(out, total, lambda d, t: progress and progress(label, d, t)):
                        _executorch_save(program, out)
                finally:
                    root.removeHandler(capture)
            else:

                def step(done: int, tot: int) -> None:
                    mon.sample()
                    if progress:
                        progress(label, done, tot)

                reports = _trtet_save(
                    program,
                    out,
                    consume=method in CONSUMING,
                    # An insert is a kind of move: the writer only considers
                    # payloads it may move for it.
                    placements={"insert", "move"} if method == "insert" else {method},
                    chunk_size=config.chunk_size,
                    progress=step,
                )
        except InsufficientSpaceError as exc:
            result.outcome = "refused"
            result.error = f"InsufficientSpaceError: {exc}"
        except Exception as exc:  # recorded, not raised: the table shows it
            result.outcome = "failed"
            code = (
                f" [{errno.errorcode.get(exc.errno, exc.errno)}]"
                if isinstance(exc, OSError) and exc.errno
                else ""
            )
            result.error = f"{type(exc).__name__}{code}: {exc}"
        t1 = time.perf_counter()
        mon.sample()
        with contextlib.suppress(OSError):
            syncfs(fs.path)
        t2 = time.perf_counter()
        result.bytes_written = io_counters()["write_bytes"] - io_before
        dev_after = _device_written(fs.path)
        if dev_before is not None and dev_after is not None:
            result.device_bytes_written = dev_after - dev_before
        result.peak_rss_bytes = peak_rss_bytes()
    result.seconds = t1 - t0
    result.seconds_durable = t2 - t0
    result.rss_before_bytes = rss_before
    result.rss_growth_bytes = max(0, result.peak_rss_bytes - rss_before)
    result.peak_extra_bytes = mon.peak_extra_bytes
    result.extra_after_bytes = mon.extra_after_bytes
    result.peak_over_final_bytes = mon.peak_extra_bytes - max(0, mon.extra_after_bytes)
    result.syncs = syncs.count + 1  # the syncfs that makes the call durable
    result.timeline = [[round(t, 4), b] for t, b in mon.timeline]
    if progress:
        progress(label, total, total)

    found = {}
    for entry in sorted(os.scandir(out), key=lambda e: e.name):
        if entry.is_file() and not entry.name.startswith("."):
            found[entry.name] = entry.stat().st_size
    result.output_bytes = found
    if reports:
        placements = [p for r in reports for p in r.placements]
        used = {p.placement for p in placements}
        result.placement = "+".join(sorted(used)) or "none"
        result.reasons = sorted({f"{p.placement}: {p.reason}" for p in placements})
        if method not in used and result.outcome == "ok":
            result.outcome = "unavailable"
            result.error = f"{method} is not possible here: " + " | ".join(
                sorted({p.reason for p in placements})
            )
    elif method != "executorch":
        result.placement = "none"
    if capture.messages:
        logged = "logged, not raised: " + " | ".join(capture.messages)
        if result.outcome == "ok":
            result.outcome = "failed silently"
            result.error = logged
        else:
            result.error = f"{result.error}; before that, {logged}"
    if result.outcome == "ok" and found != expected:
        result.outcome = "failed silently"
        short = ", ".join(
            f"{name}: {format_size(found.get(name, 0))} of {format_size(size)}"
            for name, size in expected.items()
            if found.get(name) != size
        )
        result.error = f"no error raised, but outputs are incomplete ({short})"
    elif result.outcome in ("failed", "refused") and found:
        partial = ", ".join(f"{n} {format_size(s)}" for n, s in found.items())
        result.error = f"{result.error}; left behind: {partial}"
    if result.outcome == "ok" and config.verify_outputs:
        result.output_digest = _digest_outputs(out, list(expected))
    shutil.rmtree(out, ignore_errors=True)
    return result


def _environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "euid": os.geteuid(),
    }
    for dist in ("executorch", "torch", "trtet-store"):
        try:
            env[dist] = version(dist)
        except PackageNotFoundError:
            env[dist] = None
    try:
        import psutil

        env["memory_bytes"] = psutil.virtual_memory().total
    except Exception:  # pragma: no cover - psutil is a dependency
        pass
    return env


def _space_needed(config: BenchConfig) -> tuple[int, int | None]:
    """(min_free, max_free) for the filesystem: roomy (``fit``) or ``tight``."""
    payload = config.total_payload_bytes
    chunk = config.effective_chunk_size
    # Headers, flatbuffers, segment padding, journal, block rounding per file.
    overhead = 2 * MiB + 2 * config.segment_alignment * (config.payloads + 2)
    if config.fs_size == "tight":
        # The staged payloads plus what a move needs (a chunk per output file,
        # the writer's slack), but clearly less than a second copy.
        low = payload + 3 * chunk + overhead + 4 * MiB
        high = payload + max(low - payload + 8 * MiB, payload // 2)
        if high >= 2 * payload:
            raise BenchError(
                "payloads too small for a tight filesystem: a move's needs "
                f"({format_size(low - payload)}) are not well below the payload size"
            )
        return low, high
    return 2 * payload + 2 * chunk + overhead + 16 * MiB, None


def run_bench(
    config: BenchConfig,
    *,
    progress: ProgressFn | None = None,
    filesystem: BenchFilesystem | None = None,
) -> BenchResult:
    """Run the benchmark and return every measurement.

    Per repeat: payloads are staged as blobs on the benchmark filesystem and a
    program is built over them; then each method writes the program to an
    empty output directory there, measured, and the outputs are deleted
    again, so every method starts from the same state (the staged payloads,
    nothing else). The consuming method runs last, since it uses the payloads
    up; the other two alternate their order between repeats.

    Args:
        config: What to run.
        progress: ``progress(phase, done, total)`` while staging and writing
            (byte counts); the CLI draws tqdm bars from it.
        filesystem: Measure here instead of making a filesystem (a test's
            mount, say); ``config.filesystem`` and ``fs_size`` are then ignored.

    Returns:
        The result; a method that fails is recorded with its outcome, not raised.

    Raises:
        BenchError: The filesystem could not be set up.
        ValueError: An invalid configuration.
    """
    config.validate()
    fstype = config.filesystem
    if filesystem is not None:
        return _run_all(config, filesystem, progress)
    if fstype == "auto" and os.geteuid() == 0:
        # ext4 shows insert, XFS clone: a first run should see both.
        result = run_bench(replace(config, filesystem="ext4"), progress=progress)
        try:
            result.also.append(run_bench(replace(config, filesystem="xfs"), progress=progress))
        except BenchError as exc:
            result.notes.append(f"xfs: not measured ({exc})")
        return result
    if fstype == "auto":
        fstype = "here"
    min_free, max_free = _space_needed(config)
    size = config.fs_size if isinstance(config.fs_size, int) else None
    with bench_filesystem(
        fstype,
        min_free=min_free,
        max_free=max_free,
        size=size,
        image_dir=config.image_dir,
        workdir=config.workdir,
    ) as fs:
        return _run_all(config, fs, progress)


def _run_group(
    methods: Sequence[str],
    fs: BenchFilesystem,
    config: BenchConfig,
    rep: int,
    progress: ProgressFn | None,
) -> list[RunResult]:
    """Stage payloads, build a program over them, and run ``methods`` on it in order."""
    from trtet_store.io import BlobStore

    store = BlobStore(fs.path / "staging")
    try:
        label = f"staging payloads [{rep + 1}/{config.repeat}]"
        total = config.total_payload_bytes
        report = (lambda d: progress(label, d, total)) if progress else None
        blobs = _stage_payloads(store, config, rep, report)
        program = build_program(
            blobs, layout=config.layout, segment_alignment=config.segment_alignment
        )
        sources = [Path(b.path) for b in blobs]
        del blobs  # the program holds them now
        runs = [_run_method(m, program, fs, config, rep, progress, sources) for m in methods]
        del program
        gc.collect()
        return runs
    finally:
        store.close()


def _run_all(config: BenchConfig, fs: BenchFilesystem, progress: ProgressFn | None) -> BenchResult:
    result = BenchResult(config, fs, environment=_environment())
    if fs.note:
        result.notes.append(fs.note)
    if fs.fstype == "tmpfs" or fs.fstype.endswith("tmpfs"):
        result.notes.append("tmpfs: /proc/self/io reports 0 bytes written")
    if fs.fstype in ("xfs", "btrfs") and "copy" in config.methods:
        result.notes.append(
            f"{fs.fstype}: the kernel's copy_file_range shares (reflinks) block-aligned extents "
            "on its own, so trtet_store's copy costs about as little as a clone here"
        )
    if fs.fstype == "btrfs":
        result.notes.append(
            "btrfs: statvfs lags until a commit, so every sample calls syncfs; a move "
            "frees nothing until a whole extent is unreferenced"
        )
    if config.fs_size == "tight":
        result.notes.append(
            f"tight filesystem: {format_size(fs.free_bytes)} free for "
            f"{format_size(config.total_payload_bytes)} of payloads (fits once, not twice)"
        )
    result.notes.append(
        "ExecuTorch's save does not fsync; 'seconds' is the call, 'durable' adds a syncfs"
    )
    staging = fs.path / "staging"
    staging.mkdir(exist_ok=True)
    unavailable: set[str] = set()
    for rep in range(config.repeat):
        plain = [m for m in config.methods if m not in CONSUMING and m not in unavailable]
        if rep % 2:
            plain.reverse()  # neither ExecuTorch nor we always go first
        # Methods that keep the payloads share one staging; each consuming
        # method uses its payloads up and gets a fresh one.
        groups = [plain] if plain else []
        groups += [[m] for m in config.methods if m in CONSUMING and m not in unavailable]
        digests: list[str] = []
        for group in groups:
            for run in _run_group(group, fs, config, rep, progress):
                if run.output_digest is not None:
                    digests.append(run.output_digest)
                    if run.output_digest != digests[0]:
                        run.outcome = "wrong output"
                        run.error = "the outputs differ from the first method's of this repeat"
                if run.outcome == "unavailable":
                    unavailable.add(run.method)
                result.runs.append(run)
    result.runs.sort(key=lambda r: (config.methods.index(r.method), r.repeat))
    for s in result.summary():
        if s["ok_runs"] < s["runs"]:
            result.notes.append(
                f"{s['label']}: {s['runs'] - s['ok_runs']} of {s['runs']} runs "
                f"{'/'.join(o for o in s['outcomes'] if o != 'ok')}: " + " | ".join(s["errors"])
            )
    return result


# --- reporting ------------------------------------------------------------------------


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
