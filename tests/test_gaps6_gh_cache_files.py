"""The cache's own files at the states their checks exist for (gap hunt, hardening round 5).

A record that names another key, or a blob outside ``blobs/``; a link planted at a key's
use stamp (on a hit, and before the put that writes it); a source of exactly the bound;
a re-put over a blob damaged in place; two keys sharing one blob when one is evicted; a
blob replaced between its pin and the check that it is still the entry's. Each proves
what is outside the cache is byte-identical and the surviving entries serve their bytes.

Functions whose checks these set up: ``cache.files`` (CacheFiles.read_entry, stamp),
``cache.put`` (Putter._put, _known), ``cache.store`` (BlobCache.get's pin and its check that
the pinned blob is still the entry's), ``cache.evict`` (Evictor.evict, and drop_blob's
same_identity check: a blob repaired by another put before the drop's lock is kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cache import BlobCache

MiB = 1 << 20


def content(seed: int, size: int = 64 * 1024) -> bytes:
    return random.Random(seed).randbytes(size)


def source(tmp: Path, name: str, data: bytes) -> Path:
    (tmp / "src").mkdir(exist_ok=True)
    path = tmp / "src" / name
    path.write_bytes(data)
    return path


def read_hit(cache: BlobCache, key: str) -> bytes | None:
    hit = cache.get(key)
    if hit is None:
        return None
    with hit:
        return os.pread(hit.fileno(), hit.size + 1, 0)


def record(cache: BlobCache, key: str) -> dict:
    return json.loads((cache.directory / "keys" / f"{key}.json").read_text())


def victim(tmp: Path, name: str = "victim") -> tuple[Path, tuple]:
    path = tmp / name
    path.write_bytes(b"the victim's own bytes\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    st = os.lstat(path)
    return path, (file_digest(path), st.st_size, st.st_mtime_ns, st.st_mode)


def unchanged(path: Path) -> tuple:
    st = os.lstat(path)
    return (file_digest(path), st.st_size, st.st_mtime_ns, st.st_mode)


def test_a_record_that_names_another_key_is_not_this_key_s_entry(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    a, b = content(1), content(2)
    cache.put("a", source(tmp_path, "a", a))
    cache.put("b", source(tmp_path, "b", b))
    # keys/a.json rewritten with b's record (a copy, a restore gone wrong): a is not b.
    (cache.directory / "keys" / "a.json").write_text(json.dumps(record(cache, "b")))
    assert read_hit(cache, "a") is None
    assert read_hit(cache, "b") == b


@pytest.mark.parametrize("blob", ["../../victim", "../keys/b.json", "x/../../../victim"])
def test_a_record_naming_a_blob_outside_blobs_never_reaches_it(tmp_path: Path,
                                                               blob: str) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    path, before = victim(tmp_path)
    (tmp_path / "victim.json").write_text("{}")  # where a seal of "../../victim" would be
    b = content(2)
    cache.put("a", source(tmp_path, "a", content(1)))
    cache.put("b", source(tmp_path, "b", b))
    rec = record(cache, "a")
    (cache.directory / "keys" / "a.json").write_text(json.dumps(dict(rec, blob=blob)))
    assert read_hit(cache, "a") is None
    cache.recover()
    assert unchanged(path) == before and (tmp_path / "victim.json").read_text() == "{}"
    assert read_hit(cache, "b") == b and record(cache, "b")["key"] == "b"


def test_a_hit_never_stamps_its_use_through_a_planted_link(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(1)
    cache.put("a", source(tmp_path, "a", data))
    path, before = victim(tmp_path)
    use = cache.directory / "keys" / "a.use"
    os.unlink(use)
    os.symlink(path, use)
    assert read_hit(cache, "a") == data  # a use not recorded costs LRU precision, not the hit
    assert unchanged(path) == before
    assert os.path.islink(use)


def test_a_put_never_writes_its_use_stamp_through_a_planted_link(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    path, before = victim(tmp_path)
    os.symlink(path, cache.directory / "keys" / "a.use")
    with contextlib.suppress(OSError):  # refused (ELOOP) is fine; writing through it is not
        cache.put("a", source(tmp_path, "a", content(1)))
    assert unchanged(path) == before  # not truncated, no mtime put on it


def test_a_source_of_exactly_the_bound_is_stored(tmp_path: Path) -> None:
    data = content(3, 256 * 1024)
    cache = BlobCache(tmp_path / "c", max_bytes=len(data))
    got = cache.put("a", source(tmp_path, "a", data))
    assert got.stored, got.reason
    assert read_hit(cache, "a") == data
    over = BlobCache(tmp_path / "d", max_bytes=len(data) - 1)
    got = over.put("a", source(tmp_path, "a", data))
    assert not got.stored and "larger than the cache's bound" in (got.reason or "")


def test_a_put_of_the_same_bytes_over_a_blob_damaged_in_place_repairs_it(tmp_path: Path
                                                                          ) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(4)
    cache.put("a", source(tmp_path, "a", data))
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    with open(blob, "r+b") as f:  # a media error: the same size, other bytes
        f.write(b"\0" * 4096)
    again = cache.put("a", source(tmp_path, "a2", data))
    assert again.stored and again.placement != "dedup", again
    assert read_hit(cache, "a") == data
    assert blob.read_bytes() == data


def test_evicting_one_of_two_keys_that_share_a_blob_keeps_the_blob(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    shared, other = content(5), content(6)
    # Least recently used first: a, then c; b (a's bytes) last.
    for key, data in (("a", shared), ("c", other), ("b", shared)):
        assert cache.put(key, source(tmp_path, key, data)).stored
    evicted = cache.prune(len(shared))
    assert "a" in evicted and "b" not in evicted, evicted
    assert read_hit(cache, "b") == shared


def test_a_blob_replaced_after_its_pin_is_a_miss_not_a_hit(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The pin taken, then the entry's blob replaced (an eviction and a new put of the key
    between the record's read and the lock): the pinned file is no longer the entry's."""
    import trtet_store.cache.store as store_mod

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(7)
    cache.put("a", source(tmp_path, "a", data))
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    real = store_mod.refuse_foreign
    swapped = []

    def barrier(path, st, what):  # runs right after the pin's fstat
        if what == "blob" and not swapped:
            fresh = tmp_path / "fresh"
            fresh.write_bytes(data)
            os.rename(fresh, blob)  # the same name, another inode
            swapped.append(True)
        return real(path, st, what)

    monkeypatch.setattr(store_mod, "refuse_foreign", barrier)
    assert cache.get("a") is None and swapped


