"""``CacheFiles.read_entry`` (``trtet_store.cache.files``): a record without its use stamp
(``keys/<key>.use`` gone) was last used when it was created: ``created`` is in SECONDS in
the record, the last use in NANOSECONDS (``last_use_ns = created * 1e9``). A unit slip
makes such an entry look used in January 1970: ``entries()`` says so, and a reopened
cache (its summary rebuilt from the records by recovery) evicts it before entries used
long before it. ``Checker.entries`` (``trtet_store.cache.check``, ``BlobCache.entries``)
gives each last use in SECONDS (``last_use_ns / 1e9``), comparable with ``created``.

Real files in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def test_a_record_without_its_use_stamp_was_last_used_when_created(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    cache = BlobCache(directory, max_bytes=64 * MiB)
    for key in ("old", "new"):
        (tmp_path / key).write_bytes(os.urandom(4000))
        assert cache.put(key, tmp_path / key).stored
    hour_ago = time.time() - 3600
    os.utime(directory / "keys" / "old.use", (hour_ago, hour_ago))
    os.unlink(directory / "keys" / "new.use")
    again = BlobCache(directory, max_bytes=64 * MiB)  # recovery reads every record again
    info = {e.key: e for e in again.entries()}
    assert abs(info["new"].last_use - info["new"].created) < 1, \
        (info["new"].last_use, info["new"].created)
    assert info["new"].last_use > hour_ago + 1800, "the entry looks used before 'old' was"
    assert [e.key for e in again.entries()] == ["new", "old"]  # most recently used first
    # The least recently used goes first: 'old' (an hour ago), never 'new'.
    assert again.prune(4000) == ["old"]
    hit = again.get("new")
    assert hit is not None
    hit.close()
