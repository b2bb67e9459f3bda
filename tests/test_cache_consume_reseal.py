"""A consumed source's unlink reseals the blob only when nothing but its ctime moved.

``put(consume=True)`` removes the caller's file once the entry is durable; that unlink (of
a hard link of the blob, where the put linked it in) moves the blob's ctime, so the cache
seals the blob again without reading it, trusting that only its own unlink happened. A
write into the blob between the commit and that unlink (a writer still holding the source
open) must not be sealed as the cache's bytes: the next hit reads the blob, finds it is
not the bytes it stored, and serves nothing.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache
from trtet_store.cache.files import CacheFiles


def test_a_blob_written_before_the_consumed_sources_unlink_is_not_resealed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BlobCache(tmp_path / "cache", max_bytes=64 << 20)
    stored = random.Random(1).randbytes(256 * 1024)
    src = tmp_path / "engine.bin"
    src.write_bytes(stored)
    written = []
    unlink = CacheFiles.unlink

    def write_then_unlink(*paths: Path) -> list[Path]:
        if Path(paths[0]) == src and not written:  # the consume: the entry is durable
            (blob,) = (cache.directory / "blobs").glob("*[!n]")  # the blob, not its seal
            with open(blob, "r+b") as f:  # a writer still at work: same size, new bytes
                f.write(b"\xff" * 4096)
            written.append(blob)
        return unlink(*paths)

    monkeypatch.setattr(CacheFiles, "unlink", staticmethod(write_then_unlink))
    got = cache.put("k", src, consume=True)
    monkeypatch.undo()
    assert got.stored and written, got
    assert not src.exists()
    hit = cache.get("k")
    served = None
    if hit is not None:
        with hit:
            served = os.pread(hit.fileno(), hit.size, 0)
    assert served is None, "the blob written after the commit was served as the cache's bytes"
    assert cache.get("k") is None  # and the entry stays gone
