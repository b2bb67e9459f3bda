"""The engine cache's put (``trtet_store.cache.put.Putter.put``, ``_known`` and
``_commit``), each check with the state it exists for:

- digests handed over with the file's identity, the file then rewritten in place with the
  same size and its mtime put back (only its ctime moved), and consumed (a hard link, whose
  own identity check ignores the ctime): the digests are not trusted, the new bytes are read,
  and the put is refused ("no longer holds the bytes") with the source left as it is;
- a file of the cache itself put under another key without ``consume`` is stored (only a
  consume of one is refused);
- ``read_only=True`` on a writable filesystem: a put is skipped and nothing is written;
- a key put again with bytes another key's blob already holds now names that blob; the
  same bytes with new metadata record the new metadata.

Real files in ``tmp_path``; no server, no torch; well under a second each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from trtet_store.cache import BlobCache
from trtet_store.io import file_identity
from trtet_store.io.digests import read_digests

MiB = 1 << 20


def _src(root: Path, name: str, data: bytes) -> Path:
    p = root / name
    p.write_bytes(data)
    return p


def _read(cache: BlobCache, key: str) -> bytes | None:
    hit = cache.get(key, verify="full")
    if hit is None:
        return None
    with hit:
        return os.pread(hit.fileno(), hit.size + 1, 0)


def _state(directory: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                             p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "lock"}


def test_digests_of_a_file_rewritten_with_its_mtime_put_back_are_not_trusted(tmp_path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    old, new = os.urandom(3 * 4096), os.urandom(3 * 4096)
    src = _src(tmp_path, "engine", old)
    fd = os.open(src, os.O_RDONLY)
    try:
        told = dataclasses.replace(read_digests(fd, cache.files.chunk_size),
                                   identity=file_identity(os.fstat(fd)))
    finally:
        os.close(fd)
    st = os.stat(src)
    with open(src, "r+b") as f:  # in place: the same inode and size
        f.write(new)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # its mtime put back
    assert os.stat(src).st_mtime_ns == st.st_mtime_ns
    got = cache.put("a", src, digests=told, consume=True)
    assert not got.stored and "no longer holds the bytes" in (got.reason or ""), got
    assert src.read_bytes() == new  # a skip leaves the source
    assert _read(cache, "a") is None
    assert os.listdir(cache.directory / "blobs") == []


def test_a_file_of_the_cache_put_under_another_key_without_consume_is_stored(tmp_path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = os.urandom(5000)
    assert cache.put("a", _src(tmp_path, "engine", data)).stored
    [blob] = [p for p in (cache.directory / "blobs").iterdir() if not p.name.endswith(".json")]
    got = cache.put("b", blob)
    assert got.stored, got.reason
    assert _read(cache, "a") == data and _read(cache, "b") == data
    assert blob.read_bytes() == data


def test_a_read_only_cache_skips_a_put_and_writes_nothing(tmp_path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    assert cache.put("a", _src(tmp_path, "engine", os.urandom(5000))).stored
    before = _state(cache.directory)
    ro = BlobCache(cache.directory, max_bytes=64 * MiB, read_only=True)
    got = ro.put("b", _src(tmp_path, "other", os.urandom(6000)))
    assert not got.stored and "read-only" in (got.reason or ""), got
    assert _state(cache.directory) == before
    assert not (cache.directory / "keys" / "b.json").exists()


def test_a_key_put_again_with_bytes_another_key_holds_names_that_blob(tmp_path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    x, y = os.urandom(5000), os.urandom(5001)
    assert cache.put("a", _src(tmp_path, "x", x)).stored
    assert cache.put("b", _src(tmp_path, "y", y)).stored
    got = cache.put("a", _src(tmp_path, "y2", y))
    assert got.stored, got.reason
    assert _read(cache, "a") == y and _read(cache, "b") == y
    blobs = sorted(p.name for p in (cache.directory / "blobs").iterdir()
                   if not p.name.endswith(".json"))
    assert len(blobs) == 1, blobs  # x's blob went with a's old record


def test_the_same_bytes_with_new_metadata_record_the_new_metadata(tmp_path):
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = os.urandom(5000)
    assert cache.put("a", _src(tmp_path, "x", data), {"etag": "1"}).stored
    assert cache.put("a", _src(tmp_path, "x2", data), {"etag": "1"}).placement == "dedup"
    got = cache.put("a", _src(tmp_path, "x3", data), {"etag": "2"})
    assert got.stored, got.reason
    hit = cache.get("a")
    assert hit is not None
    with hit:
        assert hit.metadata == {"etag": "2"}


def test_digests_whose_size_is_not_the_file_s_are_not_trusted(tmp_path):
    """Digests handed over with the file's identity but another size: not trusted, so the
    file is read; its bytes are the digest's, so they are stored, under their true size."""
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = os.urandom(3 * 4096)
    src = _src(tmp_path, "engine", data)
    fd = os.open(src, os.O_RDONLY)
    try:
        told = dataclasses.replace(read_digests(fd, cache.files.chunk_size),
                                   identity=file_identity(os.fstat(fd)), size=len(data) - 1)
    finally:
        os.close(fd)
    got = cache.put("a", src, digests=told)
    assert got.stored and got.size == len(data), got
    assert _read(cache, "a") == data
