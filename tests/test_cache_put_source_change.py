"""A put trusts the caller's digests only for the file they were taken of (issue 55 item 6).

``BlobCache.put(..., digests=)`` reads nothing back when the source still has the
identity the digests were taken of, checked before its bytes enter the cache and
again after (device, inode, size, mtime, ctime). Here the source is rewritten in
place, its size and its mtime put back, between the first check and the copy (or
the clone) that reads it: the cache's temp file then holds bytes the digests do
not describe. The check after the copy sees the change (ctime), the entered bytes
are digested, disagree with the digests, and the put is refused: nothing cached
under any name, no temp file left, the source as the writer left it.

The writer acts at a known point: the put module's copy (and clone) functions are
wrapped so that the rewrite happens just before the real copy reads the source.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache
from trtet_store.cache import put as put_module
from trtet_store.io import Digests, MiB, digest_fd, file_identity

SIZE = 3 * MiB + 17


def _digests(path: Path) -> Digests:
    fd = os.open(path, os.O_RDONLY)
    try:
        digest, chunks, size = digest_fd(fd, MiB)
        return Digests(digest, size, MiB, tuple(chunks), file_identity(os.fstat(fd)))
    finally:
        os.close(fd)


def _rewrite_keeping_size_and_mtime(path: Path) -> bytes:
    st = os.stat(path)
    new = os.urandom(SIZE)
    with open(path, "r+b") as f:
        f.write(new)
        f.flush()
        os.fsync(f.fileno())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back
    return new


def _everything(cache: Path) -> dict[str, list[str]]:
    return {sub: sorted(os.listdir(cache / sub)) for sub in ("keys", "blobs", "tmp")}


@pytest.fixture(params=["copy (ext4)", "clone (xfs)"])
def where(request, here_fs, make_fs) -> tuple[Path, str]:
    if request.param.startswith("copy"):
        return here_fs, "copy"
    return make_fs("xfs", 300), "clone"


def test_a_source_changed_while_it_is_copied_in_is_refused(where, monkeypatch):
    where, placement = where
    cache_dir = where / "cache"
    cache = BlobCache(cache_dir, max_bytes=64 * MiB, min_free=0)
    source = where / "engine.bin"
    source.write_bytes(os.urandom(SIZE))
    digests = _digests(source)
    before = _everything(cache_dir)
    placed: list[str] = []
    written: list[bytes] = []
    real_copy, real_clone = put_module.copy_all, put_module.try_clone

    def copy_all(src_fd, fd, size):  # the writer goes first (once), then the copy reads
        if not written:
            written.append(_rewrite_keeping_size_and_mtime(source))
        placed.append("copy")
        return real_copy(src_fd, fd, size)

    def try_clone(src_fd, fd, size):
        if not written:
            written.append(_rewrite_keeping_size_and_mtime(source))
        cloned = real_clone(src_fd, fd, size)
        if cloned:
            placed.append("clone")
        return cloned

    monkeypatch.setattr(put_module, "copy_all", copy_all)
    monkeypatch.setattr(put_module, "try_clone", try_clone)
    result = cache.put("k" * 16, source, {"n": 1}, digests=digests)
    assert placed == [placement], placed  # the writer did act before the bytes entered
    assert not result.stored, result
    assert f"the file {source} no longer holds the bytes it was sealed with" in result.reason
    assert cache.get("k" * 16) is None
    assert _everything(cache_dir) == before  # no record, no blob, no seal, no temp file
    # The writer's bytes, left as they are.
    assert len(written) == 1 and source.read_bytes() == written[0]
