"""The move's system calls, in order: no source byte is truncated while its copy is only cached.

Invariant 1 (fdatasync(destination) before ftruncate(source)) checked on the
calls themselves, on the real filesystems: every truncation of a source must
follow an fdatasync of the destination that started after every write of the
bytes it cuts had returned. The move copies the next step while a second
thread syncs and truncates the last one, so calls are recorded with the
instant each started and returned, and the check is per byte range: writes of
the next step may come between a step's sync and its truncation.
A power cut can only catch a wrong order when the journal happens to commit
the truncation before the destination's writeback ends (write-behind makes
that window short), so the order is checked here directly, as well as by
tests/test_crash_powercut.py. Also: at most one fdatasync per step (one
sync covers every step copied since the last, so a slow sync covers
several), and the peak the budget promises.
"""

from __future__ import annotations

import errno
import os
import time

import pytest
from calltrace import Recorder, copied_ahead
from digests import digest, file_digest
from faults import FaultInjector, slow_syncs

from trtet_store import BlobStore, write_file
from trtet_store.io import fs, transfer
from trtet_store.io.errors import VerificationError
from trtet_store.io.units import MiB


def _blob(store: BlobStore, size: int):
    with store.writer() as w:
        w.write(os.urandom(size))
    return w.blob


def _check_order(events: list[dict], src_fd: int, dst_fd: int, dst_offset: int,
                 length: int) -> int:
    """Assert invariant 1 on a timed call trace; return the number of source truncations.

    A truncation of the source from ``length`` to ``L`` needs an fdatasync of
    the destination that returned before the truncation started and started
    after every write of destination bytes ``[dst_offset+L, dst_offset+length)``
    had returned (and no later write of them). Only finished calls count.
    """
    truncations = 0
    for cut in (e for e in events if e["name"] == "ftruncate" and e["args"][0] == src_fd):
        new = cut["args"][1]
        lo, hi = dst_offset + new, dst_offset + length
        syncs = [e for e in events if e["name"] in ("fdatasync", "fsync")
                 and e["args"][0] == dst_fd and e.get("end", cut["start"]) < cut["start"]]
        assert syncs, f"the source was cut to {new} before any sync of the destination"
        synced_from = max(e["start"] for e in syncs)
        covered = []
        for w in events:
            if w["name"] != "pwrite" or w["args"][0] != dst_fd or w["start"] > cut["start"]:
                continue
            w_lo = w["args"][2]
            w_hi = w_lo + (w.get("result") or len(w["args"][1]))
            if w_hi <= lo or w_lo >= hi:
                continue
            assert w.get("end", synced_from) < synced_from, (
                f"the source was cut to {new} while destination bytes [{w_lo}, {w_hi}) "
                "of what it cut were written after the last sync began: only in the page cache")
            covered.append((max(lo, w_lo), min(hi, w_hi)))
        pos = lo
        for a, b in sorted(covered):
            assert a <= pos, f"destination bytes [{pos}, {a}) were never written before the cut"
            pos = max(pos, b)
        assert pos >= hi, f"destination bytes [{pos}, {hi}) were never written before the cut"
        length = new
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
    budget = 12 * MiB  # three steps: the one copied and two not yet cut from the source
    step = transfer.move_step(budget, blob.chunk_size)
    assert step == 4 * MiB
    assert transfer.move_peak(step) <= budget
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        with Recorder() as rec:
            moved = transfer.move(src, dst, 100, size, step=step, digests=blob.chunk_digests,
                                  digest_chunk=blob.chunk_size, src_path=blob.path)
        assert moved == size
        steps = -(-size // step)
        assert 1 <= _check_order(rec.events, src, dst, 100, size) <= steps
        # At most one sync per step, and only of the destination.
        syncs = [fd for name, fd in rec.calls if name in ("fdatasync", "fsync")]
        assert 1 <= len(syncs) <= steps and set(syncs) == {dst}
        assert os.fstat(src).st_size == 0
    finally:
        os.close(dst)
        os.close(src)
    _assert_output(mnt, want)
    store.close()


def test_a_write_keeps_the_order_and_the_budget(make_fs):
    # Through the writer: its step comes from chunk_size (three steps of a third).
    mnt = make_fs("ext4", 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    blob = _blob(store, 48 * MiB)
    with Recorder() as rec:
        report = write_file(mnt / "m.pte", [b"h" * 100, blob], consume=True,
                            placements={"move"}, chunk_size=16 * MiB)
    assert [p.placement for p in report.placements] == ["move"]
    truncations = [c for c in rec.calls if c[0] == "ftruncate"]
    # The temp file's pre-sizing, then at most one cut per step of a third
    # of the budget (5 MiB).
    step = transfer.move_step(16 * MiB, blob.chunk_size)
    assert step == 5 * MiB
    assert 2 <= len(truncations) <= 1 + -(-48 * MiB // step)
    store.close()


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_a_slow_sync_covers_every_step_copied_before_it(make_fs, fstype):
    # Each sync takes 0.2 s more (a loop device's flush to the host's disk
    # can take 60 ms): the caller copies the next steps meanwhile, up to the
    # budget, and one sync then makes all of them durable, instead of one
    # sync per step. Every truncation still follows a sync of what it cuts.
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    size = 40 * MiB
    blob = _blob(store, size)
    want = file_digest(blob.path)
    step = transfer.move_step(12 * MiB, blob.chunk_size)
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        with slow_syncs(0.2), Recorder() as rec:
            assert transfer.move(src, dst, 100, size, step=step, digests=blob.chunk_digests,
                                 digest_chunk=blob.chunk_size, src_path=blob.path) == size
        steps = size // step
        cuts = _check_order(rec.events, src, dst, 100, size)
        syncs = [e for e in rec.events if e["name"] == "fdatasync"]
        # Every step is in some sync, so fewer syncs than steps means one
        # covered more than a step (here about every other one does).
        assert len(syncs) < steps, (len(syncs), steps)
        assert 1 <= cuts <= len(syncs)
        # The copy ran ahead of the syncs, never more than three steps ahead of the cuts.
        assert max(copied_ahead(rec.events, src, dst, 100, size)) <= transfer.move_peak(step)
    finally:
        os.close(dst)
        os.close(src)
    _assert_output(mnt, want)
    store.close()


def _assert_output(mnt, want: str) -> None:
    """``out.bin`` holds, after its 100-byte header, the bytes whose digest is ``want``."""
    with open(mnt / "out.bin", "rb") as f:
        f.seek(100)
        assert digest(f.read()) == want


def _four_steps(make_fs, fstype: str):
    """A new filesystem with a staged blob of 20 MiB + 12345 bytes: the mount, the
    store, the blob, its bytes, and the step of a 12 MiB budget (4 MiB: a short
    first step, then five whole ones)."""
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    blob = _blob(store, 20 * MiB + 12345)
    with open(blob.path, "rb") as f:
        pristine = f.read()
    return mnt, store, blob, pristine, transfer.move_step(12 * MiB, blob.chunk_size)


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
@pytest.mark.parametrize("fail", ["sync", "digest", "write"])
def test_a_step_that_fails_in_the_background_stops_the_move_with_its_source_whole(
        make_fs, fstype, fail):
    # The second sync fails (EIO), or the second step's bytes do not match
    # their digests (the sync and the check threads), or the second step's first
    # write fails (in the caller's thread, while the first step may be
    # synced and cut behind it): the move raises that error. What the
    # source lost is durable in the destination (every cut followed a sync
    # of what it cut), the step that failed was never cut, and nothing is
    # cut after move() returned (the threads were waited for).
    mnt, store, blob, pristine, step = _four_steps(make_fs, fstype)
    size = len(pristine)
    first = (size - 1) // step * step
    digests = list(blob.chunk_digests)
    if fail == "digest":
        # The chunk just below the first step (the second step's last one).
        digests[first // blob.chunk_size - 1] ^= 1
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        call = {"sync": "fdatasync", "write": "pwrite"}.get(fail, "none")
        # The first step is one write (12345 bytes), so the second write is the second step's.
        inj = FaultInjector(fail_at=2 if call != "none" else None, only=frozenset({call}))
        with Recorder() as rec, inj, pytest.raises(
                OSError if call != "none" else VerificationError) as err:
            transfer.move(src, dst, 100, size, step=step, digests=digests,
                          digest_chunk=blob.chunk_size, src_path=blob.path)
        if call != "none":
            assert err.value.errno == errno.EIO and inj.fired == call
        left = os.fstat(src).st_size
        _check_order(rec.events, src, dst, 100, size)
        if fail == "sync":
            # The first sync covered the first step, and perhaps the next ones copied
            # before it began (at most three steps ahead); the second covered none.
            assert left in (size, first, first - step, first - 2 * step)
        else:
            assert left in (size, first)  # the second step was never cut
        time.sleep(0.1)
        assert os.fstat(src).st_size == left  # nothing cut after move() returned
        os.fsync(dst)
        with open(mnt / "out.bin", "rb") as f:
            f.seek(100 + left)
            assert f.read() == pristine[left:]  # what was cut is in the destination
        with open(blob.path, "rb") as f:
            assert f.read() == pristine[:left]
    finally:
        os.close(dst)
        os.close(src)
    store.close()


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_a_cut_waits_for_the_check_of_what_it_cuts(make_fs, monkeypatch, fstype):
    # The digests are checked in their own thread, beside the syncs; made
    # slow here (50 ms a chunk), the syncs finish first. The second step's
    # last chunk does not match its digest: the move raises, and the source
    # is never cut below the first step, however far the syncs got.
    mnt, store, blob, pristine, step = _four_steps(make_fs, fstype)
    size = len(pristine)
    first = (size - 1) // step * step
    digests = list(blob.chunk_digests)
    digests[first // blob.chunk_size - 1] ^= 1
    real = transfer.chunk_digest

    def slow_digest(data):
        time.sleep(0.05)
        return real(data)

    monkeypatch.setattr(transfer, "chunk_digest", slow_digest)
    src = os.open(blob.path, os.O_RDWR)
    dst = os.open(mnt / "out.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, 100 + size)
        with Recorder() as rec, pytest.raises(VerificationError):
            transfer.move(src, dst, 100, size, step=step, digests=digests,
                          digest_chunk=blob.chunk_size, src_path=blob.path)
        assert any(e["name"] == "fdatasync" for e in rec.events)
        assert os.fstat(src).st_size in (size, first)
        with open(blob.path, "rb") as f:
            assert f.read() == pristine[:os.fstat(src).st_size]
    finally:
        os.close(dst)
        os.close(src)
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
