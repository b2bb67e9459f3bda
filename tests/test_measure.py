"""trtet_store.bench.measure against real filesystems: the numbers it reports are the disk's."""

from __future__ import annotations

import os
import threading
import time

import pytest
from filesystems import drop_caches, unavailable

from trtet_store.bench.measure import (
    PeakDiskMonitor,
    bytes_written,
    free_bytes,
    io_counters,
    peak_rss_bytes,
    quiesce,
    reset_peak_rss,
    syncfs,
)
from trtet_store.io.units import MiB

CHUNK = b"\xa5" * MiB


def _write(path, mib, mon=None, *, fsync=True):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(CHUNK)
            if mon is not None:
                mon.sample()
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def test_ext4_write_then_delete(make_fs):
    mnt = make_fs("ext4", 256)
    with PeakDiskMonitor(mnt) as mon:
        _write(mnt / "blob", 64, mon)
        mon.sample()
        os.unlink(mnt / "blob")
        mon.sample()

    assert mon.settled
    assert mon.peak_extra_bytes >= 60 * MiB
    # Never double. During fsync's writeback the 2 ms poll regularly catches
    # ext4's mballoc preallocation (8 MiB here) before it is trimmed: 72 MiB.
    assert mon.peak_extra_bytes <= 80 * MiB
    assert abs(mon.extra_after_bytes) <= 64 * 1024
    assert mon.start_free_bytes == pytest.approx(free_bytes(mnt), abs=64 * 1024)

    times = [t for t, _ in mon.timeline]
    assert times == sorted(times) and times[0] == 0.0
    assert max(extra for _, extra in mon.timeline) == mon.peak_extra_bytes


def test_ext4_extra_after_counts_what_stays(make_fs):
    mnt = make_fs("ext4", 256)
    with PeakDiskMonitor(mnt) as mon:
        _write(mnt / "kept", 32, mon, fsync=False)
    assert 32 * MiB <= mon.extra_after_bytes <= 34 * MiB
    assert mon.peak_extra_bytes >= mon.extra_after_bytes


def test_background_poll_sees_peak_without_samples(make_fs):
    """A peak that no sample() catches is still seen by the 2 ms poll."""
    mnt = make_fs("ext4", 256)
    with PeakDiskMonitor(mnt) as mon:
        _write(mnt / "blob", 64)
        time.sleep(0.05)  # several poll intervals
        os.unlink(mnt / "blob")
    assert mon.peak_extra_bytes >= 60 * MiB
    assert abs(mon.extra_after_bytes) <= 64 * 1024
    # The poll only logs changes, so the timeline holds a handful of points.
    assert 2 <= len(mon.timeline) < 1000


@pytest.mark.parametrize(("fstype", "size"), [("xfs", 300), ("tmpfs", 128)])
def test_other_filesystems_write_then_delete(make_fs, fstype, size):
    mnt = make_fs(fstype, size)
    with PeakDiskMonitor(mnt) as mon:
        _write(mnt / "blob", 64, mon)
        os.unlink(mnt / "blob")
        mon.sample()
    assert mon.peak_extra_bytes >= 60 * MiB
    assert abs(mon.extra_after_bytes) <= 256 * 1024


def test_btrfs_needs_syncfs_to_be_current(make_fs):
    mnt = make_fs("btrfs", 512)
    with PeakDiskMonitor(mnt, use_syncfs=True) as mon:
        _write(mnt / "blob", 64, fsync=False)
        during = mon.sample()
        os.unlink(mnt / "blob")
        mon.sample()
    assert during >= 60 * MiB
    assert mon.peak_extra_bytes >= 60 * MiB
    assert abs(mon.extra_after_bytes) <= 1 * MiB


def test_btrfs_lag_is_counted_after_the_final_sync(make_fs):
    """Without syncfs, the post-exit sync still surfaces space used inside the block."""
    mnt = make_fs("btrfs", 512)
    with PeakDiskMonitor(mnt) as mon:
        _write(mnt / "kept", 64, fsync=False)
    assert mon.extra_after_bytes >= 60 * MiB
    assert mon.peak_extra_bytes >= mon.extra_after_bytes


def test_quiesce_and_syncfs(make_fs):
    mnt = make_fs("ext4", 64)
    before = quiesce(mnt)
    _write(mnt / "f", 8, fsync=False)
    syncfs(mnt)
    assert before - quiesce(mnt) >= 8 * MiB
    with pytest.raises(OSError):
        syncfs(mnt / "missing")


def test_monitor_misuse(here_fs):
    mon = PeakDiskMonitor(here_fs)
    with pytest.raises(RuntimeError):
        mon.sample()
    with pytest.raises(RuntimeError):
        _ = mon.extra_after_bytes
    with mon, pytest.raises(RuntimeError):
        _ = mon.extra_after_bytes
    with pytest.raises(RuntimeError), mon:
        pass


def test_monitor_does_not_swallow_errors(here_fs):
    with pytest.raises(KeyError), PeakDiskMonitor(here_fs):
        raise KeyError("boom")


def test_bytes_written_counts_this_process(make_fs):
    mnt = make_fs("ext4", 128)
    before = bytes_written()
    _write(mnt / "f", 16)
    assert bytes_written() - before >= 16 * MiB
    assert set(io_counters()) >= {"write_bytes", "cancelled_write_bytes", "read_bytes"}
    assert bytes_written(os.getpid()) >= bytes_written() - 1  # same process


def test_bytes_written_counts_other_threads(make_fs):
    mnt = make_fs("ext4", 128)
    before = bytes_written()
    t = threading.Thread(target=_write, args=(mnt / "f", 8))
    t.start()
    t.join()
    assert bytes_written() - before >= 8 * MiB


def test_bytes_written_is_zero_on_tmpfs(make_fs):
    mnt = make_fs("tmpfs", 32)
    before = bytes_written()
    _write(mnt / "f", 8)
    assert bytes_written() - before < 1 * MiB


def test_peak_rss_tracks_a_large_allocation():
    if not reset_peak_rss():
        pytest.skip("/proc/self/clear_refs not writable here")
    base = peak_rss_bytes()
    block = bytearray(b"\x01" * (96 * MiB))  # touched, so resident
    assert peak_rss_bytes() - base >= 90 * MiB
    del block
    assert reset_peak_rss()
    assert peak_rss_bytes() < base + 90 * MiB


def test_drop_caches(here_fs):
    (here_fs / "f").write_bytes(b"x" * MiB)
    if not drop_caches(here_fs):
        unavailable("/proc/sys/vm/drop_caches is not writable here")
    assert (here_fs / "f").read_bytes() == b"x" * MiB


def _resident(path) -> int:
    """Bytes of ``path`` in the page cache, by util-linux's fincore (mincore(2))."""
    import subprocess

    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          os.fspath(path)], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[0])


def test_uncached_sources_are_dropped_from_the_loop_image_too(make_fs):
    """A loop device reads its image through the page cache: an 'uncached' source must be
    dropped there too, or the benchmark reads it from memory (about 5x as fast)."""
    from trtet_store.bench.methods import set_cached
    from trtet_store.testing import loopfs

    mnt = make_fs("ext4", 200)
    src = mnt / "source"
    _write(src, 32)
    image = loopfs.backing_image(src)
    assert image is not None and os.path.isfile(image), image
    set_cached([src], True)
    assert _resident(src) == 32 * MiB
    assert _resident(image) >= 32 * MiB  # the loop device read it through the image's cache
    set_cached([src], False)
    assert _resident(src) == 0
    assert _resident(image) < 4 * MiB, _resident(image)
    assert loopfs.backing_image(mnt.parent) is None  # the root disk is no loop device