def test_a_key_put_again_with_other_bytes_leaves_only_its_new_blob(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    cache.put("a", source(tmp_path, "a", content(8)))
    old = record(cache, "a")["blob"]
    new_data = content(9)
    cache.put("a", source(tmp_path, "a2", new_data))
    new = record(cache, "a")["blob"]
    assert new != old
    assert sorted(os.listdir(cache.directory / "blobs")) == [new, f"{new}.json"]
    assert read_hit(cache, "a") == new_data


def test_a_record_whose_size_is_not_its_seal_s_is_dropped(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(10)
    cache.put("a", source(tmp_path, "a", data))
    rec = record(cache, "a")
    (cache.directory / "keys" / "a.json").write_text(json.dumps(dict(rec, size=rec["size"] - 1)))
    assert cache.get("a") is None
    assert not (cache.directory / "keys" / "a.json").exists()
    assert "no valid seal" in cache.dropped.get("a", "") or "a" not in cache.dropped


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_copied_blob_is_readable_by_its_owner_only_whatever_the_umask(tmp_path: Path,
                                                                       umask: int) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    src = source(tmp_path, "a", content(11))
    os.chmod(src, 0o644)
    old = os.umask(umask)
    try:
        assert cache.put("a", src).stored
    finally:
        os.umask(old)
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    assert os.stat(blob).st_mode & 0o777 == 0o600


def test_a_cache_of_zero_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes must be positive bytes, got 0"):
        BlobCache(tmp_path / "c", max_bytes=0)
    assert not (tmp_path / "c").exists()
    assert BlobCache(tmp_path / "d", max_bytes=1).stats().max_bytes == 1


def test_a_file_of_the_cache_itself_cannot_be_consumed(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(12)
    cache.put("a", source(tmp_path, "a", data))
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    with pytest.raises(ValueError, match="is a file of the cache itself"):
        cache.put("b", blob, consume=True)
    assert blob.read_bytes() == data and read_hit(cache, "a") == data
    assert not (cache.directory / "keys" / "b.json").exists()


def test_a_source_that_grows_while_it_is_consumed_is_not_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source appended to after its size was taken, before its bytes are read back."""
    from trtet_store.cache.put import Putter

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(13)
    src = source(tmp_path, "a", data)
    real = Putter._known

    def barrier(self, *args):  # after the stat that gave the size, before the link and read
        with open(src, "ab") as f:
            f.write(b"appended by the writer")
        return real(self, *args)

    monkeypatch.setattr(Putter, "_known", barrier)
    got = cache.put("a", src, consume=True)
    assert not got.stored and "changed size while it was cached" in (got.reason or ""), got
    assert src.read_bytes() == data + b"appended by the writer"  # a skip leaves the source
    assert cache.get("a") is None and os.listdir(cache.directory / "blobs") == []


def test_given_digests_of_other_bytes_without_the_cache_s_chunks_are_not_stored(
        tmp_path: Path) -> None:
    from trtet_store.io import Digests

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(14)
    src = source(tmp_path, "a", data)
    # Of another span than the cache's (no chunk digests to compare), and another digest.
    told = Digests("0" * 32, len(data), len(data), (0,), None)
    got = cache.put("a", src, digests=told)
    assert not got.stored and "no longer holds the bytes" in (got.reason or ""), got
    assert cache.get("a") is None


def test_a_damaged_blob_repaired_by_another_put_before_its_drop_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """get() finds the blob damaged; before it takes the lock to drop it, another process's
    put of the same bytes has renamed a good blob in: the good one and its records stay."""
    from trtet_store.cache.files import CacheFiles

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(15)
    cache.put("a", source(tmp_path, "a", data))
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    with open(blob, "r+b") as f:
        f.write(b"\0" * 4096)
    real = CacheFiles.locked
    armed = []

    @contextlib.contextmanager
    def barrier(self):
        if armed and armed.pop():
            fresh = tmp_path / "repaired"
            fresh.write_bytes(data)
            os.rename(fresh, blob)
        with real(self):
            yield

    monkeypatch.setattr(CacheFiles, "locked", barrier)
    armed.append(True)
    assert cache.get("a") is None  # the damaged file was never served
    assert not armed  # the repair ran, before the drop's lock
    monkeypatch.undo()
    assert read_hit(cache, "a") == data


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize("what", ["record", "seal", "blob"])
def test_a_record_seal_or_blob_of_another_uid_is_refused_on_a_hit_and_left_alone(
        tmp_path: Path, what: str) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(16)
    cache.put("a", source(tmp_path, "a", data))
    name = record(cache, "a")["blob"]
    path = {"record": cache.directory / "keys" / "a.json",
            "seal": cache.directory / "blobs" / f"{name}.json",
            "blob": cache.directory / "blobs" / name}[what]
    os.chown(path, 65534, 65534)  # another user's file in its place
    before = (file_digest(path), os.lstat(path).st_mode)
    with pytest.raises(PermissionError, match=f"engine cache {what} .* owned by uid 65534"):
        cache.get("a")
    st = os.lstat(path)
    assert (file_digest(path), st.st_mode) == before and st.st_uid == 65534  # never removed


def test_given_digests_of_another_chunk_span_are_not_sealed_as_the_cache_s(tmp_path: Path
                                                                           ) -> None:
    """Digests taken in 64 KiB chunks, handed to a cache of 1 MiB chunks: a seal needs the
    cache's span, so the blob is digested, and its hit's chunks are of the cache's span."""
    from trtet_store.io import Digester, Digests, file_identity

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB, chunk_size=MiB)
    data = content(17, 3 * MiB + 5)
    src = source(tmp_path, "a", data)
    d = Digester(64 * 1024)
    d.update(data)
    digest, chunks = d.finish()
    told = Digests(digest, len(data), 64 * 1024, tuple(chunks), file_identity(src.stat()))
    assert cache.put("a", src, digests=told).stored
    with cache.get("a", verify="full") as hit:
        assert hit.chunk_size == MiB and len(hit.chunk_digests) == 4
        assert hit.digest == digest


def test_a_blob_replaced_while_its_hit_waited_for_the_pin_keeps_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blob's name is empty at the pin's open (an eviction and a put's repair in flight),
    and there again right after: a miss for this get, the key kept for the next."""
    import trtet_store.cache.store as store_mod

    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = content(18)
    cache.put("a", source(tmp_path, "a", data))
    blob = cache.directory / "blobs" / record(cache, "a")["blob"]
    aside = tmp_path / "aside"
    real = store_mod.try_lock
    done = []

    def barrier(path, **kw):
        if Path(path) == blob and not done:
            done.append(True)
            os.rename(blob, aside)  # gone at the open...
            try:
                return real(path, **kw)
            finally:
                os.rename(aside, blob)  # ...and back before the look that follows
        return real(path, **kw)

    monkeypatch.setattr(store_mod, "try_lock", barrier)
    assert cache.get("a") is None and done
    monkeypatch.undo()
    assert (cache.directory / "keys" / "a.json").exists()
    assert read_hit(cache, "a") == data
