"""``SealedDir.renew`` (``trtet_store.io.sealdir``), through ``CacheFiles.check``
(``trtet_store.cache.files``) on a ``BlobCache.get``: a re-read blob's new identity is
recorded only while the blob is STILL sealed. A blob whose seal another process removed
between our re-read and our renew (it dropped the blob: ``Evictor.drop_blob``) never gets
a seal written back: no seal without its blob, nothing resurrected.

The state: the blob's identity changed with its bytes kept (a same-bytes copy renamed over
it: a new inode), so get re-reads it and asks to reseal under the cache-wide lock; the
rival's drop runs just before that lock is taken (a wrapper of ``CacheFiles.locked``).
Real files in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache
from trtet_store.cache.files import CacheFiles

MiB = 1 << 20


def test_a_blob_dropped_between_its_re_read_and_its_reseal_gets_no_seal_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = os.urandom(50_000)
    (tmp_path / "src").write_bytes(data)
    put = cache.put("k", tmp_path / "src")
    assert put.stored
    blobs = cache.directory / "blobs"
    name = next(p.name for p in blobs.iterdir() if not p.name.endswith(".json"))
    # The same bytes under a new identity (another inode): get must re-read and reseal.
    (tmp_path / "same").write_bytes(data)
    os.rename(tmp_path / "same", blobs / name)
    real = CacheFiles.locked
    armed = [True]

    @contextlib.contextmanager
    def barrier(self):
        if armed and armed.pop():  # the rival's drop, just before the reseal's lock
            cache.evictor.drop_blob(name, "a rival found it damaged", os.stat(blobs / name))
            assert not (blobs / f"{name}.json").exists()
        with real(self):
            yield

    monkeypatch.setattr(CacheFiles, "locked", barrier)
    hit = cache.get("k")
    monkeypatch.undo()
    assert not armed, "the rival's drop never ran"
    if hit is not None:
        with hit:
            assert os.pread(hit.fileno(), len(data) + 1, 0) == data  # the re-read bytes
    assert sorted(os.listdir(blobs)) == [], \
        f"a seal was written back for a blob dropped meanwhile: {sorted(os.listdir(blobs))}"
    assert cache.get("k") is None
