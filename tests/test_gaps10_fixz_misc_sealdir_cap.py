"""The engine cache's seals (a SealedDir with ``beside=True``) hold every chunk digest of
their blob, so they are read under their own cap (BESIDE_MAX_BYTES), never the content
store's 64 KiB SEAL_MAX_BYTES: at the cache's 1 MiB chunks a seal passes 64 KiB for a blob
of about 3 GiB, and read_seal under the store's cap would drop every such entry at its hit
("has no valid seal") and make its engine be built again each time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash
from attacker import tree

from trtet_store.cache import BlobCache
from trtet_store.io import MiB, Seal, SealedDir
from trtet_store.io.sealdir import BESIDE_MAX_BYTES, SEAL_MAX_BYTES


def test_a_cache_hit_whose_seal_is_over_64_kib_is_served_not_dropped(tmp_path: Path) -> None:
    # 96 KiB in 16-byte chunks: 6144 chunk digests, the seal well over 64 KiB (as a 3 GiB
    # blob's is at the default 1 MiB chunks), yet far under the engine cache's own cap.
    data = os.urandom(96 * 1024)
    src = tmp_path / "engine.bin"
    src.write_bytes(data)
    cache = BlobCache(tmp_path / "c", max_bytes=4 * MiB, chunk_size=16)
    cache.put("k", src, {"gpu": "sm90"})
    seals = list((tmp_path / "c" / "blobs").glob("*.json"))
    assert len(seals) == 1
    seal_bytes = seals[0].stat().st_size
    assert SEAL_MAX_BYTES < seal_bytes < BESIDE_MAX_BYTES, seal_bytes
    before = tree(tmp_path / "c" / "blobs")

    again = BlobCache(tmp_path / "c", max_bytes=4 * MiB, chunk_size=16)  # a later process
    hit = again.get("k")
    assert hit is not None, f"a hit with a {seal_bytes}-byte seal was dropped: " \
        f"{again.dropped}"
    with hit:
        assert os.pread(hit.fileno(), len(data) + 1, 0) == data
        assert hit.metadata == {"gpu": "sm90"}
    assert again.dropped == {}
    assert tree(tmp_path / "c" / "blobs") == before, "the blob or its seal was changed"
    assert again.get("k") is not None  # still there for the next one


def test_the_seal_of_a_4_gib_blob_in_1_mib_chunks_is_read_back(tmp_path: Path) -> None:
    """The sealdir's read_seal of a 4 GiB blob's seal (4096 chunk digests of 1 MiB), as the
    engine cache writes it: read whole, not refused for passing the store's 64 KiB."""
    root = tmp_path / "blobs"
    root.mkdir(mode=0o700)
    d = SealedDir(root, beside=True, temp_dir=tmp_path)
    size = 4096 * MiB
    name = f"{xxhash.xxh3_128(b'x').hexdigest()}-{size}"
    chunks = tuple((2**64 - 1 - i) for i in range(4096))  # 20 digits each, as xxh3-64s may be
    seal = Seal(size, name.split("-")[0], MiB, chunks, (1, 2, size, 3, 4))
    d.write(name, seal)
    raw = d.seal_path(name).read_bytes()
    assert len(raw) > SEAL_MAX_BYTES and json.loads(raw)["chunk_digests"][0] == 2**64 - 1
    assert d.read_seal(name) is not None, "a 4 GiB blob's seal was refused at the 64 KiB cap"
    assert d.read(name) == seal
    # The store's form keeps its small cap: a seal there over 64 KiB is not trusted.
    store = SealedDir(tmp_path / "store", todo="remove it")
    (store.root / ".trtet-seals").mkdir(mode=0o700)
    store.seal_path("n").write_bytes(b" " * SEAL_MAX_BYTES + b"{}")
    assert store.read_seal("n") is None
