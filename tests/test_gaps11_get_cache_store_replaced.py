"""``BlobCache.get`` (``trtet_store.cache.store``): the check after the pin that the pinned
blob is STILL the one the key's record names (``again.blob == entry.blob``), not only the
same file at that path.

The state: key ``k`` and key ``z`` share one blob X (the same bytes). Between get's read of
``k``'s record and its pin of X, another put replaces ``k`` with other bytes Y. X stays on
disk (``z`` still names it), so the pinned file is the very file at X's path (samestat
holds): only the record's blob name tells that ``k`` no longer names it. get must never
serve X's bytes (and ``k``'s old metadata) as ``k``'s entry: a miss, or Y.

The rival put runs at the pin (a wrapper of the store module's ``try_lock``). Real files in
``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import trtet_store.cache.store as store_mod
from trtet_store.cache import BlobCache

MiB = 1 << 20


def _src(where: Path, name: str, data: bytes) -> Path:
    p = where / name
    p.write_bytes(data)
    return p


def test_get_never_serves_a_blob_its_key_stopped_naming_before_the_pin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    old, new = os.urandom(70_000), os.urandom(70_000)
    assert cache.put("z", _src(tmp_path, "z", old), {"v": "z"}).stored
    assert cache.put("k", _src(tmp_path, "k", old), {"v": "old"}).placement == "dedup"
    real = store_mod.try_lock
    replaced: list[bool] = []

    def pin(path, *args, **kwargs):  # the rival's put lands between the read and the pin
        if not replaced:
            replaced.append(True)
            assert cache.put("k", _src(tmp_path, "k2", new), {"v": "new"}).stored
        return real(path, *args, **kwargs)

    monkeypatch.setattr(store_mod, "try_lock", pin)
    hit = cache.get("k")
    monkeypatch.undo()
    assert replaced, "the rival's put never ran"
    if hit is not None:
        with hit:
            assert hit.metadata == {"v": "new"}, \
                f"get served the blob key 'k' no longer names, with its old metadata " \
                f"{hit.metadata}"
            assert hit.path.read_bytes() == new
    # Both entries as they are now.
    with cache.get("k") as hit:
        assert hit.path.read_bytes() == new and hit.metadata == {"v": "new"}
    with cache.get("z") as hit:
        assert hit.path.read_bytes() == old and hit.metadata == {"v": "z"}
