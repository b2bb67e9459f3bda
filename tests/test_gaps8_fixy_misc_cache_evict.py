"""The engine cache's ``make_room`` (``trtet_store.cache.evict.Evictor``), two states set up.

* A dedup put (the same bytes as an entry already cached, put under a new key) whose commit
  must make room: ``make_room(..., keep_blob=...)`` never evicts the entry whose blob the
  dedup keeps, or the new record would name a blob that eviction just removed.
* A filesystem short of ``min_free``: after each eviction the free space is looked at
  again, so an eviction that frees enough is the last one (not "all evicted, then not
  enough free space").

Both on real filesystems (the root disk, a small tmpfs); nothing mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _blobs(cache: BlobCache) -> list[str]:
    return sorted(p.name for p in (cache.directory / "blobs").iterdir()
                  if not p.name.endswith(".json"))


def _keys(cache: BlobCache) -> list[str]:
    return sorted(p.name for p in (cache.directory / "keys").iterdir())


def _age(cache: BlobCache, key: str, seconds_ago: int) -> None:
    """Set ``key``'s use stamp (the least recent order eviction follows) explicitly."""
    stamp = (1_700_000_000 - seconds_ago) * 10**9
    os.utime(cache.directory / "keys" / f"{key}.use", ns=(stamp, stamp))


def test_make_room_for_a_dedup_put_keeps_the_entry_whose_blob_it_keeps(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    a_bytes, b_bytes = os.urandom(5000), os.urandom(6000)
    (here_fs / "a").write_bytes(a_bytes)
    (here_fs / "b").write_bytes(b_bytes)
    assert cache.put("a", here_fs / "a").stored
    assert cache.put("b", here_fs / "b").stored
    _age(cache, "a", 200)  # "a" is the least recently used entry, "b" the next
    _age(cache, "b", 100)
    before = set(_blobs(cache))
    # The same cache opened with a smaller bound: 11000 bytes cached > 7000.
    small = BlobCache(cache.directory, max_bytes=7000)
    # A dedup put: a's bytes under a new key, consumed (hard-linked in: no copy, so the
    # commit's make_room, with keep_blob=a's blob, is the only one).
    (here_fs / "again").write_bytes(a_bytes)
    put = small.put("c", here_fs / "again", consume=True)
    assert put.stored, put.reason
    assert put.placement == "dedup"
    hit = small.get("c")
    assert hit is not None, "the dedup put's record names a blob eviction removed"
    try:
        assert hit.path.read_bytes() == a_bytes
    finally:
        hit.close()
    assert put.evicted == ("b",), \
        f"make_room evicted {put.evicted}: the entry whose blob the dedup put keeps went"
    hit = small.get("a")
    assert hit is not None and hit.path.read_bytes() == a_bytes
    hit.close()
    assert small.get("b") is None
    assert len(_blobs(small)) == 1 and set(_blobs(small)) < before
    assert _keys(small) == ["a.json", "a.use", "c.json", "c.use"]


def test_make_room_looks_at_free_space_again_after_each_evict(make_fs, here_fs: Path) -> None:
    """Short of min_free: evict( the least recent ) frees enough, and the rest stay."""
    mnt = make_fs("tmpfs", 16)
    cache = BlobCache(mnt / "c", max_bytes=64 * MiB)
    src = here_fs / "src"  # sources on another filesystem: each put copies
    for n, key in enumerate(("a", "b", "c")):
        src.write_bytes(os.urandom(4 * MiB))
        assert cache.put(key, src).stored
        _age(cache, key, 300 - 100 * n)  # a, then b, then c: least recent first
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    assert 3 * MiB < free <= 4 * MiB, free  # about 4 MiB left of 16
    # min_free 1 MiB: 4 MiB more do not fit now; with one entry evicted (4 MiB freed) they do.
    tight = BlobCache(cache.directory, max_bytes=64 * MiB, min_free=1 * MiB)
    new = os.urandom(4 * MiB)
    src.write_bytes(new)
    put = tight.put("d", src)
    assert put.stored, f"not stored: {put.reason} (evicted {put.evicted})"
    assert put.evicted == ("a",), \
        f"make_room evicted {put.evicted}: one eviction freed enough (free space not " \
        "looked at again after it)"
    for key, data in (("d", new),):
        hit = tight.get(key)
        assert hit is not None and hit.path.read_bytes() == data
        hit.close()
    for key in ("b", "c"):
        hit = tight.get(key)
        assert hit is not None, f"{key} was evicted though the room was made"
        hit.close()
    assert tight.get("a") is None
    assert len(_blobs(tight)) == 3
