"""BlobCache in one process: entries, dedup, damage, recovery, clones, skips and refusals.

Cross-process claims (persistence, single flight, LRU, the bound, pins,
kills) are in test_cache_processes.py.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import xxhash

from trtet_store.cache import BlobCache, default_directory
from trtet_store.io import BlobStore, write_file

MiB = 1024 * 1024


def content(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def blob_of(cache: BlobCache, key: str) -> Path:
    return cache.directory / "blobs" / json.loads(
        (cache.directory / "keys" / f"{key}.json").read_text())["blob"]


def leftovers(cache: BlobCache) -> list[str]:
    """Files no entry accounts for (temp files, blobs or seals nothing references)."""
    referenced = {blob_of(cache, e.key).name for e in cache.entries()}
    out = [f"tmp/{n}" for n in os.listdir(cache.directory / "tmp")]
    for n in os.listdir(cache.directory / "blobs"):
        if n.removesuffix(".json") not in referenced:
            out.append(f"blobs/{n}")
    return out


# -- entries ------------------------------------------------------------------------------


def test_put_get_and_identical_bytes_stored_once(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    data = content(1, 5 * MiB + 3)
    a = cache.put("a", write(here_fs / "a", data), {"gpu": "sm90"})
    b = cache.put("b", write(here_fs / "b", data), {"gpu": "sm80"})
    assert a.stored and b.stored and b.placement == "dedup" and a.digest == b.digest
    assert cache.stats().blobs == 1 and cache.stats().bytes == len(data)
    with cache.get("a") as hit:
        assert hit.path.read_bytes() == data and hit.metadata == {"gpu": "sm90"}
        assert hit.digest == xxhash.xxh3_128_hexdigest(data)
        assert len(hit.chunk_digests) == 6
    assert cache.get("b").metadata == {"gpu": "sm80"}
    assert cache.get("missing") is None
    # The blob goes only with its last key.
    assert cache.prune(len(data)) == []  # fits: nothing to evict
    cache.put("a", write(here_fs / "a2", content(2, MiB)))  # a now names other bytes
    assert blob_of(cache, "b").read_bytes() == data
    assert leftovers(cache) == []
    assert sorted(e.key for e in cache.entries()) == ["a", "b"]
    assert {e.key: e.hits for e in cache.entries()} == {"a": 0, "b": 1}


def test_consume_links_the_source_in_and_removes_it_only_once_stored(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=4 * MiB)
    data = content(3, 2 * MiB)
    src = write(here_fs / "engine", data)
    r = cache.put("k", src, consume=True)
    assert r.stored and r.placement == "link" and not src.exists()
    with cache.get("k") as hit:  # sealed again after the source's unlink: no re-digest
        assert not hit.resealed and hit.path.read_bytes() == data
    # Skipped (larger than the bound): the caller keeps its file.
    big = write(here_fs / "big", content(4, 5 * MiB))
    r = cache.put("big", big, consume=True)
    assert r.skipped and "larger than the cache's bound" in r.reason and big.exists()
    assert big.read_bytes() == content(4, 5 * MiB) and leftovers(cache) == []


def test_a_staged_blob_is_consumed_into_the_cache(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = content(7, 3 * MiB + 1)
    with BlobStore(here_fs / "staging") as store:
        blob = store.put(data)
        r = cache.put("k", blob, {"fp": "abc"}, consume=True)
        assert r.stored and r.placement == "link" and blob.consumed and not blob.path.exists()
        # A blob whose file changed since it was sealed is refused, and kept.
        other = store.put(content(8, MiB))
        fd = os.open(other.path, os.O_WRONLY)
        os.pwrite(fd, b"!", 5)
        os.close(fd)
        r = cache.put("k2", other, consume=True)
        assert r.skipped and "no longer holds the bytes it was sealed with" in r.reason
        assert other.path.exists() and not other.consumed
    with cache.get("k") as hit:
        assert hit.path.read_bytes() == data and hit.metadata == {"fp": "abc"}
    assert leftovers(cache) == []


def test_a_pinned_put_hands_back_its_entry_pinned_and_eviction_skips_it(here_fs: Path) -> None:
    """``put(consume=True, pin=True)``: the caller's only copy went into the cache; the entry
    comes back as a hit (sealed identity, digests, no byte read), which no eviction takes."""
    from trtet_store.io import bytes_digested

    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = content(9, 3 * MiB + 5)
    with BlobStore(here_fs / "staging") as store:
        blob = store.put(data)
        digested = bytes_digested()
        r = cache.put("k", blob, {"fp": "abc"}, consume=True, pin=True)
        assert bytes_digested() == digested  # the blob's own digests, the entry's seal
        assert r.stored and r.placement == "link" and blob.consumed
        hit = r.hit
        assert hit is not None and not hit.closed and hit.path == blob_of(cache, "k")
        assert hit.unchanged() and hit.digest == r.digest and hit.metadata == {"fp": "abc"}
        assert hit.path.stat().st_nlink == 1  # the cache's own inode now
        assert cache.prune(0) == []  # pinned: kept
        hit.close()
        assert cache.prune(0) == ["k"]
        # Skipped after the link was made (no room under the bound): the staged blob is
        # its own file again, sealed with its new ctime (a save would refuse it otherwise).
        small = BlobCache(here_fs / "small", max_bytes=4 * MiB)
        small.put("pinned", write(here_fs / "p", content(10, 3 * MiB)))
        held = small.get("pinned")
        other = store.put(content(11, 2 * MiB))
        r = small.put("k", other, consume=True, pin=True)
        held.close()
        assert r.skipped and r.hit is None and not other.consumed
        assert other.identity_matches() and other.path.stat().st_nlink == 1
    assert leftovers(cache) == [] and leftovers(small) == []


def test_the_same_bytes_again_under_a_key_are_kept_and_a_damaged_blob_is_repaired(
        here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = content(9, 2 * MiB)
    cache.put("a", write(here_fs / "s", data))
    r = cache.put("a", write(here_fs / "s2", data))
    assert r.stored and r.placement == "dedup" and "already cached" in r.reason
    blob = blob_of(cache, "a")
    fd = os.open(blob, os.O_WRONLY)
    os.pwrite(fd, b"\0", 0)  # damaged; the same bytes put under another key replace it
    os.close(fd)
    r = cache.put("b", write(here_fs / "s3", data))
    assert r.stored and r.placement == "copy"
    for key in ("a", "b"):
        with cache.get(key) as hit:
            assert hit.path.read_bytes() == data and not hit.resealed
    assert leftovers(cache) == []


def test_prune_and_clear_evict_least_recently_used_but_keep_pinned(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    for i in range(4):
        cache.put(f"k{i}", write(here_fs / f"s{i}", content(50 + i, MiB)))
    for i in (3, 0):
        cache.get(f"k{i}").close()
    assert cache.prune(2 * MiB) == ["k1", "k2"]
    with cache.get("k3"):  # pinned by this hit (its own open file, so its own lock)
        assert cache.clear() == ["k0"]
        assert [e.key for e in cache.entries()] == ["k3"]
    assert cache.clear() == ["k3"] and cache.stats().bytes == 0 and leftovers(cache) == []
    with pytest.raises(ValueError, match="prune's max_bytes"):
        cache.prune(-1)


def test_a_hit_keeps_its_bytes_while_its_key_is_given_new_ones(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    old, new = content(61, MiB), content(62, MiB)
    cache.put("k", write(here_fs / "s1", old))
    with cache.get("k") as hit:
        assert cache.put("k", write(here_fs / "s2", new)).stored
        assert hit.path.read_bytes() == old  # still there to clone or copy from
        assert BlobCache(cache.directory, max_bytes=16 * MiB).recovered == []  # pinned
    with cache.get("k") as hit:
        assert hit.path.read_bytes() == new
    removed = cache.recover()
    assert {p.name for p in removed} == {f"{xxhash.xxh3_128_hexdigest(old)}-{MiB}",
                                         f"{xxhash.xxh3_128_hexdigest(old)}-{MiB}.json"}
    assert leftovers(cache) == []


def test_a_file_of_the_cache_itself_cannot_be_consumed(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = content(60, MiB)
    cache.put("a", write(here_fs / "s", data))
    with cache.get("a") as hit:
        with pytest.raises(ValueError, match="a file of the cache itself"):
            cache.put("b", hit.path, consume=True)
        assert cache.put("b", hit.path).placement == "dedup"
    assert cache.get("a").path.read_bytes() == data


def test_a_callers_file_inside_the_cache_directory_is_linked_in_and_kept_by_recovery(
        here_fs: Path) -> None:
    # The engine cache downloads a remote entry into <cache>/downloads/ (the
    # cache's filesystem, so that the put links it: no second copy of a
    # downloaded engine). Only keys/, blobs/, flights/ and tmp/ are the cache's.
    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = content(63, MiB)
    incoming = cache.directory / "downloads" / "k"
    incoming.mkdir(parents=True)
    kept = write(incoming / "other", b"a resumable download's file")
    result = cache.put("k", write(incoming / "e0", data), consume=True)
    assert (result.stored, result.placement) == (True, "link")
    assert not (incoming / "e0").exists()
    with cache.get("k") as hit:
        assert hit.path.read_bytes() == data
    assert cache.recover() == [] and BlobCache(cache.directory, max_bytes=16 * MiB).recovered == []
    assert kept.read_bytes() == b"a resumable download's file"


def test_bad_keys_metadata_and_sources_are_refused_clearly(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=MiB)
    src = write(here_fs / "s", b"x" * 100)
    for key in ("../x", "", "a/b", ".hidden", "k" * 201, 7):
        with pytest.raises(ValueError, match="not a plain name"):
            cache.put(key, src)
    with pytest.raises(TypeError, match="JSON-serializable"):
        cache.put("k", src, {"x": object()})
    with pytest.raises(ValueError, match="not a regular file"):
        cache.put("k", here_fs)
    with pytest.raises(TypeError):
        cache.put("k", src, consum=True)  # unknown keyword
    with pytest.raises(ValueError, match="timeout"), cache.single_flight("k", timeout=-1):
        pass


# -- damage -----------------------------------------------------------------------------


@pytest.fixture
def damaged(here_fs: Path):
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    data = content(5, 3 * MiB + 5)
    assert cache.put("k", write(here_fs / "s", data)).stored
    return cache, blob_of(cache, "k"), data


def test_a_truncated_entry_is_a_miss_and_dropped(damaged, caplog) -> None:
    cache, blob, _ = damaged
    os.truncate(blob, blob.stat().st_size - 1)
    assert cache.get("k") is None
    assert "dropping damaged blob" in caplog.text and "truncated" in caplog.text
    assert cache.entries() == [] and leftovers(cache) == [] and not blob.exists()


def test_a_flipped_byte_is_a_miss_never_served(damaged, caplog) -> None:
    cache, blob, data = damaged
    st = blob.stat()
    fd = os.open(blob, os.O_WRONLY)
    os.pwrite(fd, bytes([data[2 * MiB + 1] ^ 0x01]), 2 * MiB + 1)
    os.close(fd)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime tells
    assert cache.get("k") is None
    assert "digest mismatch (first bad chunk 2)" in caplog.text
    assert cache.entries() == [] and not blob.exists()


def test_an_entry_replaced_by_another_file_of_its_size_is_a_miss(damaged, here_fs) -> None:
    cache, blob, data = damaged
    other = write(here_fs / "other", content(6, len(data)))
    os.rename(other, blob)
    assert cache.get("k") is None
    assert cache.entries() == []


@pytest.mark.parametrize("plant", ["fifo", "link"])
def test_a_blob_replaced_by_a_fifo_or_link_is_dropped_without_opening_it(
        damaged, here_fs, plant) -> None:
    """get() refuses the plant; dropping the key then unlinks it as it is: a FIFO never
    blocks the drop (it holds the cache's lock), a link's target is never opened."""
    import threading

    cache, blob, _ = damaged
    outside = write(here_fs / "outside", b"not the cache's")
    os.unlink(blob)
    if plant == "fifo":
        os.mkfifo(blob)
    else:
        os.symlink(outside, blob)
    got: list = []
    getter = threading.Thread(target=lambda: got.append(cache.get("k")), daemon=True)
    getter.start()
    getter.join(10)
    assert not getter.is_alive(), "get() blocked on the planted FIFO"
    assert got == [None] and cache.entries() == [] and not os.path.lexists(blob)
    assert outside.read_bytes() == b"not the cache's"
    assert leftovers(cache) == []


def test_same_bytes_under_a_new_identity_are_resealed_and_served(damaged, here_fs) -> None:
    cache, blob, data = damaged
    copy = write(here_fs / "copy", data)  # e.g. restored from a backup: a new inode
    os.rename(copy, blob)
    with cache.get("k") as hit:
        assert hit.resealed and hit.path.read_bytes() == data
    with cache.get("k") as hit:
        assert not hit.resealed  # the new identity was recorded


def test_verify_re_digests_everything_and_drops_bad_entries(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    for i in range(3):
        cache.put(f"k{i}", write(here_fs / f"s{i}", content(10 + i, MiB)))
    assert cache.verify().ok
    blob = blob_of(cache, "k1")
    fd = os.open(blob, os.O_WRONLY)
    os.pwrite(fd, b"\0", 10)
    os.close(fd)
    report = cache.verify()
    assert report.checked == 3 and [k for k, _ in report.dropped] == ["k1"]
    assert sorted(e.key for e in cache.entries()) == ["k0", "k2"]


# -- crash leftovers ------------------------------------------------------------------------


def test_open_cleans_what_a_killed_insert_or_eviction_left(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    data = content(20, MiB)
    cache.put("keep", write(here_fs / "s", data))
    d = cache.directory
    write(d / "tmp" / "999-dead", b"partial copy")  # a dead writer's temp file
    live = write(d / "tmp" / "998-live", b"being written")  # a live writer's (we lock it)
    live_fd = os.open(live, os.O_RDONLY)
    fcntl.flock(live_fd, fcntl.LOCK_EX)
    name = "0" * 32 + "-5"
    write(d / "blobs" / name, b"12345")  # renamed in, killed before its seal
    write(d / "blobs" / ("1" * 32 + "-5.json"), b"{}")  # a seal whose blob was evicted
    sealed = "3" * 32 + "-4"  # sealed, killed before its record (or an eviction's record gone)
    write(d / "blobs" / sealed, b"abcd")
    write(d / "blobs" / f"{sealed}.json", b"{}")
    keep_blob = blob_of(cache, "keep").name
    write(d / "keys" / "gone.json", json.dumps(  # a record whose blob was evicted
        {"key": "gone", "blob": "2" * 32 + "-9", "size": 9, "created": 1.0, "metadata": {}})
        .encode())
    write(d / "keys" / "torn.json", b'{"key": "to')
    write(d / "keys" / "orphan.use", b"hh")
    try:
        again = BlobCache(d, max_bytes=64 * MiB)
        removed = {p.relative_to(d).as_posix() for p in again.recovered}
        assert removed == {"tmp/999-dead", f"blobs/{name}", "blobs/" + "1" * 32 + "-5.json",
                           f"blobs/{sealed}", f"blobs/{sealed}.json",
                           "keys/gone.json", "keys/torn.json", "keys/orphan.use"}
        assert live.exists()
        assert [e.key for e in again.entries()] == ["keep"]
        assert blob_of(again, "keep").name == keep_blob
        assert again.get("keep").path.read_bytes() == data
    finally:
        os.close(live_fd)
    assert again.recover() == [d / "tmp" / "998-live"]


# -- placement on real filesystems ------------------------------------------------------------


def test_a_64_mib_entry_on_xfs_is_a_clone_that_adds_no_used_bytes(make_fs) -> None:
    mnt = make_fs("xfs", 400)  # reflink=1 is mkfs.xfs's default
    data = content(30, 64 * MiB)
    src = write(mnt / "engine", data)
    os.sync()
    cache = BlobCache(mnt / "cache", max_bytes=256 * MiB)

    def used() -> int:
        st = os.statvfs(mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    before = used()
    r = cache.put("k", src)
    os.sync()
    grew = used() - before
    assert r.stored and r.placement == "clone", r
    assert grew <= MiB, f"the cache's copy used {grew} bytes"
    assert src.read_bytes() == data
    # And a hit placed into an output on the same filesystem costs no bytes either.
    with cache.get("k") as hit:
        before = used()
        report = write_file(mnt / "out.bin", [b"\0" * 4096, hit.external_file()])
        os.sync()
        assert used() - before <= MiB + 4096, report
    assert (mnt / "out.bin").read_bytes()[4096:] == data


def test_on_ext4_a_put_copies(make_fs) -> None:
    mnt = make_fs("ext4", 64)
    data = content(31, 4 * MiB)
    cache = BlobCache(mnt / "cache", max_bytes=32 * MiB)
    r = cache.put("k", write(mnt / "s", data))
    assert r.stored and r.placement == "copy"
    assert cache.get("k").path.read_bytes() == data


# -- skips ---------------------------------------------------------------------------------------


def test_not_enough_free_space_above_min_free_is_a_skip_with_nothing_left(make_fs,
                                                                            here_fs) -> None:
    mnt = make_fs("ext4", 64)
    cache = BlobCache(mnt / "cache", max_bytes=1024 * MiB, min_free=8 * MiB)
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    data = content(32, free - 4 * MiB)  # fits the disk, not above min_free
    src = write(here_fs / "big", data)
    r = cache.put("k", src)
    assert r.skipped and "not enough free space" in r.reason and "min_free" in r.reason
    assert src.read_bytes() == data and leftovers(cache) == [] and cache.entries() == []
    small = cache.put("s", write(here_fs / "small", content(33, MiB)))
    assert small.stored


def test_larger_than_the_bound_is_a_skip(here_fs: Path, caplog) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=MiB)
    r = cache.put("k", write(here_fs / "s", content(34, MiB + 1)))
    assert r.skipped and r.reason == f"{MiB + 1} bytes is larger than the cache's bound of " \
        f"{MiB} bytes"
    assert "k not stored" in caplog.text
    assert leftovers(cache) == []


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1])
def test_max_bytes_zero_or_negative_is_refused(here_fs: Path, value: int) -> None:
    with pytest.raises(ValueError, match=f"max_bytes must be positive bytes, got {value}"):
        BlobCache(here_fs / "c", max_bytes=value)
    assert not (here_fs / "c").exists()


def test_other_bad_numbers_are_refused(here_fs: Path) -> None:
    with pytest.raises(ValueError, match="min_free must be zero or more"):
        BlobCache(here_fs / "c", max_bytes=1, min_free=-1)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        BlobCache(here_fs / "c", max_bytes=True)
    with pytest.raises(TypeError):
        BlobCache(here_fs / "c", max_bytes=1, max_byte=2)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_directory_or_file_owned_by_another_user_is_refused(here_fs: Path) -> None:
    d = here_fs / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(PermissionError, match=r"owned by uid 65534, not by you \(uid 0\)"):
        BlobCache(d, max_bytes=MiB)
    mine = BlobCache(here_fs / "mine", max_bytes=MiB)
    planted = write(mine.directory / "blobs" / ("a" * 32 + "-3"), b"bad")
    os.chown(planted, 65534, 65534)
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        BlobCache(mine.directory, max_bytes=MiB)
    assert planted.exists()  # refused, never removed


def test_a_directory_writable_by_others_is_refused(here_fs: Path) -> None:
    d = here_fs / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(PermissionError, match="writable by others"):
        BlobCache(d, max_bytes=MiB)


def test_the_default_directory_is_per_user_and_private(here_fs: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(here_fs / "xdg"))
    assert default_directory() == here_fs / "xdg" / "trtet_store" / "engines"
    cache = BlobCache(max_bytes=MiB)
    assert cache.directory == default_directory()
    assert cache.directory.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # ignored, as the spec says
    monkeypatch.setenv("HOME", str(here_fs / "home"))
    assert default_directory() == here_fs / "home" / ".cache" / "trtet_store" / "engines"


def test_a_permission_error_while_caching_is_a_skip_with_its_reason(make_fs, caplog) -> None:
    # Root passes permission bits, so the immutable flag makes the refusal (EPERM).
    mnt = make_fs("ext4", 64)
    cache = BlobCache(mnt / "cache", max_bytes=32 * MiB)
    data = content(44, MiB)
    src = write(mnt / "s", data)
    subprocess.run(["chattr", "+i", os.fspath(cache.directory / "tmp")], check=True)
    try:
        for consume in (False, True):
            r = cache.put("k", src, consume=consume)
            assert r.skipped and "Operation not permitted" in r.reason, r
            assert src.read_bytes() == data
    finally:
        subprocess.run(["chattr", "-i", os.fspath(cache.directory / "tmp")], check=True)
    assert "k not stored" in caplog.text
    assert cache.entries() == [] and leftovers(cache) == []
    assert cache.put("k", src).stored


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_a_cache_through_a_read_only_bind_mount_skips_puts(here_fs: Path) -> None:
    data = content(42, MiB)
    BlobCache(here_fs / "rw", max_bytes=8 * MiB).put("k", write(here_fs / "s", data))
    ro = here_fs / "ro"
    ro.mkdir(mode=0o700)
    subprocess.run(["mount", "--bind", os.fspath(here_fs / "rw"), os.fspath(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", os.fspath(ro)], check=True)
        cache = BlobCache(ro, max_bytes=8 * MiB)
        assert cache.read_only
        assert cache.get("k").path.read_bytes() == data
        r = cache.put("new", write(here_fs / "n", content(43, MiB)))
        assert r.skipped and "read-only" in r.reason
        with pytest.raises(OSError, match="read-only"):
            cache.prune()
    finally:
        subprocess.run(["umount", os.fspath(ro)], check=True)


def test_a_cache_on_a_read_only_filesystem_serves_hits_and_skips_puts(make_fs, here_fs) -> None:
    mnt = make_fs("ext4", 64)
    data = content(40, 2 * MiB)
    BlobCache(mnt / "cache", max_bytes=32 * MiB).put("k", write(mnt / "s", data))
    subprocess.run(["mount", "-o", "remount,ro", os.fspath(mnt)], check=True)
    try:
        cache = BlobCache(mnt / "cache", max_bytes=32 * MiB)
        assert cache.read_only
        with cache.get("k") as hit:
            assert hit.path.read_bytes() == data
        src = write(here_fs / "new", content(41, MiB))
        r = cache.put("new", src, consume=True)
        assert r.skipped and "read-only" in r.reason and src.exists()
        with pytest.raises(OSError, match="cannot create the engine cache") as exc:
            BlobCache(mnt / "other", max_bytes=MiB)
        assert exc.value.errno == errno.EROFS
    finally:
        subprocess.run(["mount", "-o", "remount,rw", os.fspath(mnt)], check=True)
