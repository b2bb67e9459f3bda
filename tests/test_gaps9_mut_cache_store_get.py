"""An engine cache entry whose blob has no seal (``trtet_store.cache.store.BlobCache.get``):
the seal file gone (removed by hand, lost to a crash of another tool) is a miss, the entry
dropped with its reason, never a crash and never a hit on unsealed bytes.

Real files in ``tmp_path``; no server, no torch; well under a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def test_an_entry_whose_blob_lost_its_seal_is_a_miss_and_dropped(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    (tmp_path / "src").write_bytes(os.urandom(5000))
    assert cache.put("a", tmp_path / "src").stored
    [seal] = [p for p in (cache.directory / "blobs").iterdir() if p.name.endswith(".json")]
    os.unlink(seal)
    assert cache.get("a") is None
    assert not (cache.directory / "keys" / "a.json").exists()
    assert "has no valid seal" in cache.evictor.dropped.get("a", "")
