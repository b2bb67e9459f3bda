"""Where a benchmark runs: a dedicated loop-mounted filesystem (as root), or a temp dir."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trtet_store.bench.config import BenchConfig, BenchError, format_size
from trtet_store.bench.measure import free_bytes, syncfs
from trtet_store.bench.results import BenchFilesystem
from trtet_store.io.units import MiB
from trtet_store.testing import loopfs

log = logging.getLogger("trtet_store.bench")

_SESSION_PREFIX = "trtet-bench-"
_TMPFS_SOURCE = "trtet-bench"


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


def space_needed(config: BenchConfig) -> tuple[int, int | None]:
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
                f"({format_size(low - payload)}, with a {format_size(chunk)} step) are not "
                f"well below the payloads ({format_size(payload)}): give larger payloads, a "
                "smaller --chunk-size, or --fs-size fit"
            )
        return low, high
    return 2 * payload + 2 * chunk + overhead + 16 * MiB, None
