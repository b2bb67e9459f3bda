"""Staging a blob takes its own size on disk, at most one window more, while it is written.

XFS preallocates speculatively past the end of a file that grows by
appending writes, up to the file's size again, and trims it only at close:
staging 1 GiB with ``BlobStore.writer()`` on XFS peaked at 1.8-2 GiB used.
The writer allocates each window before writing it, so nothing is
preallocated beyond it. Measured with statvfs polled (and sampled after each
write) while the blob is written.
"""

from __future__ import annotations

import errno
import os

import pytest
from digests import digest

from trtet_store import BlobStore
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.io import fs, pagecache
from trtet_store.io.units import GiB, MiB


def _stage(store: BlobStore, size: int, piece: bytes, mon: PeakDiskMonitor | None = None):
    with store.writer() as w:
        left = size
        while left:
            n = min(left, len(piece))
            w.write(piece[:n])
            left -= n
            if mon is not None:
                mon.sample()
    return w.blob


@pytest.mark.parametrize("fstype", ["xfs", "ext4"])
def test_staging_1_gib_peaks_at_most_one_window_over_its_size(make_fs, fstype):
    mnt = make_fs(fstype, 3072)  # room for the doubling this guards against
    store = BlobStore(mnt / "staging")
    # Writes that are no divisor of the window, so windows and writes interleave.
    piece = os.urandom(3 * MiB + 5 * 4096)
    with PeakDiskMonitor(mnt) as mon:
        blob = _stage(store, GiB, piece, mon)
    assert blob.size == GiB
    assert os.stat(blob.path).st_size == GiB
    # The blob and its sidecar stay; nothing more.
    assert mon.extra_after_bytes < GiB + MiB
    assert mon.peak_extra_bytes <= GiB + pagecache.WINDOW, (
        f"{fstype}: staging 1 GiB peaked at {mon.peak_extra_bytes / MiB:.1f} MiB used")
    store.close()


def test_the_window_allocated_past_the_last_byte_is_cut_off(here_fs):
    store = BlobStore(here_fs / "s")
    data = os.urandom(pagecache.WINDOW + 12345)
    with store.writer() as w:
        w.write(data[:100])
        w.write(data[100:])
    assert os.stat(w.blob.path).st_size == len(data)
    assert digest(w.blob.path.read_bytes()) == digest(data)
    assert w.blob.size == len(data)
    store.close()


def test_a_blob_that_fits_is_staged_though_its_last_window_would_not(make_fs):
    # tmpfs: root has no reserve there to dip into, so free space is exact.
    mnt = make_fs("tmpfs", 64)
    store = BlobStore(mnt / "s")
    window = pagecache.WINDOW
    # Leave free a whole number of windows and 3 MiB; stage those windows and 1 MiB:
    # the last window allocated would end 5 MiB past the free space.
    filler = (fs.free_bytes(mnt) - 3 * MiB) % window
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, filler)
    free = fs.free_bytes(mnt)
    assert free % window == 3 * MiB
    size = free - 2 * MiB
    data = os.urandom(MiB)
    blob = _stage(store, size, data)
    assert os.stat(blob.path).st_size == size
    with open(blob.path, "rb") as f:
        f.seek(size - MiB)
        assert f.read() == data
    store.close()


def test_a_blob_that_does_not_fit_fails_before_its_bytes_and_leaves_no_file(make_fs):
    mnt = make_fs("tmpfs", 64)
    store = BlobStore(mnt / "s")
    size = fs.free_bytes(mnt) + MiB
    with pytest.raises(OSError) as err:
        _stage(store, size, os.urandom(MiB))
    assert err.value.errno == errno.ENOSPC
    assert sorted(p.name for p in store.directory.iterdir()
                  if not p.name.startswith(".store-")) == []
    assert fs.free_bytes(mnt) > 60 * MiB
    store.close()
