"""``BlobCache.verify`` (``Checker.verify``, ``trtet_store.cache.check``) re-digests EVERY
entry in full, also one whose file still has its sealed identity: a blob whose bytes are
not the ones its seal names (here: the seal's digests are another file's, the identity the
blob's own, what a media error under an unchanged identity looks like to the cache) is
dropped by verify, and ``get(verify="full")`` (``Seal.check(full=True)``, ``trtet_store.io.seal``)
never serves it; a plain ``get`` (identity trusted, nothing read) is what verify exists
for. The other entries stay.

Real files in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _seal_path(cache: BlobCache, key: str) -> Path:
    record = json.loads((cache.directory / "keys" / f"{key}.json").read_bytes())
    return cache.directory / "blobs" / f"{record['blob']}.json"


def _lie(cache: BlobCache, key: str, liar: str) -> None:
    """Give ``key``'s seal the digests of ``liar``'s (same size), its identity kept."""
    seal = json.loads(_seal_path(cache, key).read_bytes())
    other = json.loads(_seal_path(cache, liar).read_bytes())
    seal["digest"], seal["chunk_digests"] = other["digest"], other["chunk_digests"]
    _seal_path(cache, key).write_text(json.dumps(seal, sort_keys=True))


def test_verify_reads_every_entry_even_one_whose_identity_is_sealed(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = {k: os.urandom(3 * 4096) for k in ("bad", "liar", "good")}
    for key, value in data.items():
        (tmp_path / key).write_bytes(value)
        assert cache.put(key, tmp_path / key).stored
    _lie(cache, "bad", "liar")
    report = cache.verify()
    assert report.checked == 3
    assert [k for k, _ in report.dropped] == ["bad"], report
    assert cache.get("bad") is None
    for key in ("liar", "good"):
        with cache.get(key, verify="full") as hit:
            assert hit.path.read_bytes() == data[key]


def test_a_full_get_never_serves_a_blob_its_seal_does_not_describe(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = {k: os.urandom(3 * 4096) for k in ("bad", "liar")}
    for key, value in data.items():
        (tmp_path / key).write_bytes(value)
        assert cache.put(key, tmp_path / key).stored
    _lie(cache, "bad", "liar")
    assert cache.get("bad", verify="full") is None
    assert "bad" in cache.dropped
    with cache.get("liar", verify="full") as hit:
        assert hit.path.read_bytes() == data["liar"]
