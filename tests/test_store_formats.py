"""A content store written by the code before io.SealedDir opens, hits and is not re-digested.

The fixture is written by the old writer (``OLD_SEAL``, copied from
``sets/store.py`` before the store was built on :class:`trtet_store.io.SealedDir`):
a seal is identity-bound (device, inode, mtime, ctime), so it cannot be a
file under tests/data; it is made here, the old way, on the blob as it lies.
The new store must trust it with one ``lstat`` (``io.bytes_digested()`` does
not move), follow its references, and write the very same bytes itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash
from attacker import tree

from trtet_store.io import bytes_digested, file_identity, write_atomic
from trtet_store.sets.store import ContentStore

CHUNK = 4096


def old_seal(root: Path, digest: str, st: os.stat_result, **extra: str) -> None:
    """``ContentStore.seal`` / ``refer`` of the old code: its document, as it wrote it."""
    doc = {"xxh3": digest, "size": st.st_size, "identity": list(file_identity(st)), **extra}
    (root / ".trtet-seals").mkdir(mode=0o700, exist_ok=True)
    write_atomic(root / ".trtet-seals" / digest, json.dumps(doc).encode(), mode=0o444)


def _blob(root: Path, data: bytes) -> tuple[str, tuple[int, ...]]:
    digest = xxhash.xxh3_128(data).hexdigest()
    (root / digest).write_bytes(data)
    os.chmod(root / digest, 0o444)
    chunks = tuple(xxhash.xxh3_64_intdigest(data[i:i + CHUNK])
                   for i in range(0, len(data), CHUNK))
    return digest, chunks


def test_an_old_store_hits_unread_and_its_references_are_followed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir(mode=0o700)
    a, b = b"A" * (3 * CHUNK + 1), b"B" * (2 * CHUNK + 5)
    da, chunks_a = _blob(root, a)
    old_seal(root, da, os.lstat(root / da))
    signed = "c" * 64
    db, _ = _blob(root, b)
    old_seal(root, db, os.lstat(root / db), sha256=signed)
    placed = tmp_path / "member" / "x.ptd"  # a reference: the blob moved into a member
    placed.parent.mkdir()
    placed.write_bytes(b"R" * 5000)
    dr = xxhash.xxh3_128(placed.read_bytes()).hexdigest()
    old_seal(root, dr, os.lstat(placed), ref=os.fspath(placed))
    before_tree = tree(root)

    digested = bytes_digested()
    cas = ContentStore(root)
    assert cas.sealed(da) and cas.sealed(db)
    assert cas.check(da, len(a), CHUNK, chunks_a) is True  # trusted: not read
    assert cas.reference(dr, 5000) == placed
    assert bytes_digested() == digested
    assert tree(root) == before_tree  # opening and hitting wrote nothing
    assert json.loads(cas.seal_path(db).read_bytes())["sha256"] == signed

    assert cas.take_reference(dr, 5000, CHUNK)  # copied from the member, sealed unread
    assert (root / dr).read_bytes() == placed.read_bytes()
    assert bytes_digested() == digested
    # The control: a blob whose identity moved (a set mtime) is read once, and resealed.
    os.utime(root / da, ns=(1, 1))
    assert cas.check(da, len(a), CHUNK, chunks_a) is False
    assert bytes_digested() == digested + len(a) and cas.sealed(da)


def test_the_new_store_writes_the_old_seal_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir(mode=0o700)
    d, _ = _blob(root, b"S" * 9000)
    old_seal(root, d, os.lstat(root / d))
    old = (root / ".trtet-seals" / d).read_bytes()
    os.unlink(root / ".trtet-seals" / d)
    ContentStore(root).seal(d)
    assert (root / ".trtet-seals" / d).read_bytes() == old


# -- the engine cache's directory, as e040da2's BlobCache wrote it ---------------------------


def old_cache_entry(directory: Path, key: str, data: bytes, chunk: int) -> str:
    """e040da2's ``Puts._commit`` of ``data`` under ``key``: blob, seal, use stamp, record."""
    from trtet_store.io import digest_file

    digest = xxhash.xxh3_128(data).hexdigest()
    name = f"{digest}-{len(data)}"
    blob = directory / "blobs" / name
    blob.write_bytes(data)
    _, chunks, _ = digest_file(blob, chunk, False)
    seal = {"size": len(data), "digest": digest, "chunk_size": chunk,
            "chunk_digests": list(chunks), "identity": list(file_identity(os.stat(blob)))}
    write_atomic(directory / "blobs" / f"{name}.json", json.dumps(seal, sort_keys=True).encode(),
                 temp_dir=directory / "tmp")
    use = directory / "keys" / f"{key}.use"
    use.write_bytes(b"")
    write_atomic(directory / "keys" / f"{key}.json", json.dumps(
        {"key": key, "blob": name, "size": len(data), "created": 1.5e9, "metadata": {"m": 1}},
        sort_keys=True).encode(), temp_dir=directory / "tmp")
    return name


def test_an_old_cache_directory_hits_unread_and_the_new_cache_seals_as_it_did(
        tmp_path: Path) -> None:
    from trtet_store.cache import BlobCache
    from trtet_store.io import MiB

    directory = tmp_path / "c"
    BlobCache(directory, max_bytes=64 * MiB)  # the layout (CACHEDIR.TAG, keys/, blobs/, ...)
    data = os.urandom(2 * MiB + 5)
    name = old_cache_entry(directory, "k" * 16, data, MiB)
    old_seal_bytes = (directory / "blobs" / f"{name}.json").read_bytes()
    before_blobs = tree(directory / "blobs")

    digested = bytes_digested()
    cache = BlobCache(directory, max_bytes=64 * MiB)  # opened to write: recovery keeps it
    for _ in range(2):
        with cache.get("k" * 16) as hit:
            assert hit.path.read_bytes() == data
            assert (hit.metadata, hit.resealed, hit.verified) == ({"m": 1}, False, False)
            assert hit.identity == tuple(json.loads(old_seal_bytes)["identity"])
    assert [e.key for e in cache.entries()] == ["k" * 16]
    assert bytes_digested() == digested  # trusted by its old seal: not one byte digested
    assert tree(directory / "blobs") == before_blobs  # nothing resealed or rewritten

    # The new put writes the very seal the old one did, for the same file.
    os.unlink(directory / "blobs" / name)
    os.unlink(directory / "blobs" / f"{name}.json")
    (tmp_path / "src").write_bytes(data)
    assert cache.put("k" * 16, tmp_path / "src").stored
    st = os.stat(directory / "blobs" / name)
    want = dict(json.loads(old_seal_bytes), identity=list(file_identity(st)))
    assert (directory / "blobs" / f"{name}.json").read_bytes() == \
        json.dumps(want, sort_keys=True).encode()
