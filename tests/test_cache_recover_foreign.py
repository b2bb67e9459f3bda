"""Recovery never removes another user's file from the cache's tmp/ or flights/.

A put's temp file (tmp/) and a single flight's lock (flights/) that no process holds are a
killed writer's, and recovery removes them. A file there owned by another uid was not made
by this user's cache: it is refused, never locked, truncated or removed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cache import BlobCache

MiB = 1 << 20


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("sub", ["tmp", "flights"])
def test_another_users_file_in_tmp_or_flights_is_refused_and_left(here_fs: Path,
                                                                 sub: str) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=MiB)
    mine = cache.directory / sub / "12345-0123456789abcdef"  # a killed writer's own: removed
    mine.write_bytes(b"half a blob")
    theirs = cache.directory / sub / "4242-fedcba9876543210"
    theirs.write_bytes(b"not ours\n")
    os.chown(theirs, 65534, 65534)
    before = (file_digest(theirs), os.lstat(theirs).st_uid, os.lstat(theirs).st_mtime_ns)
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        BlobCache(cache.directory, max_bytes=MiB)  # opening recovers
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        cache.recover()
    assert theirs.exists(), "another user's file was removed"
    assert (file_digest(theirs), os.lstat(theirs).st_uid, os.lstat(theirs).st_mtime_ns) == before
    os.unlink(theirs)  # gone: recovery goes on and removes the killed writer's file
    cache.recover()
    assert not mine.exists()
