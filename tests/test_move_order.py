"""The move's system calls, in order: no source byte is truncated while its copy is only cached.

Invariant 1 (fdatasync(destination) before ftruncate(source)) checked on the
calls themselves, on the real filesystems: every truncation of a source must
follow an fdatasync of the destination that came after the last write to it.
A power cut can only catch a wrong order when the journal happens to commit
the truncation before the destination's writeback ends (write-behind makes
that window short), so the order is checked here directly, as well as by
tests/test_crash_powercut.py. Also: one fdatasync per step, and the sync
count and peak the budget promises.
"""

from __future__ import annotations

import os

import pytest
from digests import digest, file_digest
from faults import WrappedCalls

from trtet_store import BlobStore, write_file
from trtet_store.io import fs, transfer
from trtet_store.io.units import MiB


class Recorder(WrappedCalls):
    """Records ``(name, fd)`` of every engine call (fd: the first argument, if an int)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            self.calls.append((name, args[0] if args and isinstance(args[0], int) else None))
            return real(*args, **kwargs)

        return call


def _blob(store: BlobStore, size: int):
    with store.writer() as w:
        w.write(os.urandom(size))
    return w.blob


def _check_order(calls: list[tuple[str, int | None]], src_fd: int, dst_fd: int) -> int:
    """Assert invariant 1 on a call trace; return the number of source truncations."""
    dirty = False
    truncations = 0
    for name, fd in calls:
        if fd == dst_fd and name in ("pwrite", "fallocate", "copy_file_range"):
            dirty = True
        elif fd == dst_fd and name in ("fdatasync", "fsync"):
            dirty = False
        elif name == "ftruncate" and fd == src_fd:
            assert not dirty, "a source was truncated while its copy was only in the page cache"
            truncations += 1
    return truncations


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "btrfs", "tmpfs"])
def test_every_truncation_follows_a_sync_of_what_was_written(make_fs, fstype):
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    size = 20 * MiB + 12345  # five whole steps of 4 MiB, then a partial one
    blob = _blob(store, size)
    want = file_digest(blob.path)
    budget = 8 * MiB
    step = transfer.move_step(budget, blob.chunk_size)
    assert step == 4 * MiB
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        with Recorder() as rec:
            moved = transfer.move(src, dst, 100, size, step=step, digests=blob.chunk_digests,
                                  digest_chunk=blob.chunk_size, src_path=blob.path)
        assert moved == size
        steps = -(-size // step)
        assert _check_order(rec.calls, src, dst) == steps
        # One sync per step, and only of the destination.
        syncs = [fd for name, fd in rec.calls if name in ("fdatasync", "fsync")]
        assert syncs == [dst] * steps
        assert os.fstat(src).st_size == 0
    finally:
        os.close(dst)
        os.close(src)
    with open(mnt / "out.bin", "rb") as f:
        f.seek(100)
        assert digest(f.read()) == want
    store.close()


def test_a_write_keeps_the_order_and_the_budget(make_fs):
    # Through the writer: its step comes from chunk_size (two steps of half).
    mnt = make_fs("ext4", 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    blob = _blob(store, 48 * MiB)
    with Recorder() as rec:
        report = write_file(mnt / "m.pte", [b"h" * 100, blob], consume=True,
                            placements={"move"}, chunk_size=16 * MiB)
    assert [p.placement for p in report.placements] == ["move"]
    truncations = [c for c in rec.calls if c[0] == "ftruncate"]
    # The temp file's pre-sizing, then six steps of 8 MiB.
    assert len(truncations) == 1 + 6
    store.close()


def _check_unmove_order(calls: list[tuple[str, int | None]], src_fd: int, dst_fd: int) -> int:
    """Assert the rollback's order on a call trace; return the number of punches.

    Every punch of the destination (fallocate) must follow an fdatasync of
    the source that came after the last write to it: the bytes given back
    are durable in the source before their only other copy is freed.
    """
    dirty = False
    punches = 0
    for name, fd in calls:
        if fd == src_fd and name in ("pwrite", "fallocate", "copy_file_range"):
            dirty = True
        elif fd == src_fd and name in ("fdatasync", "fsync"):
            dirty = False
        elif name == "fallocate" and fd == dst_fd:
            assert not dirty, "a moved copy was freed while the source held its bytes only cached"
            punches += 1
    return punches


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_every_punch_of_a_rollback_follows_a_sync_of_the_source(make_fs, fstype):
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    size = 20 * MiB + 12345
    blob = _blob(store, size)
    want = file_digest(blob.path)
    step = transfer.move_step(8 * MiB, blob.chunk_size)
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        transfer.move(src, dst, 100, size, step=step, digests=blob.chunk_digests,
                      digest_chunk=blob.chunk_size, src_path=blob.path)
        assert os.fstat(src).st_size == 0
        with Recorder() as rec:
            restored = transfer.unmove(src, dst, 100, size, step=step,
                                       digests=blob.chunk_digests, digest_chunk=blob.chunk_size,
                                       dst_path=os.fspath(mnt / "out.bin"), src_path=blob.path)
        assert restored == size
        assert _check_unmove_order(rec.calls, src, dst) == -(-size // step)
    finally:
        os.close(dst)
        os.close(src)
    assert file_digest(blob.path) == want
    store.close()
