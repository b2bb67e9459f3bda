"""On ext4 (no clone) a cached export writes each engine byte no more often than it must.

Issue 42, item 5. The floors, counted on the loop device's write sectors after
a ``syncfs`` (every byte the call dirtied, whoever wrote it back):

- a cold build: the builder's copy (which the cache takes by hard link) and
  the program's: two copies of the engines;
- a warm hit: the program's copy, placed straight from the cached file:
  one copy.

Both are at their floor. A warm hit's save copies straight from the cached
file (``engine_build.share_hit``); it wrote 1.5 copies when the hit was
copied to staging first and then inserted and moved. A cold build links the
staged engines into the cache (``EngineCache.put_build(consume=True)``, the
cache's own inode once the staged name is gone) and the save copies them once
from the cache's files; it wrote 2.5 copies when the cache copied the staged
engine and the program then inserted one engine and moved the other.
``benchmarks/ext4_floor.py`` prints the steps. The cache's file is never the
program's (ExecuTorch's own save truncates its output in place).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtet_store.bench import measure

ENGINE_MIB = 32
ENGINES = 2
ENGINE_BYTES = ENGINES * ENGINE_MIB * 2**20
#: The program's headers, the cache's records, seals and use stamps, ext4's journal.
SLACK = 4 * 2**20

def _written(mnt: Path, cache, peak: list[int] | None = None) -> int:
    """Device bytes one ``compile_and_save`` through ``cache`` wrote (synced at both ends).

    ``peak``: the call's peak extra disk use is appended to it (``statvfs``
    polled every 2 ms; a peak between polls is missed, never invented).
    """
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    inputs = (torch.randn(2, 16),)
    measure.syncfs(mnt)
    before = measure.device_io(mnt)
    assert before is not None, f"{mnt}: no block device to count"
    with installed(FakeBuilder(engine_sizes=(ENGINE_MIB * 2**20,) * ENGINES)), \
            measure.PeakDiskMonitor(mnt) as mon:
        trtet_store.compile_and_save(module, inputs, mnt / "model.pte", engine_cache=cache)
        mon.sample()
    measure.syncfs(mnt)
    after = measure.device_io(mnt)
    _the_cache_owns_its_files(mnt / "model.pte", cache)
    (mnt / "model.pte").unlink()
    if peak is not None:
        peak.append(mon.peak_extra_bytes)
    return after[1] - before[1]


def _the_cache_owns_its_files(pte: Path, cache) -> None:
    """Each cached engine is one name of its own inode: not the program, not a staged file."""
    engines = [e for e in cache.entries() if e.key.endswith((".e0", ".e1"))]
    assert len(engines) == ENGINES, [e.key for e in cache.entries()]
    for e in engines:
        hit = cache.blobs.get(e.key)
        assert hit is not None, f"the cached engine {e.key} was taken or damaged by the call"
        with hit:
            st = hit.path.stat()
        assert st.st_nlink == 1, f"{hit.path} has {st.st_nlink} names"
        assert not pte.samefile(hit.path), f"{pte} is the cache's file {hit.path}"
    staging = pte.parent / ".trtet-staging"
    assert not staging.exists() or not [p for p in staging.iterdir()
                                        if p.name.endswith(".blob")]


@pytest.fixture
def ext4_cache(make_fs):
    from trtet_store import EngineCache

    mnt = make_fs("ext4", 8 * ENGINES * ENGINE_MIB + 128)
    return mnt, EngineCache(mnt / "engine-cache", max_bytes=ENGINE_BYTES + 64 * 2**20,
                            min_free=0)


def test_cold_build_on_ext4_writes_two_copies_of_the_engines(ext4_cache) -> None:
    mnt, cache = ext4_cache
    peak: list[int] = []
    written = _written(mnt, cache, peak)
    assert written <= 2 * ENGINE_BYTES + SLACK, \
        f"a cold build wrote {written / ENGINE_BYTES:.2f} copies of the engines (floor 2)"
    # What stays (the cache's copy, the program's) and no more than 64 MiB on top.
    assert peak[0] <= 2 * ENGINE_BYTES + 64 * 2**20, \
        f"a cold build's peak extra disk was {peak[0] / ENGINE_BYTES:.2f} x the engines"


def test_warm_hit_on_ext4_writes_one_copy_of_the_engines(ext4_cache) -> None:
    mnt, cache = ext4_cache
    _written(mnt, cache)  # the cold build fills the cache
    written = _written(mnt, cache)
    assert written <= ENGINE_BYTES + SLACK, \
        f"a warm hit wrote {written / ENGINE_BYTES:.2f} copies of the engines (floor 1)"


def test_a_build_cached_in_part_is_staged_again_and_kept_when_the_save_fails(make_fs) -> None:
    """Engine 0 is linked into the cache, engine 1 finds no room (engine 0 is pinned): the
    build is not cached whole, so engine 0 is staged again from the cache, and a save
    that fails keeps both engines staged for the next call (DESIGN.md invariant 9)."""
    from test_export_keeps_engines import AfterBuild, engines_in, staged_engines

    import trtet_store
    from trtet_store.io.names import STAGING_DIR
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    mnt = make_fs("ext4", 256)
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=20 * 2**20, min_free=0)
    out = mnt / "model.pte"
    sizes = (16 * 2**20, 12 * 2**20)
    module, inputs = linear_relu()
    builder = AfterBuild(out.mkdir, engine_sizes=sizes)  # the output goes bad after the build
    with installed(builder), pytest.raises(IsADirectoryError):
        trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
    digests = sorted(d for _, d in builder.built)
    assert sorted(staged_engines(mnt / STAGING_DIR).values()) == digests
    (e0,) = cache.entries()  # engine 0 only: no record, so no hit
    with cache.blobs.get(e0.key) as hit:
        assert hit.path.stat().st_nlink == 1  # the cache's own inode, not a staged name
    out.rmdir()
    again = FakeBuilder(engine_sizes=sizes)
    with installed(again):
        report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
    assert again.built == []  # the failed call's engines were reused
    assert engines_in(out) == digests
    assert [(e.outcome, e.stored) for e in report.engine_cache] == \
        [("miss", False), ("miss", False)]  # still no room for engine 1: not cached whole
