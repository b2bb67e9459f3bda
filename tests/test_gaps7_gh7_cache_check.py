"""The engine cache's check and recovery (``trtet_store.cache.check.Checker``), each state set up.

``BlobCache.recover()`` and ``BlobCache.verify()`` are ``Checker.recover`` and
``Checker.verify`` (trtet_store.cache.check). What no other test of the module sets up:

- a put's temp file in ``tmp/`` whose writer is alive (holds its lock): left alone; one
  whose writer is gone: removed;
- a use stamp (``keys/<key>.use``) beside its record: kept; one whose record is gone:
  removed;
- a record whose blob file is gone: recovery removes the record, and ``verify`` drops the
  entry, saying "the blob is gone";
- a key record owned by another uid: refused (``NotOursError``), nothing removed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cache import BlobCache
from trtet_store.cache import check as cache_check
from trtet_store.io import release, try_lock

MiB = 1 << 20


def _cache(root: Path, *keys: str) -> BlobCache:
    cache = BlobCache(root / "c", max_bytes=64 * MiB)
    for i, key in enumerate(keys):
        src = root / f"src-{key}"
        src.write_bytes(os.urandom(1000 + i))
        cache.put(key, src)
    return cache


def _blob_of_size(cache: BlobCache, size: int) -> Path:
    return next(p for p in (cache.directory / "blobs").iterdir()
                if not p.name.endswith(".json") and p.stat().st_size == size)


def test_recover_leaves_a_temp_file_whose_writer_holds_its_lock(here_fs: Path) -> None:
    cache = _cache(here_fs)
    assert isinstance(cache.checker, cache_check.Checker)
    live = cache.directory / "tmp" / "111-live0123456789ab"
    live.write_bytes(b"a put in progress")
    dead = cache.directory / "tmp" / "222-dead0123456789ab"
    dead.write_bytes(b"a killed put's half blob")
    fd = try_lock(live, create=False)  # the live writer's lock (flock: this open file's)
    assert fd is not None
    try:
        before = file_digest(live)
        removed = cache.recover()
        assert live.exists(), "a temp file whose writer holds its lock was removed"
        assert file_digest(live) == before
        assert not dead.exists() and dead in removed, removed
    finally:
        release(fd)
    cache.recover()  # the writer is gone now: its file goes too
    assert not live.exists()


def test_recover_removes_a_use_stamp_only_when_its_record_is_gone(here_fs: Path) -> None:
    cache = _cache(here_fs, "kept", "gone")
    keys = cache.directory / "keys"
    kept_use, gone_use = keys / "kept.use", keys / "gone.use"
    for use in (kept_use, gone_use):
        if not use.exists():
            use.write_bytes(b"")
    os.unlink(keys / "gone.json")
    cache.recover()
    assert kept_use.exists(), "the use stamp of a live record was removed"
    assert not gone_use.exists(), "a use stamp without its record was left"
    assert cache.get("kept") is not None


def test_recover_removes_a_record_whose_blob_is_gone(here_fs: Path) -> None:
    cache = _cache(here_fs, "a", "b")
    os.unlink(_blob_of_size(cache, 1000))  # "a"'s
    cache.recover()
    assert not (cache.directory / "keys" / "a.json").exists(), \
        "a record naming a blob that is gone was kept"
    assert (cache.directory / "keys" / "b.json").exists()
    assert [e.key for e in cache.entries()] == ["b"]


def test_verify_drops_an_entry_whose_blob_is_gone_and_says_so(here_fs: Path) -> None:
    cache = _cache(here_fs, "a", "b")
    os.unlink(_blob_of_size(cache, 1000))  # "a"'s
    report = cache.verify()
    assert report.checked == 2
    assert report.dropped == (("a", "the blob is gone"),), report
    assert cache.get("a") is None and cache.get("b") is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("name", ["planted.json", "planted.use"])
def test_recover_refuses_a_key_file_of_another_uid_and_removes_nothing(here_fs: Path,
                                                                       name: str) -> None:
    """A record, or a use stamp whose record is gone (which recovery would remove if it
    were ours), owned by another uid: refused before anything is removed."""
    cache = _cache(here_fs, "a")
    theirs = cache.directory / "keys" / name
    theirs.write_bytes(b'{"not": "ours"}\n')
    os.chown(theirs, 65534, 65534)
    before = {p.name: file_digest(p) for p in (cache.directory / "keys").iterdir()}
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        cache.recover()
    assert {p.name: file_digest(p) for p in (cache.directory / "keys").iterdir()} == before
    assert os.lstat(theirs).st_uid == 65534
