"""Peak extra disk of each placement on each filesystem, over the final state.

A save of 2 x 256 MiB consumed (or kept) blobs into two outputs (a
``.pte`` and a ``.ptd``, one payload each, so each can host its own by
insert), one transaction, with free
space polled every 2 ms and sampled after every step the writer reports.
The peak is measured over the final state (free space after the save and
a sync), so what the output keeps is not counted; what the placement needs
on the way is:

- insert and clone: at most 1 MiB plus the header (no payload byte written);
  an XFS clone also holds, for a moment, a reservation of up to one clone
  call (``transfer.CLONE_RANGE``), given back unused, so the calls are cut
  to 16 MiB here to keep that below what a written payload would show;
- move: at most its budget (``chunk_size``, three steps of a third of it), on
  btrfs too, where the move commits the transaction per step so that
  truncated extents are freed;
- copy: at most the payload plus one chunk over the start.
"""

from __future__ import annotations

import pytest
import xxhash
from digests import file_digest

from trtet_store import BlobStore
from trtet_store.bench.measure import PeakDiskMonitor
from trtet_store.io import fs, transfer, write_files
from trtet_store.io.units import MiB, format_mib

PAYLOAD = 256 * MiB
HEADER = 4096
BUDGET = 64 * MiB
# Clone calls, far below the payload (transfer.CLONE_RANGE: 256 MiB).
CLONE_CALL = 16 * MiB
# The journal, the directory entries and the output's metadata blocks.
SLACK = 1 * MiB
# btrfs: each step's commit copies its trees on write, and the old tree blocks go free only
# at the next commit: a loaded CI run saw a move 6 MiB over its budget (70.0 MiB against 64),
# where a copy would be 256 MiB over.
BTRFS_METADATA = 8 * MiB

CASES = [
    ("ext4", "insert"), ("ext4", "move"), ("ext4", "copy"),
    ("xfs", "clone"), ("xfs", "insert"), ("xfs", "move"), ("xfs", "copy"),
    ("btrfs", "clone"), ("btrfs", "move"), ("btrfs", "copy"),
    ("tmpfs", "move"), ("tmpfs", "copy"),
]


def _blob(store: BlobStore, seed: int):
    # 4 MiB blocks of distinct bytes: cheap to make, not compressible or dedupable.
    with store.writer() as w:
        for k in range(PAYLOAD // (4 * MiB)):
            block = xxhash.xxh3_128(f"{seed}-{k}".encode()).digest()
            w.write(block * (4 * MiB // 16))
    return w.blob


@pytest.mark.parametrize("fstype,placement", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_peak_over_final_state(make_fs, monkeypatch, fstype, placement):
    monkeypatch.setattr(transfer, "CLONE_RANGE", CLONE_CALL)
    mnt = make_fs(fstype, 1400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    blobs = [_blob(store, 1), _blob(store, 2)]
    digests = [b.digest for b in blobs]
    outputs = [(mnt / "m.pte", [b"H" * HEADER, blobs[0], b"tail"]),
               (mnt / "engines.ptd", [b"D" * HEADER, blobs[1]])]
    consume = placement in ("insert", "move")
    allowed = {placement, "move"} if placement == "insert" else {placement}
    with PeakDiskMonitor(mnt) as mon:
        reports = write_files(outputs, consume=consume, placements=allowed,
                              chunk_size=BUDGET, progress=lambda *_: mon.sample())
    records = [r for report in reports for r in report.placements]
    if {r.placement for r in records} != {placement}:
        pytest.fail(f"not every payload placed by {placement} on {fstype}: "
                    + "; ".join(f"{r.placement}: {r.reason}" for r in records))
    # Peak over the final state: what was in use at the worst moment beyond
    # what the finished output keeps.
    over_final = mon.peak_extra_bytes - max(mon.extra_after_bytes, 0)
    note = (f"{fstype} {placement}: peak {format_mib(mon.peak_extra_bytes)}, "
            f"after {format_mib(mon.extra_after_bytes)}, over final {format_mib(over_final)}")
    print(note)
    if placement in ("insert", "clone"):
        # XFS reserves free blocks for each remapped extent while it remaps it
        # (see transfer.CLONE_RANGE); no block is written or kept.
        remap = CLONE_CALL if (fstype, placement) == ("xfs", "clone") else 0
        assert over_final <= SLACK + HEADER + remap, note
    elif placement == "move":
        assert over_final <= BUDGET + SLACK + (BTRFS_METADATA if fstype == "btrfs" else 0), note
    else:
        assert mon.peak_extra_bytes <= 2 * PAYLOAD + BUDGET + SLACK, note
    for (path, _), want in zip(outputs, digests, strict=True):
        with open(path, "rb") as f:
            f.seek(HEADER)
            assert xxhash.xxh3_128_hexdigest(f.read(PAYLOAD)) == want
    if not consume:
        assert [file_digest(b.path) for b in blobs] == digests
    store.close()
