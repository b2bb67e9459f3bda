"""io's seal (issue 52): the one place a file is trusted by its identity, re-read, or resealed.

``io.Seal`` and ``io.same_identity`` hold the discipline the cache (and, for the
relink rule, the blob store and the content store) used to write each in its own
words; here it is tested once, on real files, and through the cache that uses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trtet_store.cache import BlobCache
from trtet_store.io import MiB, Seal, bytes_digested, file_identity, same_identity


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_the_relink_rule_lets_only_the_ctime_move(tmp_path: Path) -> None:
    path = _file(tmp_path / "f", b"x" * 100)
    sealed = file_identity(os.stat(path))
    os.link(path, tmp_path / "link")  # our own link: the ctime moves, nothing else
    os.unlink(tmp_path / "link")
    now = os.stat(path)
    assert same_identity(sealed, now, relink=True)
    assert same_identity(sealed, now) == (file_identity(now) == sealed)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a write would move the mtime
    assert not same_identity(sealed, os.stat(path), relink=True)
    assert not same_identity(sealed, os.stat(path))
    assert not same_identity((), os.stat(path), relink=True)  # no identity: never trusted
    assert not same_identity(None, os.stat(path))
    assert not same_identity(file_identity(os.stat(path))[:4], os.stat(path), relink=True)


def test_a_seal_trusts_by_identity_re_reads_a_changed_file_and_refuses_other_bytes(
        tmp_path: Path) -> None:
    path = _file(tmp_path / "f", os.urandom(3 * MiB + 7))
    fd = os.open(path, os.O_RDONLY)
    try:
        seal = Seal.read(fd, MiB)
        assert (seal.size, len(seal.chunk_digests)) == (3 * MiB + 7, 4)
        before = bytes_digested()
        assert seal.check(fd, os.fstat(fd)) == (None, None)  # one stat, no byte read
        assert bytes_digested() == before
        assert seal.check(fd, os.fstat(fd), full=True) == (None, seal)  # read, same seal
        assert bytes_digested() == before + seal.size
        st = os.fstat(fd)  # a new mtime (set: a coarse clock may not move it): re-read,
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # the same bytes renew it
        problem, renewed = seal.check(fd, os.fstat(fd))
        assert problem is None and renewed == seal.renewed(os.fstat(fd)) != seal
        assert renewed.identity == file_identity(os.fstat(fd))
        wfd = os.open(path, os.O_WRONLY)
        os.pwrite(wfd, b"\0", 2 * MiB + 3)
        os.close(wfd)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2))
        assert seal.check(fd, os.fstat(fd)) == ("digest mismatch (first bad chunk 2)", None)
        assert seal.renewed(os.fstat(fd), relink=True) is None  # the mtime moved too
        os.truncate(path, 10)
        assert seal.holds(os.fstat(fd)).startswith("size 10, sealed")
    finally:
        os.close(fd)


def test_the_cache_s_seal_file_keeps_its_form(tmp_path: Path) -> None:
    """A seal as the cache wrote it before io.Seal (sorted keys, lists) reads back the same."""
    old = json.dumps({"chunk_digests": [1, 2], "chunk_size": MiB, "digest": "ab" * 16,
                      "identity": [1, 2, 3, 4, 5], "size": 7}, sort_keys=True)
    seal = Seal.from_json(json.loads(old))
    assert json.dumps(seal.to_json(), sort_keys=True) == old
    assert (seal.identity, seal.chunk_digests) == ((1, 2, 3, 4, 5), (1, 2))


def test_verify_full_and_verify_re_read_an_untouched_entry(tmp_path: Path) -> None:
    """Nothing changed its identity: only ``verify="full"`` and ``verify()`` read the bytes."""
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    assert cache.put("k", _file(tmp_path / "s", os.urandom(2 * MiB))).stored
    before = bytes_digested()
    with cache.get("k") as hit:
        assert not hit.verified and not hit.resealed
    assert bytes_digested() == before
    with cache.get("k", verify="full") as hit:
        assert hit.verified and not hit.resealed
    assert bytes_digested() == before + 2 * MiB
    assert cache.verify().ok and bytes_digested() == before + 4 * MiB


def test_touch_sets_an_existing_stamp_and_makes_none(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    assert not cache.touch("nothing") and not (cache.directory / "keys" / "nothing.use").exists()
    assert cache.put("k", _file(tmp_path / "s", b"y" * 10)).stored
    use = cache.directory / "keys" / "k.use"
    os.utime(use, ns=(1, 1))
    assert cache.touch("k") and use.stat().st_mtime_ns > 1 and use.stat().st_size == 0
