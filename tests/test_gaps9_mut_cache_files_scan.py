"""The engine cache's record listing (``trtet_store.cache.files.CacheFiles.scan``): only
``keys/<key>.json`` records are read, each key once, whatever else ``keys/`` holds (the use
stamps ``<key>.use``, where one key's stamp minus a character is another key: ``ab.use`` and
``a``); a record name with no file behind it (a dangling link planted in ``keys/``, or a
record removed between the listing and its read) is skipped, never listed as None.

Real files in ``tmp_path``; no server, no torch; well under a second.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _cache(root: Path) -> BlobCache:
    cache = BlobCache(root / "c", max_bytes=64 * MiB)
    for key in ("a", "ab", "abc"):
        src = root / f"src-{key}"
        src.write_bytes(os.urandom(1000 + len(key)))
        assert cache.put(key, src).stored
        assert cache.files.stamp(key)  # each key's keys/<key>.use
    return cache


def test_scan_lists_each_record_once_and_never_a_use_stamp(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    names = sorted(os.listdir(cache.directory / "keys"))
    assert {"a.use", "ab.use", "abc.use", "a.json", "ab.json", "abc.json"} <= set(names)
    got = cache.files.scan()
    assert sorted(e.key for e in got) == ["a", "ab", "abc"], [e.key for e in got]
    assert [e.size for e in sorted(got, key=lambda e: e.key)] == [1001, 1002, 1003]


def test_scan_skips_a_record_name_with_no_file_behind_it(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    os.symlink(tmp_path / "nowhere", cache.directory / "keys" / "gone.json")
    got = cache.files.scan()
    assert None not in got
    assert sorted(e.key for e in got) == ["a", "ab", "abc"]
