"""The engine cache's put (``trtet_store.cache.put.Putter._put``, through ``BlobCache.put``)
without digests: the seal is taken of the bytes that ENTERED the cache (the temp file the
copy or clone wrote), never of the source read again. A writer that rewrites the source
(same size) right after its bytes were copied in must not make the seal describe bytes the
blob does not hold: a hit's digest is then the digest of the bytes it serves, and a full
verify finds the entry whole.

Real files (ext4 copy; an xfs clone); the writer acts inside the put module's copy/clone
wrapper, after the real copy; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from trtet_store.cache import BlobCache
from trtet_store.cache import put as put_module

MiB = 1 << 20
SIZE = MiB + 333


@pytest.fixture(params=["copy", "clone"])
def where(request, here_fs, make_fs) -> Path:
    return here_fs if request.param == "copy" else make_fs("xfs", 300)


def test_a_put_seals_the_bytes_that_entered_not_the_source_rewritten_after(where, monkeypatch):
    cache = BlobCache(where / "cache", max_bytes=64 * MiB)
    source = where / "engine.bin"
    entered = os.urandom(SIZE)
    source.write_bytes(entered)
    rewritten: list[bytes] = []
    real_copy, real_clone = put_module.copy_all, put_module.try_clone

    def _rewrite() -> None:  # the writer, right after the cache's copy of the bytes
        if not rewritten:
            new = os.urandom(SIZE)
            with open(source, "r+b") as f:
                f.write(new)
            rewritten.append(new)

    def copy_all(src_fd, fd, size):
        real_copy(src_fd, fd, size)
        _rewrite()

    def try_clone(src_fd, fd, size):
        cloned = real_clone(src_fd, fd, size)
        if cloned:
            _rewrite()
        return cloned

    monkeypatch.setattr(put_module, "copy_all", copy_all)
    monkeypatch.setattr(put_module, "try_clone", try_clone)
    result = cache.put("k1", source, {"n": 1})
    assert rewritten, "the writer never acted"
    assert result.stored, result
    assert result.digest == xxhash.xxh3_128_hexdigest(entered), \
        "the put's digest is not the digest of the bytes that entered the cache"
    hit = cache.get("k1")
    assert hit is not None
    with hit:
        served = hit.path.read_bytes()
        assert served == entered
        assert hit.digest == xxhash.xxh3_128_hexdigest(served), \
            "the seal names bytes the blob does not hold"
    assert cache.verify().dropped == ()
    assert source.read_bytes() == rewritten[0]  # the writer's bytes, left as they are
