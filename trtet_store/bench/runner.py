"""Running the benchmark: :func:`run_bench`, its groups of methods, and the environment."""

from __future__ import annotations

import gc
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from trtet_store.bench.config import (
    CONSUMING,
    BenchConfig,
    BenchError,
    ProgressFn,
    format_size,
    phase_progress,
)
from trtet_store.bench.methods import run_method
from trtet_store.bench.program import build_program, stage_payloads
from trtet_store.bench.results import BenchFilesystem, BenchResult, RunResult
from trtet_store.bench.where import bench_filesystem, space_needed


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
    except Exception:  # pragma: no cover - psutil is in the bench extra
        pass
    return env


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
        progress: Called with a :class:`BenchProgress` (``.phase``,
            ``.done``, ``.total`` bytes) while staging and writing; the CLI
            draws tqdm bars from it. A callable that needs three positional
            arguments is still called ``progress(phase, done, total)`` (for
            one release; see :func:`~trtet_store.bench.config.phase_progress`).
        filesystem: Measure here instead of making a filesystem (a test's
            mount, say); ``config.filesystem`` and ``fs_size`` are then ignored.

    Returns:
        The result; a method that fails is recorded with its outcome, not raised.

    Raises:
        BenchError: The filesystem could not be set up.
        ValueError: An invalid configuration.
    """
    config.validate()
    progress = phase_progress(progress)  # one shape below: (phase, done, total)
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
    min_free, max_free = space_needed(config)
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
        blobs = stage_payloads(store, config, rep, report)
        program = build_program(
            blobs, layout=config.layout, segment_alignment=config.segment_alignment
        )
        sources = [Path(b.path) for b in blobs]
        del blobs  # the program holds them now
        runs = [run_method(m, program, fs, config, rep, progress, sources) for m in methods]
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
            f"{fs.fstype}: the kernel's copy shares (reflinks) block-aligned extents "
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
