"""The order of an eviction's steps (``trtet_store.cache.evict.Evictor.evict``, through
``BlobCache.prune``): the record goes before its blob, so a kill between the two leaves a
blob no record names (which recovery removes), never a record whose blob is gone. Seen at
the moment the blob is removed: its key's record is gone already.

Real files in ``tmp_path``; the barrier wraps the blob removal; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache

MiB = 1 << 20


def test_an_evicted_entry_s_record_is_gone_before_its_blob(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    for key in ("a", "b"):
        (tmp_path / key).write_bytes(os.urandom(4000))
        assert cache.put(key, tmp_path / key).stored
    blobs = cache.files.blobs
    real = blobs.remove
    seen: list[tuple[str, list[str]]] = []

    def barrier(name: str):
        # The moment a kill would matter: which records are still there.
        seen.append((name, sorted(p.name for p in (cache.directory / "keys").iterdir()
                                  if p.name.endswith(".json"))))
        return real(name)

    monkeypatch.setattr(blobs, "remove", barrier)
    evicted = cache.evictor.make_room(64 * MiB, 0)[1]
    assert sorted(evicted) == ["a", "b"], evicted
    assert len(seen) == 2, seen
    for n, (name, records) in enumerate(seen):
        assert len(records) == 1 - n, (name, records)  # the evicted key's record already gone
