"""A damaged blob found by a cache opened ``read_only=True`` on a writable filesystem
(``trtet_store.cache.evict.Evictor.drop_blob``, through ``BlobCache.get(verify="full")``):
never served, and nothing is dropped or written (every file of the cache byte-identical);
the same cache opened writable drops it.

Real files in ``tmp_path``; no server, no torch; well under a second.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _state(directory: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                             p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "lock"}


def test_a_read_only_cache_never_serves_a_damaged_blob_and_drops_nothing(tmp_path: Path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    (tmp_path / "src").write_bytes(os.urandom(5000))
    assert cache.put("a", tmp_path / "src").stored
    [blob] = [p for p in (cache.directory / "blobs").iterdir() if not p.name.endswith(".json")]
    st = blob.stat()
    with open(blob, "r+b") as f:  # a flipped byte, its mtime put back
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = _state(cache.directory)
    ro = BlobCache(cache.directory, max_bytes=64 * MiB, read_only=True)
    assert ro.get("a", verify="full") is None
    assert _state(cache.directory) == before, "a read-only cache dropped or wrote something"
    assert cache.get("a", verify="full") is None  # writable: dropped
    assert not (cache.directory / "keys" / "a.json").exists() and not blob.exists()
