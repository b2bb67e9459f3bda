"""The engine cache's evictor (``trtet_store.cache.evict.Evictor``), each decision set up.

``BlobCache.drop``/``prune``/``clear`` and the damaged-entry paths are ``Evictor.drop``,
``prune``, ``drop_key``, ``drop_blob``, ``evict`` and ``remove_blob_if_unreferenced``
(trtet_store.cache.evict). Two keys may share one blob (the same bytes put twice): a
blob goes only with the last key naming it. A hit pins its blob: an eviction leaves a
pinned blob, and its key. A read-only cache changes nothing (``prune`` refuses, EROFS).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cache import BlobCache
from trtet_store.cache import evict as cache_evict

MiB = 1 << 20


def _blobs(cache: BlobCache) -> list[str]:
    return sorted(p.name for p in (cache.directory / "blobs").iterdir()
                  if not p.name.endswith(".json"))


def _two_keys_one_blob(root: Path) -> tuple[BlobCache, str, Path]:
    cache = BlobCache(root / "c", max_bytes=64 * MiB)
    assert isinstance(cache.evictor, cache_evict.Evictor)
    src = root / "engine"
    src.write_bytes(os.urandom(5000))
    cache.put("a", src)
    cache.put("b", src)  # the same bytes: one blob, two records
    [blob] = _blobs(cache)
    return cache, blob, src


def test_evict_removes_a_shared_blob_only_with_its_last_key(here_fs: Path) -> None:
    cache, blob, src = _two_keys_one_blob(here_fs)
    assert cache.evictor.evict("a", blob) is True
    assert _blobs(cache) == [blob], "a blob another key names was removed with one key"
    hit = cache.get("b")
    assert hit is not None and hit.path.read_bytes() == src.read_bytes()
    hit.close()
    assert cache.evictor.evict("b", blob) is True
    assert _blobs(cache) == [], "the blob of the last key evicted was left"
    assert not (cache.directory / "blobs" / f"{blob}.json").exists()


def test_evict_leaves_a_blob_a_hit_pins_and_its_key(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    hit = cache.get("a")
    assert hit is not None
    try:
        assert cache.evictor.evict("a", blob) is False
        assert (cache.directory / "keys" / "a.json").exists()
    finally:
        hit.close()
    assert cache.evictor.evict("a", blob) is True


def test_drop_key_removes_the_blob_only_when_no_record_names_it(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    cache.evictor.drop_key("a", "test: damaged record")
    assert cache.evictor.dropped == {"a": "test: damaged record"}
    assert _blobs(cache) == [blob]
    cache.evictor.remove_blob_if_unreferenced(blob)
    assert _blobs(cache) == [blob], "a blob key b still names was removed"
    cache.evictor.drop_key("b", "test: damaged record")
    assert _blobs(cache) == []


def test_drop_key_keeps_an_entry_replaced_since_it_was_read(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    other = here_fs / "other"
    other.write_bytes(os.urandom(6000))
    cache.put("a", other)  # a put replaces the key's entry
    cache.evictor.drop_key("a", "the old blob was damaged", blob)  # the caller's old blob
    hit = cache.get("a")
    assert hit is not None and hit.path.read_bytes() == other.read_bytes()
    hit.close()


def test_drop_of_a_key_with_no_record_is_false_and_changes_nothing(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    before = {p.name: file_digest(p) for p in (cache.directory / "keys").iterdir()}
    assert cache.drop("nope", "asked") is False
    assert cache.evictor.drop("nope", "asked") is False
    assert {p.name: file_digest(p) for p in (cache.directory / "keys").iterdir()} == before
    assert cache.drop("a", "asked") is True and cache.evictor.dropped == {}
    assert _blobs(cache) == [blob]


def test_a_read_only_cache_drops_and_prunes_nothing(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    ro = BlobCache(cache.directory, max_bytes=64 * MiB, read_only=True)
    keys_before = sorted(os.listdir(cache.directory / "keys"))
    with pytest.raises(OSError) as caught:
        ro.prune(0)
    assert caught.value.errno == errno.EROFS and "read-only: cannot prune" in str(caught.value)
    assert ro.drop("a", "asked") is False
    ro.evictor.drop_key("a", "damaged")  # said, remembered, nothing removed
    assert ro.evictor.dropped == {"a": "damaged"}
    assert sorted(os.listdir(cache.directory / "keys")) == keys_before
    assert _blobs(cache) == [blob]


def test_prune_refuses_a_bad_bound_and_evicts_down_to_a_good_one(here_fs: Path) -> None:
    cache, blob, _ = _two_keys_one_blob(here_fs)
    for bad in (-1, True, 1.5, "0"):
        with pytest.raises(ValueError, match="prune's max_bytes must be an int >= 0"):
            cache.prune(bad)
    assert _blobs(cache) == [blob]
    assert sorted(cache.prune(0)) == ["a", "b"]
    assert _blobs(cache) == []
