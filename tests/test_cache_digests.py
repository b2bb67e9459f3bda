"""A digest is computed once per byte that enters the machine (issue 42, items 1-3).

Measured by io's own count of the bytes it digests (``bytes_digested``), on a
real XFS loop (clones) and the SeaweedFS fixture (the shared tier), with the
stub TensorRT builder: a warm hit digests no engine byte (``verify="full"``:
each once), a miss each engine byte once (its writer), a remote hit each
downloaded byte once; a damaged blob is never served in either mode.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash
from test_engine_cache_export import _flip, _truncate

import trtet_store
from trtet_store.cache import BlobCache
from trtet_store.io import BlobStore, Digests, bytes_digested
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

ENGINE = 16 * MiB
# The record (the program with its placeholders) and the .pte's own pieces: small.
SMALL = MiB


class MustNotBuild(FakeBuilder):
    def __call__(self, *args, **kwargs):
        raise AssertionError("a hit must not build")


def _compile(out: Path, cache, builder):
    module, inputs = linear_relu()
    with installed(builder):
        return trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)


def _digested(fn):
    before = bytes_digested()
    result = fn()
    return result, bytes_digested() - before


@pytest.fixture
def xfs(make_fs):
    return make_fs("xfs", 400)


def test_a_miss_digests_each_engine_byte_once_and_a_warm_hit_none(xfs):
    cache = trtet_store.EngineCache(xfs / "cache", max_bytes=256 * MiB, min_free=0)
    cold, digested = _digested(lambda: _compile(xfs / "cold.pte", cache,
                                                FakeBuilder(engine_sizes=(ENGINE,))))
    assert [(e.outcome, e.stored, e.placement) for e in cold.engine_cache] == \
        [("miss", True, "clone")]
    # The writer digests the engine as it streams in; the put takes its digests.
    assert ENGINE <= digested <= ENGINE + SMALL, digested
    warm, digested = _digested(lambda: _compile(xfs / "warm.pte", cache, MustNotBuild()))
    assert [(e.outcome, e.placement) for e in warm.engine_cache] == [("hit", "clone")]
    assert digested <= SMALL, f"a warm hit digested {digested} bytes of a {ENGINE} engine"
    assert (xfs / "warm.pte").read_bytes() == (xfs / "cold.pte").read_bytes()


def test_verify_full_digests_each_engine_byte_of_a_hit_once(xfs):
    cache = trtet_store.EngineCache(xfs / "cache", max_bytes=256 * MiB, min_free=0,
                                    verify="full")
    _compile(xfs / "cold.pte", cache, FakeBuilder(engine_sizes=(ENGINE,)))
    warm, digested = _digested(lambda: _compile(xfs / "warm.pte", cache, MustNotBuild()))
    assert [e.outcome for e in warm.engine_cache] == ["hit"]
    assert ENGINE <= digested <= ENGINE + SMALL, digested
    assert (xfs / "warm.pte").read_bytes() == (xfs / "cold.pte").read_bytes()


@pytest.mark.parametrize("verify", [1, None, b"seal"])
def test_verify_must_be_a_mode_name(here_fs, verify):
    with pytest.raises(TypeError, match="verify must be one of 'seal', 'full'"):
        trtet_store.EngineCache(here_fs / "c", verify=verify)
    assert not (here_fs / "c").exists()


def test_an_unknown_verify_mode_is_refused_before_the_directory_is_made(here_fs):
    with pytest.raises(ValueError, match=r"verify must be 'seal' .* or 'full' .*got 'fast'"):
        trtet_store.EngineCache(here_fs / "c", verify="fast")
    assert not (here_fs / "c").exists()


# -- damage: never served, in either mode ---------------------------------------------------

# _truncate and _flip (same size and mtime) are test_engine_cache_export's.


def _rewrite(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[777] ^= 0x01
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.write(data)


@pytest.mark.parametrize("verify", ["seal", "full"])
@pytest.mark.parametrize("damage", [_truncate, _flip, _rewrite], ids=lambda f: f.__name__[1:])
def test_a_damaged_blob_is_never_served_and_is_rebuilt(xfs, damage, verify):
    cache = trtet_store.EngineCache(xfs / "cache", max_bytes=256 * MiB, min_free=0,
                                    verify=verify)
    first = _compile(xfs / "a.pte", cache, FakeBuilder(engine_sizes=(2 * MiB,)))
    with cache.blobs.get(first.engine_cache[0].key) as hit:
        path = hit.path
    damage(path)
    damaged = xxhash.xxh3_128_hexdigest(path.read_bytes())
    builder = FakeBuilder(engine_sizes=(2 * MiB,), seeds=(7,))
    second = _compile(xfs / "b.pte", cache, builder)
    assert len(builder.built) == 1
    assert [(e.outcome, e.stored) for e in second.engine_cache] == [("miss", True)]
    assert second.engine_cache[0].reason.startswith("rebuilt: the cached entry was damaged")
    assert builder.built[0][1] != damaged
    third = _compile(xfs / "c.pte", cache, MustNotBuild())
    assert third.engine_cache[0].outcome == "hit"
    assert (xfs / "c.pte").read_bytes() == (xfs / "b.pte").read_bytes()


def test_a_hit_whose_file_changes_after_the_lookup_is_not_trusted(xfs):
    # The seal was checked by get(); the file is rewritten before the clone: the staged
    # blob is not adopted with the sealed digests, and the record's check refuses it.
    from trtet_store.export.engine_build import stage_hit

    blobs = BlobCache(xfs / "cache", max_bytes=64 * MiB)
    src = xfs / "src"
    src.write_bytes(os.urandom(2 * MiB))
    assert blobs.put("k", src).stored
    with BlobStore(xfs / "staging") as store, blobs.get("k") as hit:
        _rewrite(hit.path)
        assert not hit.unchanged()
        blob, placement = stage_hit(store, hit, {})
        assert placement == "clone" and not blob.has_digests
        before = bytes_digested()
        assert blob.digest != hit.digest  # read once now: the bytes are not the sealed ones
        assert bytes_digested() - before == 2 * MiB


# -- puts take the digests they are given --------------------------------------------------


def test_a_put_of_a_sealed_blob_reads_nothing_and_one_changed_since_is_read(xfs):
    blobs = BlobCache(xfs / "cache", max_bytes=64 * MiB)
    with BlobStore(xfs / "staging") as store:
        blob = store.put(os.urandom(4 * MiB))
        put, digested = _digested(lambda: blobs.put("a", blob))
        assert put.stored and put.digest == blob.digest and digested == 0
        _rewrite(blob.path)  # its identity changes: its digests are not trusted
        put, digested = _digested(lambda: blobs.put("b", blob))
        assert digested == 4 * MiB
        assert put.skipped and "no longer holds the bytes it was sealed with" in put.reason


def test_given_digests_are_trusted_only_for_the_file_they_were_taken_of(xfs):
    from trtet_store.io import digest_file, file_identity

    blobs = BlobCache(xfs / "cache", max_bytes=64 * MiB)
    path = xfs / "down"
    path.write_bytes(os.urandom(3 * MiB))
    digest, chunks, size = digest_file(path, MiB, drop_cached=False)
    told = Digests(digest, size, MiB, chunks, file_identity(path.stat()))
    _rewrite(path)
    put, digested = _digested(lambda: blobs.put("k", path, consume=True, digests=told))
    assert digested == 3 * MiB and put.skipped, put
    assert path.exists()  # a skipped put leaves the file
    digest, chunks, size = digest_file(path, MiB, drop_cached=False)
    told = Digests(digest, size, MiB, chunks, file_identity(path.stat()))
    put, digested = _digested(lambda: blobs.put("k", path, consume=True, digests=told))
    assert put.stored and put.placement == "link" and digested == 0
    with blobs.get("k", verify="full") as hit:
        assert hit.digest == told.digest and hit.verified


# -- the shared tier: each downloaded byte digested once --------------------------------------


def test_a_remote_hit_digests_each_downloaded_byte_once(xfs, s3env):
    # On XFS the program takes the engine by clone (nothing read). Where the cache's file
    # cannot be cloned (ext4), the hit's one copy into the program is checked against its
    # digests as the kernel copies it (io's copy check, one read of what it wrote), which
    # this bound would count: tests/test_engine_cache_ext4_floor.py holds that case.
    here_fs = xfs
    url, endpoint = f"s3://{s3env.bucket}/digests-{here_fs.name}", s3env.endpoint.url
    a = trtet_store.EngineCache(here_fs / "a", max_bytes=256 * MiB, min_free=0, remote=url,
                                endpoint_url=endpoint)
    built = _compile(here_fs / "a.pte", a, FakeBuilder(engine_sizes=(ENGINE,)))
    assert [(e.outcome, e.published) for e in built.engine_cache] == [("miss", True)]
    b = trtet_store.EngineCache(here_fs / "b", max_bytes=256 * MiB, min_free=0, remote=url,
                                endpoint_url=endpoint)
    hit, digested = _digested(lambda: _compile(here_fs / "b.pte", b, MustNotBuild()))
    [event] = hit.engine_cache
    assert event.outcome == "remote-hit" and event.downloaded > ENGINE
    assert event.downloaded <= digested <= event.downloaded + SMALL, \
        (digested, event.downloaded)
    assert (here_fs / "b.pte").read_bytes() == (here_fs / "a.pte").read_bytes()
    # And the entry it left is a local hit that digests nothing.
    again, digested = _digested(lambda: _compile(here_fs / "b2.pte", b, MustNotBuild()))
    assert [e.outcome for e in again.engine_cache] == ["hit"] and digested <= SMALL
