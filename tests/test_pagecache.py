"""Write-behind and drop-behind: staged blobs leave the page cache, and nothing is lost.

Residency is read with :func:`trtet_store.bench.measure.cached_bytes` (``fincore``) on
real loop-mounted filesystems and tmpfs.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest
import xxhash
from digests import file_digest
from faults import FaultInjector
from filesystems import unavailable

from trtet_store import BlobStore, write_file
from trtet_store.bench import measure
from trtet_store.io import fs, pagecache
from trtet_store.io.units import MiB


def resident(path: os.PathLike | str) -> int:
    """Bytes of ``path`` in the page cache."""
    if shutil.which("fincore") is None:
        unavailable("fincore is missing (apt-get install util-linux-extra)")
    return measure.cached_bytes(path)


def write_blob(store: BlobStore, size: int, seen: list[int] | None = None):
    """Stream ``size`` pseudo-random bytes in 1 MiB writes; returns (blob, xxh3-128 digest)."""
    block = os.urandom(MiB)
    h = xxhash.xxh3_128()
    with store.writer() as w:
        for i in range(size // MiB):
            piece = i.to_bytes(8, "little") + block[8:]
            w.write(piece)
            h.update(piece)
            if seen is not None:
                seen.append(resident(w._part))
    return w.blob, h.hexdigest()


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "btrfs"])
def test_a_staged_blob_leaves_the_page_cache_as_it_is_written(make_fs, fstype):
    root = make_fs(fstype, 512)
    seen: list[int] = []
    with BlobStore(root / "staging") as store:
        blob, digest = write_blob(store, 64 * MiB, seen)
        # The window being filled, the one being written back, and the write
        # in flight: never the whole blob.
        assert max(seen) <= 2 * pagecache.WINDOW + MiB, seen
        assert resident(blob.path) == 0
        assert blob.digest == digest == file_digest(blob.path)


@pytest.mark.parametrize("fstype,size_mib,drop_behind", [
    ("ext4", 32, False),  # asked for
    # Waiting for a small blob's writeback would cost more than its pages.
    ("ext4", 4, True),
    # tmpfs pages are the file: dropping must not (and cannot) discard them.
    ("tmpfs", 40, True),
], ids=["drop_behind-off", "smaller-than-a-window", "tmpfs"])
def test_blobs_left_cached_are_intact(make_fs, fstype, size_mib, drop_behind):
    root = make_fs(fstype, 128)
    with BlobStore(root / "staging", drop_behind=drop_behind) as store:
        blob, digest = write_blob(store, size_mib * MiB)
        assert resident(blob.path) == size_mib * MiB
        assert file_digest(blob.path) == digest == blob.digest


def test_adopt_drops_the_adopted_file_once_digested(make_fs):
    root = make_fs("ext4", 256)
    src = root / "engine.bin"
    data = os.urandom(24 * MiB)
    src.write_bytes(data)  # dirty: adopt has to write it back to drop it
    assert resident(src) == len(data)
    with BlobStore(root / "staging") as store:
        blob = store.adopt(src)
        assert resident(blob.path) == 0
        assert blob.digest == xxhash.xxh3_128_hexdigest(data) == file_digest(blob.path)


@pytest.mark.parametrize("call", ["sync_file_range", "fadvise"])
def test_a_writeback_error_fails_the_writer_and_leaves_nothing(make_fs, call):
    # sync_file_range consumes the file's error state: a later fsync would not
    # report the lost pages, so the writer must.
    root = make_fs("ext4", 256)
    staging = root / "staging"
    with BlobStore(staging) as store:
        before = sorted(p.name for p in staging.iterdir())
        with FaultInjector(fail_at=1, only=frozenset({call})) as inj, \
                pytest.raises(OSError) as info:
            write_blob(store, 32 * MiB)
        assert inj.fired == call
        assert info.value.errno == errno.EIO
        assert sorted(p.name for p in staging.iterdir()) == before
        assert store.blobs() == []


def test_a_file_that_cannot_write_behind_is_written_normally(make_fs, monkeypatch):
    root = make_fs("ext4", 256)
    tried = []

    def unsupported(*args):
        tried.append(args)
        raise OSError(errno.ESPIPE, os.strerror(errno.ESPIPE))

    monkeypatch.setattr(fs.calls, "sync_file_range", unsupported)
    with BlobStore(root / "staging") as store:
        blob, digest = write_blob(store, 32 * MiB)
        assert len(tried) == 1  # given up on the first refusal, not retried per window
        assert blob.digest == digest == file_digest(blob.path)


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_a_move_drops_each_synced_step(make_fs, fstype):
    # A move's output leaves the page cache once durable (the copy's stays:
    # its drop would wait for writeback): it holds the steps not yet synced
    # (three at most), never the whole output.
    root = make_fs(fstype, 512)
    header = b"H" * 128
    out = root / "out.bin"
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append(sum(resident(p) for p in root.iterdir() if p.is_file()))

    with BlobStore(root / "staging") as store:
        blob, digest = write_blob(store, 192 * MiB)
        report = write_file(out, [header, blob], consume=True, placements="move",
                            chunk_size=24 * MiB, progress=progress)
        assert [p.placement for p in report.placements] == ["move"]
        assert len(seen) >= 8  # progress comes as the source is cut, a step or a few at a time
        assert max(seen) <= 24 * MiB + 2 * pagecache.WINDOW, seen
        assert resident(out) <= 2 * 4096  # the header's page and the tail's
        with open(out, "rb") as f:
            assert f.read(len(header)) == header
        h = xxhash.xxh3_128()
        with open(out, "rb") as f:
            f.seek(len(header))
            while piece := f.read(8 * MiB):
                h.update(piece)
        assert h.hexdigest() == digest


def test_drop_behind_rejects_a_nonpositive_window():
    with pytest.raises(ValueError, match="window"):
        pagecache.DropBehind(0, window=0)


def test_drop_reports_files_that_cannot_drop():
    r, w = os.pipe()
    try:
        assert pagecache.drop(w, 0, 0) is False
    finally:
        os.close(r)
        os.close(w)
