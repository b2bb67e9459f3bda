"""Measurement helpers for tests and benchmarks: peak extra disk, bytes written, peak RSS.

Standard library only (Linux), so that the storage engine's tests can measure
without importing torch or executorch.

The disk figures follow one method:
quiesce before reading the start value, poll ``statvfs`` from a thread and
also sample after each step, and report start-minus-minimum free space plus
the extra left after a final sync. Measure on a small dedicated filesystem:
on a shared one, other processes' writes show up as yours.
"""

from __future__ import annotations

import ctypes
import errno
import multiprocessing
import os
import resource
import shutil
import subprocess
import threading
import time
from types import TracebackType

__all__ = [
    "FreeSpaceDipPoller",
    "PeakDiskMonitor",
    "bytes_written",
    "cached_bytes",
    "current_rss_bytes",
    "drop_caches",
    "free_bytes",
    "device_bytes_written",
    "device_io",
    "drop_file_pages",
    "io_counters",
    "peak_rss_bytes",
    "quiesce",
    "reset_peak_rss",
    "syncfs",
]

_libc: ctypes.CDLL | None = None


def _get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Return the bytes an unprivileged user may still allocate on ``path``'s filesystem.

    Args:
        path: Any file or directory on the filesystem.

    Returns:
        ``f_bavail * f_frsize`` from ``statvfs``. This is what a writer can
        really use; ``f_bfree`` would count ext4's root-reserved blocks.
    """
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def cached_bytes(path: str | os.PathLike[str]) -> int:
    """Return how many bytes of the file ``path`` are in the page cache.

    Read with util-linux's ``fincore`` (``mincore(2)`` on a mapping, which
    faults nothing in).

    Raises:
        FileNotFoundError: ``fincore`` is not installed (Debian and Ubuntu:
            ``apt-get install util-linux-extra``).
    """
    tool = shutil.which("fincore")
    if tool is None:
        raise FileNotFoundError(errno.ENOENT, "fincore is missing (Debian and Ubuntu: "
                                "apt-get install util-linux-extra)", "fincore")
    out = subprocess.run([tool, "--bytes", "--noheadings", "--output", "RES", os.fspath(path)],
                         check=True, capture_output=True, text=True)
    return int(out.stdout.strip())


def syncfs(path: str | os.PathLike[str]) -> None:
    """Flush the one filesystem holding ``path`` (``syncfs(2)``).

    Cheaper than ``os.sync()`` when other filesystems are busy, and on btrfs
    it commits the transaction, without which ``statvfs`` lags behind.

    Args:
        path: Any file or directory on the filesystem to flush.

    Raises:
        OSError: If the path cannot be opened or ``syncfs`` fails.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _get_libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}", os.fspath(path))
    finally:
        os.close(fd)


def _write_proc(path: str, text: str) -> bool:
    """Write ``text`` to a ``/proc`` control file; False if it is not writable here."""
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(text)
    except OSError:
        return False
    return True


def drop_caches(path: str | os.PathLike[str] | None = None) -> bool:
    """Flush dirty data and drop the page cache, so reads hit the device.

    Args:
        path: If given, also ``syncfs`` this filesystem (btrfs needs it for
            ``statvfs`` to be current).

    Returns:
        True if the caches were dropped; False if ``/proc/sys/vm/drop_caches``
        is not writable here (not root, read-only /proc). The sync happens either way.
    """
    os.sync()
    if path is not None:
        syncfs(path)
    return _write_proc("/proc/sys/vm/drop_caches", "3\n")


def _quiesce(
    path: str | os.PathLike[str],
    *,
    polls: int,
    interval: float,
    timeout: float,
) -> tuple[int, bool]:
    # Only the measured filesystem is flushed: a global sync would also wait
    # for unrelated writeback (other tests on the root disk) and skew timings.
    try:
        syncfs(path)
    except OSError:
        os.sync()
    deadline = time.monotonic() + timeout
    last = free_bytes(path)
    same = 1
    while same < polls:
        if time.monotonic() >= deadline:
            return last, False
        time.sleep(interval)
        now = free_bytes(path)
        same = same + 1 if now == last else 1
        last = now
    return last, True


