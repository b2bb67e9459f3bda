"""``CacheFiles.read_entry`` (``trtet_store.cache.files``) reads a key record through io's
``read_ours``: a record we did not make is never followed, waited on or read whole.

``keys/<key>.json`` is read on every ``BlobCache.get``. Read with a plain ``open``, a FIFO
planted there hangs the hit (an open for reading waits for a writer), a link is
followed to whatever it names, and a huge file is read into memory whole. Each is
set up here for real in the cache's own ``keys/`` and must be a miss at once, the
record dropped, the link's target untouched; another user's record is still refused.

Real files in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cache import BlobCache
from trtet_store.cache.files import RECORD_MAX_BYTES

MiB = 1 << 20


def _cache_with(tmp_path: Path, key: str) -> tuple[BlobCache, Path]:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    src = tmp_path / "engine.bin"
    src.write_bytes(os.urandom(5000))
    assert cache.put(key, src).stored
    return cache, tmp_path / "c" / "keys" / f"{key}.json"


@pytest.mark.timeout(20)  # the old plain open() waits here for ever
def test_a_fifo_at_a_record_is_a_miss_at_once_and_dropped(tmp_path: Path) -> None:
    cache, record = _cache_with(tmp_path, "k")
    record.unlink()
    os.mkfifo(record)
    assert cache.get("k") is None
    assert not os.path.lexists(record), "the FIFO was left as the key's record"
    assert cache.get("k") is None


def test_a_link_at_a_record_is_not_followed(tmp_path: Path) -> None:
    cache, record = _cache_with(tmp_path, "k")
    # A well-formed record of another key's blob, outside the cache: followed, it would
    # be served under "k".
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(record.read_bytes())
    before = file_digest(elsewhere)
    record.unlink()
    record.symlink_to(elsewhere)
    assert cache.get("k") is None, "a record reached through a link was served"
    assert file_digest(elsewhere) == before  # the link's target untouched
    assert not os.path.lexists(record), "the planted link was left as the key's record"


def test_a_record_over_its_cap_is_not_read(tmp_path: Path) -> None:
    cache, record = _cache_with(tmp_path, "k")
    real = record.read_bytes()
    with open(record, "r+b") as f:  # sparse: its size says over the cap, costing no disk
        f.truncate(RECORD_MAX_BYTES + 1)
    read_before = _bytes_read()
    assert cache.get("k") is None
    assert _bytes_read() - read_before < RECORD_MAX_BYTES // 2, "the record was read whole"
    assert len(real) < 4096  # the cap is far above any record the cache writes


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_another_users_record_is_still_refused(tmp_path: Path) -> None:
    cache, record = _cache_with(tmp_path, "k")
    os.chown(record, 65534, 65534)
    with pytest.raises(PermissionError, match="refusing the engine cache record"):
        cache.get("k")
    assert record.stat().st_uid == 65534  # left alone, not removed
