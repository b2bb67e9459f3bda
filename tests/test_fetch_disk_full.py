"""A disk that fills during a fetch is InsufficientSpaceError, not a bare ENOSPC (issue 34, 16).

A real ext4 loop filesystem (no root reserve, so root's writes see the same
free space as the preflight), a program the preflight finds room for, and
another writer that takes every free block once the first bytes arrive (a
``posix_fallocate`` from the progress callback). The fetch then fails in the
middle of its writes; it must say which file, what it needed and what is
free, leave nothing but its staged bytes, and resume once space is back.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from test_fetch_support import MiB, engine_program, put_program

from trtet_store import InsufficientSpaceError
from trtet_store.io import free_bytes
from trtet_store.remote.download.receive import fetch


def take_every_free_block(directory: Path) -> Path:
    """Another writer: a file allocated over all the space left (halving on ENOSPC)."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        offset, step = 0, max(os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize,
                              4096)
        while step >= 4096:
            try:
                os.posix_fallocate(fd, offset, step)
                offset += step
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                step //= 2
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def test_a_disk_filled_mid_fetch_says_what_was_needed_and_what_is_free(s3, make_fs):
    mnt = make_fs("ext4", 160, mkfs_options=["-m", "0"])
    data, sizes = engine_program(91, (64 * MiB,))
    url = f"s3://{s3.bucket}/full/model.pte"
    put_program(s3.client, s3.bucket, "full", {"model.pte": (data, sizes)})
    dest = mnt / "model.pte"
    assert free_bytes(mnt) > len(data) + 40 * MiB  # the preflight has room
    filled: list[Path] = []

    def progress(p):
        if p.downloaded > 0 and not filled:
            filled.append(take_every_free_block(mnt))

    with pytest.raises(InsufficientSpaceError) as info:
        fetch(url, dest, client=s3.client, range_size=MiB, concurrency=1, progress=progress)
    err = info.value
    assert filled, "the other writer never ran"
    # A failure in the middle of the writes (not a preflight): the disk error is its cause.
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC, \
        repr(err.__cause__)
    assert "the disk filled during the fetch" in str(err)
    assert err.needed >= len(data) and err.available < MiB, (err.needed, err.available)
    # The file the disk failed: here the journal, whose next line needed a new block.
    assert err.path.startswith(os.fspath(mnt / ".trtet-staging")), err.path
    assert "needs" in str(err) and "available" in str(err)
    # Nothing written where the program goes; only the staged bytes wait for a resume.
    assert not dest.exists()
    assert sorted(n for n in os.listdir(mnt) if n != "lost+found") == [
        ".trtet-staging", "filler"]
    filled[0].unlink()
    report = fetch(url, dest, client=s3.client, range_size=MiB, concurrency=1)
    assert dest.read_bytes() == data
    assert report.bytes_resumed > 0
    assert sorted(n for n in os.listdir(mnt) if n != "lost+found") == ["model.pte"]
