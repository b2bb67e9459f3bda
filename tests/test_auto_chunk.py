"""``chunk_size="auto"``: a move's budget taken from the free space, never above its limit.

On a real ext4 loop filesystem with less free space than the default 64 MiB
budget needs beside the payload, the default refuses the move before
anything is created, and ``"auto"`` halves the budget until it fits and
moves the blob in smaller steps. With room to spare, ``AutoChunk(limit=...)``
never uses more than its limit (the bytes the move has in both files, read
from its calls). A
disk too small even for the smallest budget is refused as before, with
nothing created and the blob intact.
"""

from __future__ import annotations

import os

import pytest
import xxhash
from calltrace import Recorder, copied_ahead

from trtet_store.io import AutoChunk, BlobStore, InsufficientSpaceError, free_bytes, write_file
from trtet_store.io.units import MiB


def _stage(store: BlobStore, size: int, seed: int):
    data = xxhash.xxh3_128_digest(str(seed).encode()) * (size // 16)
    with store.writer() as w:
        w.write(data)
    return w.blob, xxhash.xxh3_128_hexdigest(data)


def _fill_to(mnt, free: int) -> None:
    """Take the filesystem's free space down to about ``free`` bytes with a filler file."""
    take = free_bytes(mnt) - free
    assert take > 0, (free_bytes(mnt), free)
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, take)


def test_auto_moves_on_a_disk_too_full_for_the_default_budget(make_fs):
    mnt = make_fs("ext4", 160)
    with BlobStore(mnt / "staging") as store:
        blob, digest = _stage(store, 40 * MiB, 1)
        header = b"h" * 100
        _fill_to(mnt, 40 * MiB)  # room for a 32 MiB budget, not for 64 MiB
        before = sorted(os.listdir(mnt))
        with pytest.raises(InsufficientSpaceError):
            write_file(mnt / "out.bin", [header, blob], consume=True, placements="move")
        assert sorted(os.listdir(mnt)) == before and not blob.closed

        report = write_file(mnt / "out.bin", [header, blob], consume=True,
                            placements="move", chunk_size="auto")
    assert [p.placement for p in report.placements] == ["move"]
    out = (mnt / "out.bin").read_bytes()
    assert out[:100] == header and xxhash.xxh3_128_hexdigest(out[100:]) == digest


@pytest.mark.parametrize("limit", [6 * MiB, 12 * MiB])
def test_auto_never_goes_above_its_limit(make_fs, limit):
    mnt = make_fs("ext4", 200)
    with BlobStore(mnt / "staging") as store:
        blob, digest = _stage(store, 48 * MiB, 2)
        with Recorder() as rec:
            write_file(mnt / "out.bin", [b"x" * 100, blob], consume=True, placements="move",
                       chunk_size=AutoChunk(limit=limit))
    # The move never had more than the limit in both files: measured at each
    # write into the output, from the source's length when it began.
    src = next(e["args"][0] for e in rec.events if e["name"] == "ftruncate" and e["args"][1] == 0)
    dst = next(e["args"][0] for e in rec.events
               if e["name"] == "pwrite" and len(e["args"][1]) >= MiB)
    ahead = max(copied_ahead(rec.events, src, dst, 100, 48 * MiB))
    assert limit // 3 < ahead <= limit, (ahead, limit)
    out = (mnt / "out.bin").read_bytes()
    assert xxhash.xxh3_128_hexdigest(out[100:]) == digest


def test_a_disk_too_full_even_for_the_smallest_budget_is_refused(make_fs):
    mnt = make_fs("ext4", 160)
    with BlobStore(mnt / "staging") as store:
        blob, digest = _stage(store, 40 * MiB, 3)
        _fill_to(mnt, 2 * MiB)
        before = sorted(os.listdir(mnt))
        with pytest.raises(InsufficientSpaceError):
            write_file(mnt / "out.bin", [b"h" * 100, blob], consume=True, placements="move",
                       chunk_size="auto")
        assert sorted(os.listdir(mnt)) == before
        with open(blob.path, "rb") as f:
            assert xxhash.xxh3_128_hexdigest(f.read()) == digest


@pytest.mark.parametrize("bad", ["big", 1.5, True, AutoChunk])
def test_bad_chunk_sizes_are_refused(here_fs, bad):
    with pytest.raises((TypeError, ValueError)):
        write_file(here_fs / "x", [b"x"], chunk_size=bad)
    assert not (here_fs / "x").exists()


def test_an_autochunk_needs_a_minimum_within_its_limit():
    with pytest.raises(ValueError):
        AutoChunk(limit=MiB, minimum=2 * MiB)
