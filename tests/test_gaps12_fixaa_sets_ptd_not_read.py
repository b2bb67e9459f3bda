"""fetch-set's check of the ``.ptd`` files it replaces (``_ptds_replaced`` in sets/fetch.py, then
fetch's ``check_ptds_to_write``): a same-size ``.ptd`` is read only when another program is
there to need it.

ExecuTorch names ``.ptd`` files by tag, so a ``.ptd`` of the destination may be
one another ``.pte`` there needs; fetch-set refuses to replace such a one
(NeededByAnotherError) unless it already holds the member's bytes, which it
reads to know. With no other ``.pte`` in the destination nothing can need it,
and a same-size ``.ptd`` (a weights file of gigabytes, typically) must not be
read at all before the fetch: that read is the whole file, for nothing. The
read is seen by the kernel: the destination is a real ext4 mounted
``strictatime``, and the old file's access time (an fd held on its inode, so
it is seen after the file is replaced) must not move. With another program
there the same file is read (the check does its job), and refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store import NeededByAnotherError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set

SIZE = 200_000
OLD = 10**18  # an access time long ago (ns)


def _aged(path: Path) -> int:
    """An fd on ``path``'s inode, its access time set long before its mtime."""
    st = os.lstat(path)
    os.utime(path, ns=(OLD, st.st_mtime_ns))
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # opening does not touch the atime


def test_a_same_size_ptd_is_not_read_when_no_other_program_needs_it(
        s3env: Any, tmp_path: Path, make_fs: Any) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    src = tmp_path / "src"
    pte = write(src / "model.pte", 9000, 1)
    ptd = write(src / "foundation.ptd", SIZE, 2)
    publish_set({"m": [pte, ptd]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    mnt = make_fs("ext4", 64, mount_options=["strictatime"])
    out = mnt / "out"
    out.mkdir()
    theirs = write(out / "foundation.ptd", SIZE, 77)  # the same size, other bytes
    # the mount does record reads: a read of the file moves its access time
    fd = _aged(theirs)
    try:
        os.pread(fd, 1, 0)
        assert os.fstat(fd).st_atime_ns != OLD, "this mount does not record reads"
    finally:
        os.close(fd)

    fd = _aged(theirs)
    try:
        fetch_set(url, out, "m", endpoint_url=s3env.endpoint.url)
        assert os.fstat(fd).st_atime_ns == OLD, (
            "the destination's same-size .ptd was read though no other program is there "
            "to need it")
    finally:
        os.close(fd)
    assert (out / "foundation.ptd").read_bytes() == ptd.read_bytes()
    assert (out / "model.pte").read_bytes() == pte.read_bytes()

    # A new version into the same directory: the member's own model.pte there is not
    # "another program", so its same-size foundation.ptd is not read either.
    ptd2 = write(src / "v2" / "foundation.ptd", SIZE, 3)
    publish_set({"m": [pte, ptd2]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir), if_exists="replace")
    fd = _aged(out / "foundation.ptd")
    try:
        fetch_set(url, out, "m", endpoint_url=s3env.endpoint.url)
        assert os.fstat(fd).st_atime_ns == OLD, (
            "the previous version's same-size .ptd was read: the member's own .pte taken "
            "for another program")
    finally:
        os.close(fd)
    assert (out / "foundation.ptd").read_bytes() == ptd2.read_bytes()

    # Another program there: the same-size .ptd (other bytes) is read, and refused.
    other = mnt / "other"
    other.mkdir()
    (other / "other.pte").write_bytes(b"\0" * 100)  # unreadable here: needs every .ptd
    theirs = write(other / "foundation.ptd", SIZE, 78)
    fd = _aged(theirs)
    try:
        with pytest.raises(NeededByAnotherError, match="other.pte"):
            fetch_set(url, other, "m", endpoint_url=s3env.endpoint.url)
        assert os.fstat(fd).st_atime_ns != OLD, "the .ptd another program needs was not read"
    finally:
        os.close(fd)
    # unchanged (its bytes made again from the seed: reading it first would move its atime)
    assert theirs.read_bytes() == write(tmp_path / "again.ptd", SIZE, 78).read_bytes()
