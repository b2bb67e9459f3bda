"""A reseal of an engine cache blob read under a new identity with the same bytes
(``trtet_store.cache.files.CacheFiles.check``, through ``BlobCache.get``): a writable cache
writes the new identity into the blob's seal and says so once (INFO); a cache opened
``read_only=True`` on a writable filesystem serves the hit and writes nothing (its seal and
every file of the cache byte-identical, mtimes too).

Real files in ``tmp_path``; no server, no torch; well under a second.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _state(directory: Path) -> dict[str, tuple[str, int, int]]:
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.parent.name != "tmp" \
                and p.name != "lock":
            st = p.stat()
            out[str(p.relative_to(directory))] = (hashlib.sha256(p.read_bytes()).hexdigest(),
                                                  st.st_mtime_ns, st.st_mode)
    return out


def _cache_with_moved_blob(root: Path) -> tuple[BlobCache, str, bytes]:
    cache = BlobCache(root / "c", max_bytes=64 * MiB)
    data = os.urandom(5000)
    (root / "src").write_bytes(data)
    assert cache.put("a", root / "src").stored
    [name] = [p.name for p in (cache.directory / "blobs").iterdir()
              if not p.name.endswith(".json")]
    os.utime(cache.files.blobs.path(name), ns=(10**9, 10**9))  # a new identity, same bytes
    return cache, name, data


def test_a_read_only_cache_serves_a_moved_blob_and_writes_no_seal(tmp_path: Path) -> None:
    cache, name, data = _cache_with_moved_blob(tmp_path)
    before = _state(cache.directory)
    ro = BlobCache(cache.directory, max_bytes=64 * MiB, read_only=True)
    assert ro.read_only
    hit = ro.get("a")
    assert hit is not None
    with hit:
        assert os.pread(hit.fileno(), len(data) + 1, 0) == data
    assert _state(cache.directory) == before, "a read-only cache wrote into the cache"


def test_a_writable_cache_reseals_a_moved_blob_once_and_says_so(tmp_path: Path,
                                                                caplog) -> None:
    cache, name, data = _cache_with_moved_blob(tmp_path)
    seal_path = cache.files.blobs.seal_path(name)
    old_seal = seal_path.read_bytes()
    with caplog.at_level(logging.INFO, "trtet_store"):
        hit = cache.get("a")
        assert hit is not None
        hit.close()
    assert seal_path.read_bytes() != old_seal  # the new identity recorded
    said = [r.getMessage() for r in caplog.records if "resealed" in r.getMessage()]
    assert said == [f"engine cache blob {name} changed identity with the same bytes: "
                    "resealed"], caplog.text
    with caplog.at_level(logging.INFO, "trtet_store"):
        caplog.clear()
        hit = cache.get("a")  # trusted by its new seal: nothing read, nothing resealed
        assert hit is not None
        hit.close()
    assert not [r for r in caplog.records if "resealed" in r.getMessage()]
