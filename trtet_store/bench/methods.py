"""The measuring harness: one method, one repeat, measured (:func:`run_method`)."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trtet_store.bench.config import (
    CONSUMING,
    METHOD_LABELS,
    PTE_NAME,
    BenchConfig,
    ProgressFn,
    format_size,
    phase_progress,
)
from trtet_store.bench.measure import (
    PeakDiskMonitor,
    bytes_written,
    current_rss_bytes,
    device_bytes_written,
    peak_rss_bytes,
    reset_peak_rss,
    syncfs,
)
from trtet_store.bench.results import BenchFilesystem, RunResult
from trtet_store.io.options import Progress
from trtet_store.io.units import MiB


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
    from trtet_store.export import _executorch_private as priv

    program.save(os.fspath(out / PTE_NAME))
    if priv.ptd_cords(program):
        program.write_tensor_data_to_file(os.fspath(out))


def _trtet_save(
    program: Any,
    out: Path,
    *,
    consume: bool,
    placements: set[str] | None,
    chunk_size: int | None,
    progress: Callable[[Progress], None],
) -> list[Any]:
    """trtet_store's write of the ``.pte`` and its ``.ptd`` files, one transaction."""
    from trtet_store.export.executorch import save_program

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


def set_cached(paths: Sequence[Path], cached: bool) -> None:
    """Read ``paths`` into the page cache, or write them back and drop them from it.

    Dropping also drops the loop image each path is on (see
    :func:`trtet_store.testing.loopfs.backing_image`): otherwise an "uncached"
    source is read from the image's pages in memory, about 5x as fast as
    from the disk (1 GiB: 0.2 s against 0.6 s).
    """
    from trtet_store.testing import loopfs

    images = set()
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
                images.add(loopfs.backing_image(path))
        finally:
            os.close(fd)
    for image in images - {None}:
        fd = os.open(image, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # the loop device's writes, so that every page can go
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_method(
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

    progress = phase_progress(progress)  # either shape; (phase, done, total) below
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
    set_cached(sources, config.cached_sources)
    use_syncfs = fs.fstype == "btrfs"
    capture = _LogCapture()
    reports: list[Any] = []
    mon = PeakDiskMonitor(fs.path, use_syncfs=use_syncfs)
    syncs = _SyncCounter(io_fs.calls)
    with mon, syncs:
        rss_before = current_rss_bytes()
        result.rss_reset = reset_peak_rss()
        io_before = bytes_written()
        dev_before = device_bytes_written(fs.path)
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

                def step(update: Progress) -> None:
                    mon.sample()
                    if progress:
                        progress(label, update.done, update.total)

                reports = _trtet_save(
                    program,
                    out,
                    consume=method in CONSUMING,
                    # An insert is a kind of move: the writer only considers
                    # payloads it may move for it.
                    placements={"insert", "move"} if method == "insert" else {method},
                    chunk_size=config.effective_chunk_size,
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
        result.bytes_written = bytes_written() - io_before
        dev_after = device_bytes_written(fs.path)
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
