"""Online discard: told apart per mount, and named where a move will pay for it.

On a filesystem mounted with ``discard`` every block freed is also
discarded, and a move frees every byte it copies: on a plain virtio ext4
disk that took a move from 1.06x of the disk's floor (``nodiscard``) to
1.33x (benchmarks/discard_ab.sh, benchmarks/README.md). The write says so
in the move's reason (the report and the log), so a user who sees a slow
move learns why. Real ext4 and XFS loop filesystems, mounted with and
without ``discard``.
"""

from __future__ import annotations

import logging
import os

import pytest
import xxhash

from trtet_store.io import BlobStore, online_discard, write_file
from trtet_store.io.units import MiB


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_online_discard_is_read_from_the_mount_holding_the_path(make_fs, fstype):
    plain = make_fs(fstype, 300)
    discarding = make_fs(fstype, 300, mount_options="discard")
    (discarding / "sub").mkdir()
    assert online_discard(discarding) and online_discard(discarding / "sub")
    # A name not yet created is judged by the mount it would be created in.
    assert online_discard(discarding / "sub" / "not-yet.pte")
    assert not online_discard(plain) and not online_discard(plain / "x.pte")


def test_tmpfs_never_discards(make_fs):
    assert not online_discard(make_fs("tmpfs", 16))


@pytest.mark.parametrize("discard", [True, False])
def test_a_move_says_when_its_filesystem_discards_online(make_fs, caplog, discard):
    mnt = make_fs("ext4", 200, mount_options="discard" if discard else None)
    data = os.urandom(MiB) * 24
    with BlobStore(mnt / "staging") as store:
        with store.writer() as w:
            w.write(data)
        with caplog.at_level(logging.INFO, logger="trtet_store.writer"):
            report = write_file(mnt / "out.bin", [b"h" * 128, w.blob], consume=True,
                                placements="move")
    (placed,) = report.placements
    assert placed.placement == "move"
    assert ("online discard" in placed.reason) is discard
    assert any("online discard" in r.getMessage() for r in caplog.records) is discard
    out = (mnt / "out.bin").read_bytes()
    assert out[:128] == b"h" * 128
    assert xxhash.xxh3_128_digest(out[128:]) == xxhash.xxh3_128_digest(data)
    assert sorted(os.listdir(mnt)) == ["lost+found", "out.bin", "staging"]
