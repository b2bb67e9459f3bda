"""Use stamps and reseals of the engine cache's files (``trtet_store.cache.files.CacheFiles``).

``CacheFiles.stamp(key, hit=...)`` records a use in ``keys/<key>.use``: a hit appends a
byte (creating the stamp), a use that is not a hit only touches a stamp that is there; a
read-only cache writes none. ``CacheFiles.check`` reseals a blob read under a new identity
only while its seal is still there: a blob dropped meanwhile is never given a seal again.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cache import BlobCache
from trtet_store.cache.files import CacheFiles

MiB = 1 << 20


def _cache(root: Path) -> BlobCache:
    cache = BlobCache(root / "c", max_bytes=64 * MiB)
    src = root / "engine"
    src.write_bytes(os.urandom(3000))
    cache.put("a", src)
    return cache


def test_a_stamp_that_is_not_a_hit_creates_no_stamp(here_fs: Path) -> None:
    cache = _cache(here_fs)
    files = cache.files
    assert isinstance(files, CacheFiles)
    use = files.use("a")
    if use.exists():
        os.unlink(use)
    assert files.stamp("a", hit=False) is False
    assert not use.exists(), "a use that is not a hit created a stamp"
    assert files.stamp("a", hit=True) is True
    assert use.read_bytes().endswith(b"h")
    size = use.stat().st_size
    os.utime(use, ns=(10**9, 10**9))
    assert files.stamp("a", hit=False) is True
    assert use.stat().st_size == size and use.stat().st_mtime_ns > 10**9


def test_a_read_only_cache_writes_no_use_stamp(here_fs: Path) -> None:
    cache = _cache(here_fs)
    use = cache.files.use("a")
    if use.exists():
        os.unlink(use)
    ro = BlobCache(cache.directory, max_bytes=64 * MiB, read_only=True)
    hit = ro.get("a")
    assert hit is not None
    hit.close()
    assert ro.files.stamp("a") is False
    assert not use.exists(), "a read-only cache wrote a use stamp"


def test_a_check_gives_no_seal_to_a_blob_whose_seal_is_gone(here_fs: Path) -> None:
    """``CacheFiles.check`` of a blob read under a new identity (its mtime moved, the same
    bytes) reseals it only while its seal is there: one dropped meanwhile (by another
    process's drop, after this hit read the seal) is never written again."""
    cache = _cache(here_fs)
    files = cache.files
    [name] = [p.name for p in (cache.directory / "blobs").iterdir()
              if not p.name.endswith(".json")]
    seal = files.blobs.read(name)
    assert seal is not None
    path = files.blobs.path(name)
    os.utime(path, ns=(10**9, 10**9))  # a new identity, the same bytes
    os.unlink(files.blobs.seal_path(name))  # dropped meanwhile
    fd = os.open(path, os.O_RDONLY)
    try:
        problem, renewed = files.check(name, seal, fd, os.fstat(fd), full=True)
    finally:
        os.close(fd)
    assert problem is None and renewed not in (None, seal)
    assert not files.blobs.seal_path(name).exists(), "a dropped blob was sealed again"
    assert files.blobs.read(name) is None