def quiesce(
    path: str | os.PathLike[str],
    *,
    polls: int = 5,
    interval: float = 0.02,
    timeout: float = 10.0,
) -> int:
    """Flush the filesystem (``syncfs``), then wait until its free space stops changing.

    Args:
        path: Any file or directory on the filesystem.
        polls: Number of consecutive equal ``statvfs`` readings that count as stable.
        interval: Seconds between readings.
        timeout: Give up waiting after this many seconds and return the last reading.

    Returns:
        Free bytes (see :func:`free_bytes`) once stable, or the last reading on timeout.
    """
    free, _settled = _quiesce(path, polls=polls, interval=interval, timeout=timeout)
    return free


def _poll_without_pause(path: str, ready, stop, out) -> None:
    base = free_bytes(path)
    worst = 0
    ready.set()
    while not stop.is_set():
        worst = max(worst, base - free_bytes(path))
    out.put(worst)


class FreeSpaceDipPoller:
    """The largest drop of free space below its first reading, polled without pause.

    :class:`PeakDiskMonitor` samples every few milliseconds in a thread of the
    measured process; a reservation held for microseconds (XFS's, while it
    remaps an extent) slips between its samples. This reads ``statvfs`` in a
    loop in a process of its own, so it shares no GIL with the code measured.

    Example::

        with FreeSpaceDipPoller(mnt) as dip:
            clone(...)
        print(dip.worst_bytes)

    Args:
        path: A file or directory on the filesystem to watch.

    Attributes:
        worst_bytes: The largest drop seen, known once the block has exited.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.worst_bytes: int | None = None
        ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._ready, self._stop, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._process = ctx.Process(target=_poll_without_pause, daemon=True,
                                    args=(self.path, self._ready, self._stop, self._out))

    def __enter__(self) -> FreeSpaceDipPoller:
        self._process.start()
        if not self._ready.wait(60):
            self._process.kill()
            raise RuntimeError(f"the free-space poller of {self.path} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.worst_bytes = self._out.get(timeout=60)
        self._process.join(60)


class PeakDiskMonitor:
    """Record how much extra disk space a piece of code takes on one filesystem, at its peak.

    On entry the filesystem is flushed (``syncfs``) and quiesced, and its free
    space read as the start value. A background thread then polls ``statvfs``
    every ``interval`` seconds, and callers should call :meth:`sample` after each step so that
    short peaks between polls are not missed. On exit one last sample is
    taken, the filesystem is synced and quiesced again, and the extra space
    still in use is recorded.

    Example::

        with PeakDiskMonitor(mnt) as mon:
            for chunk in chunks:
                f.write(chunk)
                mon.sample()
        print(mon.peak_extra_bytes, mon.extra_after_bytes)

    Args:
        path: A file or directory on the filesystem to watch.
        interval: Seconds between background polls (default 2 ms).
        use_syncfs: Call ``syncfs`` before each :meth:`sample` (the start and
            end readings always sync the filesystem). Needed on btrfs, whose
            ``statvfs`` lags until a transaction commits. The background poll never syncs, since
            syncing every few milliseconds would throttle the writer and
            change the very behaviour being measured.
        settle_polls: Consecutive equal readings that count as quiesced.
        settle_interval: Seconds between quiesce readings.
        settle_timeout: Longest wait for quiescence, in seconds.

    Attributes:
        start_free_bytes: Free bytes at the start, after quiescing.
        end_free_bytes: Free bytes at the end, after the final sync.
        settled: Whether both start and end readings were stable before the timeout.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval: float = 0.002,
        use_syncfs: bool = False,
        settle_polls: int = 5,
        settle_interval: float = 0.02,
        settle_timeout: float = 10.0,
    ) -> None:
        self.path = os.fspath(path)
        self.interval = interval
        self.use_syncfs = use_syncfs
        self._settle = {
            "polls": settle_polls,
            "interval": settle_interval,
            "timeout": settle_timeout,
        }
        self.start_free_bytes: int | None = None
        self.end_free_bytes: int | None = None
        self.settled = False
        self._min_free: int | None = None
        self._last_polled: int | None = None
        self._timeline: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._poll_error: BaseException | None = None
        self._t0 = 0.0
        self._entered = False

    def __enter__(self) -> PeakDiskMonitor:
        if self._entered:
            raise RuntimeError("a PeakDiskMonitor can only be entered once")
        self._entered = True
        start, settled = _quiesce(self.path, **self._settle)
        self.start_free_bytes = start
        self.settled = settled
        self._min_free = start
        self._last_polled = start
        self._t0 = time.perf_counter()
        self._timeline.append((0.0, 0))
        self._thread = threading.Thread(
            target=self._poll, name=f"PeakDiskMonitor({self.path})", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # The state at exit, before any sync, may be the peak itself.
        self.sample()
        end, settled = _quiesce(self.path, **self._settle)
        self.settled = self.settled and settled
        self.end_free_bytes = end
        # After the sync a lagging filesystem (btrfs) may only now show space
        # that was in use all along, so this reading also counts toward the peak.
        self._record(end, always=True)
        if self._poll_error is not None and exc_type is None:
            raise RuntimeError("PeakDiskMonitor polling failed") from self._poll_error

    def _poll(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._record(free_bytes(self.path), always=False)
        except BaseException as err:  # handed to the caller in __exit__
            self._poll_error = err

    def _record(self, free: int, *, always: bool) -> None:
        assert self.start_free_bytes is not None and self._min_free is not None
        t = time.perf_counter() - self._t0
        with self._lock:
            if free < self._min_free:
                self._min_free = free
            # Polls only log changes so a long run does not hoard memory; a
            # step plot of the timeline loses nothing by it.
            if always or free != self._last_polled:
                self._timeline.append((t, self.start_free_bytes - free))
            if not always:
                self._last_polled = free

    def sample(self) -> int:
        """Read the free space now and record it (call after each step).

        Returns:
            Extra bytes in use now, relative to the start (negative if space was freed).

        Raises:
            RuntimeError: If the monitor has not been entered.
        """
        if self.start_free_bytes is None:
            raise RuntimeError("PeakDiskMonitor.sample() called outside its with block")
        if self.use_syncfs:
            syncfs(self.path)
        free = free_bytes(self.path)
        self._record(free, always=True)
        return self.start_free_bytes - free

    @property
    def peak_extra_bytes(self) -> int:
        """Start free bytes minus the least free bytes seen so far (never negative)."""
        if self.start_free_bytes is None or self._min_free is None:
            raise RuntimeError("PeakDiskMonitor has not been entered")
        with self._lock:
            return self.start_free_bytes - self._min_free

    @property
    def extra_after_bytes(self) -> int:
        """Extra bytes still in use after the final sync (negative if space was freed)."""
        if self.start_free_bytes is None or self.end_free_bytes is None:
            raise RuntimeError("extra_after_bytes is only known after the with block")
        return self.start_free_bytes - self.end_free_bytes

    @property
    def timeline(self) -> list[tuple[float, int]]:
        """``(seconds since start, extra bytes)`` points in time order, for plotting."""
        with self._lock:
            return sorted(self._timeline)


def io_counters(pid: int | None = None) -> dict[str, int]:
    """Return the I/O accounting fields of ``/proc/<pid>/io``.

    Args:
        pid: Process to read; ``None`` for this process (all its threads).

    Returns:
        A mapping such as ``{"rchar": ..., "write_bytes": ...,
        "cancelled_write_bytes": ...}``.
    """
    where = "self" if pid is None else str(pid)
    counters: dict[str, int] = {}
    with open(f"/proc/{where}/io", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            counters[key.strip()] = int(value)
    return counters


def bytes_written(pid: int | None = None) -> int:
    """Return ``write_bytes`` from ``/proc/<pid>/io``: bytes this process caused to be stored.

    The kernel counts a page when it is dirtied, so no sync is needed to see
    it; pages truncated before writeback are counted again under
    ``cancelled_write_bytes`` (see :func:`io_counters`). tmpfs always
    reports 0. Take the difference of two calls around the code measured.

    Args:
        pid: Process to read; ``None`` for this process. Children are not included.

    Returns:
        The cumulative ``write_bytes`` counter.
    """
    return io_counters(pid)["write_bytes"]


def device_bytes_written(path: str | os.PathLike[str]) -> int | None:
    """Bytes written so far by the block device under ``path`` (a loop device), or None."""
    from trtet_store.testing import loopfs

    source = loopfs.mount_source(path)
    if not source or not source.startswith("/dev/"):
        return None
    try:
        with open(f"/sys/block/{os.path.basename(source)}/stat") as f:
            return int(f.read().split()[6]) * 512  # sectors written
    except (OSError, IndexError, ValueError):
        return None


def device_io(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(bytes read, bytes written)`` so far by the block device mounted at ``path``, or None.

    From ``/sys/block/<dev>/stat`` (sectors of 512 bytes): what reached the
    device, from any process or kernel thread (writeback, a child process),
    which ``/proc/self/io`` of one process does not see. Sync first to count
    writes still dirty in the page cache.
    """
    from trtet_store.testing import loopfs

    source = loopfs.mount_source(path)
    if not source or not source.startswith("/dev/"):
        return None
    try:
        with open(f"/sys/block/{os.path.basename(source)}/stat", encoding="ascii") as f:
            fields = f.read().split()
        return int(fields[2]) * 512, int(fields[6]) * 512
    except (OSError, IndexError, ValueError):
        return None


def drop_file_pages(path: str | os.PathLike[str]) -> None:
    """Flush ``path``'s filesystem and drop every file's cached pages under it.

    ``syncfs``, then ``posix_fadvise(DONTNEED)`` per regular file: the next
    read of any of them reaches the device, and other filesystems' caches
    (other processes' work on a shared machine) are left alone, as a global
    ``drop_caches`` would not.
    """
    syncfs(path)
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW
                             | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:  # removed meanwhile, a socket, a link
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def return_freed_buffers(threshold: int = 1 << 20) -> bool:
    """Make glibc give large freed buffers back to the kernel at once.

    glibc raises its mmap threshold to the size of each large block freed, so a
    later buffer of that size comes from the heap and stays resident after
    ``free``: a peak-RSS growth measured after an earlier run then reuses that
    run's pages and reads small. A fixed threshold (here 1 MiB) maps every
    larger block on its own and unmaps it when freed, so each measurement sees
    only what is live in it.

    Parameters
    ----------
    threshold : int
        Blocks of at least this many bytes are mapped on their own.

    Returns
    -------
    bool
        True if glibc took the setting; False elsewhere (no glibc ``mallopt``).
    """
    try:
        return bool(_get_libc().mallopt(_M_MMAP_THRESHOLD, threshold))
    except (AttributeError, OSError):
        return False


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS so :func:`peak_rss_bytes` measures from now.

    Returns:
        True if the kernel accepted the reset (``/proc/self/clear_refs``),
        False if it is unavailable, in which case the peak stays the one since
        process start.
    """
    return _write_proc("/proc/self/clear_refs", "5")


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (such as ``VmRSS``) in bytes, or None."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Return this process's peak resident set size in bytes.

    Reads ``VmHWM`` from ``/proc/self/status``, which :func:`reset_peak_rss`
    can reset between phases; falls back to ``getrusage`` (peak since start).

    Returns:
        Peak RSS in bytes.
    """
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Return this process's resident set size now (``VmRSS``), in bytes; 0 if unknown."""
    rss = _status_bytes("VmRSS")
    return 0 if rss is None else rss
