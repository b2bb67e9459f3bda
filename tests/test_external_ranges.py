"""A byte range of a user's file as a piece (ExternalFile.range), on real filesystems.

What fetch's delta (unchanged ranges of the old version) and the formats'
re-saves (tensors mapped from the file being replaced) are built on: the
range lands at its offset, by clone where both offsets are block aligned and
the filesystem reflinks, else by copy; the source file is never changed; a
file can be rewritten from its own bytes, and a failure leaves it whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faults import FaultInjector

from trtet_store import ExternalFile, VerificationError, write_file
from trtet_store.io import SourceChangedError, fs
from trtet_store.io.journal import Plan
from trtet_store.io.units import MiB

SIZE = 8 * MiB + 777


def make_source(path: Path, size: int = SIZE) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def stray(directory: Path, keep: set[str]) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n not in keep and n != "lost+found")


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_ranges_land_at_their_offsets_and_the_source_stays(make_fs, fstype):
    mnt = make_fs(fstype, 300)
    fs.capabilities.clear()
    src = mnt / "old.bin"
    data = make_source(src)
    pieces = [b"head" * 1024,                          # 4096: the next offset is aligned
              ExternalFile.range(src, 4 * MiB, 2 * MiB),  # aligned both sides
              b"x" * 100,
              ExternalFile.range(src, 12345, 54321),      # unaligned both sides
              ExternalFile.range(src, 0, 0),
              ExternalFile.range(src, SIZE - 777, 777)]
    report = write_file(mnt / "new.bin", pieces)
    expected = (b"head" * 1024 + data[4 * MiB:6 * MiB] + b"x" * 100 + data[12345:12345 + 54321]
                + data[SIZE - 777:])
    assert (mnt / "new.bin").read_bytes() == expected
    assert src.read_bytes() == data
    used = {r.size: r.placement for r in report.placements}
    assert used[2 * MiB] == ("clone" if fstype == "xfs" else "copy")
    assert used[54321] == "copy"
    assert stray(mnt, {"old.bin", "new.bin"}) == []


def test_an_unaligned_source_offset_is_copied_not_cloned(make_fs):
    mnt = make_fs("xfs", 300)
    fs.capabilities.clear()
    src = mnt / "old.bin"
    data = make_source(src)
    report = write_file(mnt / "new.bin", [b"h" * 4096, ExternalFile.range(src, 512, 4 * MiB)])
    assert (mnt / "new.bin").read_bytes() == b"h" * 4096 + data[512:512 + 4 * MiB]
    (rec,) = report.placements
    assert rec.placement == "copy"
    assert "range starts at 512" in rec.reason


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_a_file_is_rewritten_from_its_own_bytes(make_fs, fstype):
    mnt = make_fs(fstype, 300)
    fs.capabilities.clear()
    path = mnt / "model.bin"
    data = make_source(path)
    # The new version keeps two ranges of the old one, swapped, behind a new header.
    pieces = [b"v2" * 2048, ExternalFile.range(path, 4 * MiB, 4 * MiB, digests=True),
              ExternalFile.range(path, 0, 4 * MiB, digests=True)]
    write_file(path, pieces)
    assert path.read_bytes() == b"v2" * 2048 + data[4 * MiB:8 * MiB] + data[:4 * MiB]
    assert stray(mnt, {"model.bin"}) == []


@pytest.mark.parametrize("mode", ["eio", "enospc"])
def test_a_failed_rewrite_from_its_own_bytes_leaves_the_old_file(make_fs, mode):
    mnt = make_fs("ext4", 200)
    path = mnt / "model.bin"
    data = make_source(path)
    pieces = [b"v2" * 2048, ExternalFile.range(path, 4 * MiB, 4 * MiB)]
    with FaultInjector(fail_at=2, mode=mode, only=frozenset({"copy_file_range"})) as faults, \
            pytest.raises(OSError):
        write_file(path, pieces, chunk_size=MiB)
    assert faults.fired
    assert path.read_bytes() == data
    assert stray(mnt, {"model.bin"}) == []


def test_a_range_of_a_file_that_changed_size_is_refused_before_writing(make_fs):
    mnt = make_fs("ext4", 100)
    src = mnt / "old.bin"
    make_source(src)
    piece = ExternalFile.range(src, 0, MiB)
    with open(src, "ab") as f:
        f.write(b"more")
    with pytest.raises(SourceChangedError):
        write_file(mnt / "new.bin", [piece])
    assert not (mnt / "new.bin").exists()


def test_a_range_whose_bytes_changed_fails_verification_and_publishes_nothing(make_fs):
    mnt = make_fs("ext4", 100)
    src = mnt / "old.bin"
    make_source(src)
    (mnt / "new.bin").write_bytes(b"previous")
    piece = ExternalFile.range(src, MiB, 2 * MiB, digests=True)
    with open(src, "r+b") as f:  # same size, one byte different inside the range
        f.seek(MiB + 5)
        byte = f.read(1)[0]
        f.seek(MiB + 5)  # the read moved past it: flip that byte, not the next one
        f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(VerificationError):
        # the pread path reads and checks each chunk before writing it
        write_file(mnt / "new.bin", [piece], placements=["copy"])
    assert (mnt / "new.bin").read_bytes() == b"previous"
    assert stray(mnt, {"old.bin", "new.bin"}) == []


def test_a_range_must_lie_inside_its_file(tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match="ends past"):
        ExternalFile(src, 8, offset=4, file_size=10)
    with pytest.raises(ValueError, match="negative"):
        ExternalFile(src, 1, offset=-1)
    with pytest.raises(ValueError, match="chunk digests"):
        ExternalFile(src, 3 * MiB, chunk_digests=(1, 2))
    assert ExternalFile(src, 10).file_size == 10  # a whole file, as before


def test_the_journal_keeps_the_source_offset():
    from trtet_store.io.journal import OutputPlan, PayloadPlan
    plan = Plan(token="t", outputs=[OutputPlan(dest="/d", temp="/t", backup=None, size=9,
                                               payloads=[PayloadPlan(
                                                   source="/s", offset=0, size=9,
                                                   placement="copy", reason="r",
                                                   chunk_size=MiB, chunk_digests=None,
                                                   source_offset=4096)])])
    again = Plan.from_json(plan.to_json())
    assert again.outputs[0].payloads[0].source_offset == 4096
