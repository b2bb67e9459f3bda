"""compile_and_save(..., engine_cache=) on real filesystems, the stub builder counting builds.

Cross-process claims run in separate processes (CHILD, as warm children: tests/warm.py): each
child compiles the same model with :class:`FakeBuilder`, whose engine bytes
are seeded by the child's pid, so a rebuilt engine can never pass for the
cached one. A child appends its pid to a file each time it builds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import warm
import xxhash
from proclocks import waits_on_a_lock

import trtet_store
from trtet_store.export import engine_cache
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

CHILD = r'''
import json, os, sys, time
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

out, cache_dir, builds, size, sleep = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4]), float(sys.argv[5])
go = sys.argv[6] if len(sys.argv) > 6 else ""  # a build that waits for the test's word

class Counting(FakeBuilder):
    def __call__(self, *args, **kwargs):
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
        time.sleep(sleep)  # the slow build
        while go and not os.path.exists(go):
            time.sleep(0.02)
        return super().__call__(*args, **kwargs)

builder = Counting(engine_sizes=(size,), seeds=(os.getpid(),))
cache = trtet_store.EngineCache(cache_dir, max_bytes=1 << 30, min_free=0)
module, inputs = linear_relu()
with installed(builder):
    report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
print(json.dumps({"built": [d for _, d in builder.built],
                  "cache": [e.to_json() for e in report.engine_cache],
                  "placements": report.placements}))
'''


class MustNotBuild:
    def __call__(self, *args, **kwargs):
        raise AssertionError("the engines were built although the cache holds them")


def _start(out: Path, cache: Path, builds: Path, *, size: int = 2 * MiB,
           sleep: float = 0.0, go: Path | None = None) -> warm.WarmChild:
    return warm.popen(CHILD, [out, cache, builds, size, sleep, *([go] if go else [])])


def _result(proc: warm.WarmChild, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _builds(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def engines_in(pte: Path) -> list[str]:
    """xxh3-128 of each inline engine of ``pte``, read where ``trtet-store inspect`` finds it."""
    from trtet_store import inspector

    out = []
    with open(pte, "rb") as f:
        for d in inspector.inspect_file(pte).delegates:
            engine = d["tensorrt"]["engine"]
            f.seek(engine["file_offset"])
            out.append(xxhash.xxh3_128_hexdigest(f.read(engine["size"])))
    return out


def _used(mnt: Path) -> int:
    os.sync()
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _cached_engine(cache: trtet_store.EngineCache, key: str) -> Path:
    with cache.blobs.get(key) as hit:
        return hit.path


# -- across processes --------------------------------------------------------------------


def test_a_second_process_builds_nothing_and_writes_the_first_ones_engine_bytes(here_fs):
    cache, builds = here_fs / "cache", here_fs / "builds"
    first = _result(_start(here_fs / "a.pte", cache, builds))
    assert len(first["built"]) == 1
    assert [(e["outcome"], e["stored"]) for e in first["cache"]] == [("miss", True)]
    second = _result(_start(here_fs / "b.pte", cache, builds))
    assert second["built"] == []
    assert [e["outcome"] for e in second["cache"]] == ["hit"]
    assert len(_builds(builds)) == 1
    # Exactly the first process's engine bytes (the second's would differ: pid seed).
    assert engines_in(here_fs / "b.pte") == first["built"] == engines_in(here_fs / "a.pte")


def test_eight_processes_of_one_model_run_one_build(here_fs):
    cache, builds, go = here_fs / "cache", here_fs / "builds", here_fs / "go"
    procs = [_start(here_fs / f"m{i}.pte", cache, builds, go=go) for i in range(8)]
    # The state, not a sleep: one builds (and waits for our word), seven wait on its lock.
    deadline = time.monotonic() + 300
    while not (len(_builds(builds)) == 1 and
               sum(waits_on_a_lock(p.pid) for p in procs) == 7):
        assert len(_builds(builds)) <= 1, _builds(builds)  # a second build: no single flight
        assert time.monotonic() < deadline, (_builds(builds), [p.poll() for p in procs])
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
        time.sleep(0.05)
    go.touch()
    results = [_result(p, timeout=600) for p in procs]
    assert len(_builds(builds)) == 1, _builds(builds)
    built = [r["built"] for r in results if r["built"]]
    assert len(built) == 1
    assert sorted(r["cache"][0]["outcome"] for r in results) == ["hit"] * 7 + ["miss"]
    for i in range(8):
        assert engines_in(here_fs / f"m{i}.pte") == built[0]


def test_a_waiter_builds_when_the_builder_is_killed(here_fs):
    cache, builds = here_fs / "cache", here_fs / "builds"
    builder = _start(here_fs / "a.pte", cache, builds, sleep=60.0)
    deadline = time.monotonic() + 120
    while not _builds(builds):  # the builder holds the key's lock, and builds
        assert time.monotonic() < deadline and builder.poll() is None
        time.sleep(0.1)
    waiter = _start(here_fs / "b.pte", cache, builds, sleep=0.0)
    while not waits_on_a_lock(waiter.pid):  # the waiter waits on the key's flock
        assert time.monotonic() < deadline and waiter.poll() is None
        time.sleep(0.1)
    time.sleep(1.0)  # and has waited a while
    os.kill(builder.pid, signal.SIGKILL)
    builder.communicate()
    result = _result(waiter)
    assert _builds(builds) == [str(builder.pid), str(waiter.pid)]
    assert [(e["outcome"], e["stored"]) for e in result["cache"]] == [("miss", True)]
    assert engines_in(here_fs / "b.pte") == result["built"]
    assert not (here_fs / "a.pte").exists()


# -- placements --------------------------------------------------------------------------


def _compile(out: Path, cache, builder, **kw):
    module, inputs = linear_relu()
    with installed(builder):
        return trtet_store.compile_and_save(module, inputs, out, engine_cache=cache, **kw)


def test_a_warm_save_on_xfs_clones_the_cached_engine(make_fs):
    mnt = make_fs("xfs", 600)
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=512 * MiB, min_free=0)
    cold = _compile(mnt / "cold.pte", cache, FakeBuilder(engine_sizes=(64 * MiB,)))
    assert [(e.outcome, e.stored, e.placement) for e in cold.engine_cache] == \
        [("miss", True, "clone")]
    before = _used(mnt)
    warm = _compile(mnt / "warm.pte", cache, MustNotBuild())
    grew = _used(mnt) - before
    assert grew <= MiB, f"a warm save of a 64 MiB engine used {grew} bytes"
    assert [(e.outcome, e.placement) for e in warm.engine_cache] == [("hit", "clone")]
    cached = _cached_engine(cache, warm.engine_cache[0].key)
    assert engines_in(mnt / "warm.pte") == [xxhash.xxh3_128_hexdigest(cached.read_bytes())]
    assert engines_in(mnt / "warm.pte") == engines_in(mnt / "cold.pte")
    assert not (mnt / ".trtet-staging").exists()


def test_on_ext4_a_hit_is_one_copy_and_no_build(make_fs):
    mnt = make_fs("ext4", 256)
    size = 32 * MiB
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=128 * MiB, min_free=0)
    cold = _compile(mnt / "cold.pte", cache, FakeBuilder(engine_sizes=(size,)))
    # The cache takes the staged engine by hard link; the save copies it from there.
    assert [(e.outcome, e.stored, e.placement) for e in cold.engine_cache] == \
        [("miss", True, "link")]
    assert set(cold.placements) == {"copy"}, cold.placements
    before = _used(mnt)
    warm = _compile(mnt / "warm.pte", cache, MustNotBuild())
    grew = _used(mnt) - before
    assert [(e.outcome, e.placement) for e in warm.engine_cache] == [("hit", "copy")]
    # Copied once, straight from the cache's file (never staged first, never consumed).
    assert set(warm.placements) == {"copy"}, warm.placements
    assert size <= grew <= size + MiB, grew
    assert engines_in(mnt / "warm.pte") == engines_in(mnt / "cold.pte")
    assert len(cache.entries()) == 2  # the cache keeps its entries (engine, record)


# -- damage ------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 4096)


def _flip(path: Path) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(12345)
        b = f.read(1)
        f.seek(12345)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime


def _replace(path: Path) -> None:
    other = path.with_name("other")
    other.write_bytes(os.urandom(path.stat().st_size))
    os.rename(other, path)


@pytest.mark.parametrize("damage", [_truncate, _flip, _replace], ids=lambda f: f.__name__[1:])
def test_a_damaged_entry_is_rebuilt_never_served(here_fs, damage):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=64 * MiB, min_free=0)
    first = _compile(here_fs / "a.pte", cache, FakeBuilder(engine_sizes=(2 * MiB,)))
    path = _cached_engine(cache, first.engine_cache[0].key)
    damage(path)
    damaged = xxhash.xxh3_128_hexdigest(path.read_bytes())
    builder = FakeBuilder(engine_sizes=(2 * MiB,), seeds=(7,))
    second = _compile(here_fs / "b.pte", cache, builder)
    assert len(builder.built) == 1
    assert [(e.outcome, e.stored) for e in second.engine_cache] == [("miss", True)]
    # The event says why it was rebuilt: the cached entry was damaged, and how (issue 45.8).
    how = {"truncate": "size 2093056, sealed 2097152 (truncated or extended)",
           "flip": "digest mismatch (first bad chunk 0)",
           "replace": "digest mismatch (first bad chunk 0)"}[damage.__name__[1:]]
    assert second.engine_cache[0].reason == \
        f"rebuilt: the cached entry was damaged (engine 0: {how})"
    assert engines_in(here_fs / "b.pte") == [builder.built[0][1]]
    assert damaged not in engines_in(here_fs / "b.pte")
    # The rebuilt engine is what the cache serves now.
    third = _compile(here_fs / "c.pte", cache, MustNotBuild())
    assert engines_in(here_fs / "c.pte") == [builder.built[0][1]]
    assert third.engine_cache[0].outcome == "hit"


# -- the key -----------------------------------------------------------------------------


def test_the_key_holds_the_compute_capability(here_fs, monkeypatch):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=64 * MiB, min_free=0)
    first = _compile(here_fs / "a.pte", cache, FakeBuilder(engine_sizes=(MiB,)))
    capability = engine_cache.compute_capability()
    assert capability == "no-gpu"  # no CUDA here: the stated value
    assert first.engine_cache[0].key.endswith(f"-{capability}.e0")
    assert {e.metadata["compute_capability"] for e in cache.entries()} == {capability}
    # The same build for another GPU is another key: built, never served this one's engine.
    monkeypatch.setattr(engine_cache, "compute_capability", lambda: "sm_90")
    builder = FakeBuilder(engine_sizes=(MiB,), seeds=(5,))
    other = _compile(here_fs / "b.pte", cache, builder)
    assert len(builder.built) == 1
    assert other.engine_cache[0].outcome == "miss"
    assert engines_in(here_fs / "b.pte") == [builder.built[0][1]]


# -- bad inputs --------------------------------------------------------------------------


def _nothing_written(directory: Path, *keep: str) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(keep)


def test_a_cache_directory_owned_by_another_user_is_refused_before_the_build(
        here_fs, monkeypatch):
    theirs = here_fs / "xdg" / "trtet_store" / "engines"
    theirs.mkdir(parents=True, mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match=r"owned by uid 65534, not by you"):
        trtet_store.EngineCache(theirs)
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(here_fs / "xdg"))
    out = here_fs / "out"
    out.mkdir()
    with pytest.raises(PermissionError, match=r"owned by uid 65534"):
        _compile(out / "m.pte", True, MustNotBuild())
    _nothing_written(out)


def test_max_bytes_zero_is_refused_and_an_engine_over_the_bound_is_not_cached(here_fs):
    with pytest.raises(ValueError, match="a cache of 0 bytes can hold nothing"):
        trtet_store.EngineCache(here_fs / "cache", max_bytes=0)
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=MiB, min_free=0)
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    report = _compile(here_fs / "m.pte", cache, builder)
    (event,) = report.engine_cache
    assert (event.outcome, event.stored) == ("miss", False)
    assert "larger than the cache's bound" in event.reason
    assert engines_in(here_fs / "m.pte") == [builder.built[0][1]]
    assert cache.entries() == []


def test_a_cache_inside_the_staging_directory_is_refused_before_the_build(here_fs):
    cache = trtet_store.EngineCache(here_fs / ".trtet-staging" / "cache", min_free=0)
    with pytest.raises(ValueError, match="inside the staging directory"):
        _compile(here_fs / "m.pte", cache, MustNotBuild())
    assert not (here_fs / "m.pte").exists()
    with pytest.raises(ValueError, match="inside the staging directory"):
        _compile(here_fs / "m.pte", cache, MustNotBuild(), store=here_fs / ".trtet-staging")


def test_a_read_only_cache_serves_hits_and_skips_puts(make_fs, here_fs):
    mnt = make_fs("ext4", 64)
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=32 * MiB, min_free=0)
    first = _compile(here_fs / "a.pte", cache, FakeBuilder(engine_sizes=(2 * MiB,)))
    (mnt / "empty").mkdir(mode=0o700)
    subprocess.run(["mount", "-o", "remount,ro", os.fspath(mnt)], check=True)
    try:
        ro = trtet_store.EngineCache(mnt / "cache", max_bytes=32 * MiB, min_free=0)
        hit = _compile(here_fs / "b.pte", ro, MustNotBuild())
        assert [e.outcome for e in hit.engine_cache] == ["hit"]
        assert engines_in(here_fs / "b.pte") == engines_in(here_fs / "a.pte")
        empty = trtet_store.EngineCache(mnt / "empty", max_bytes=32 * MiB, min_free=0)
        builder = FakeBuilder(engine_sizes=(2 * MiB,))
        miss = _compile(here_fs / "c.pte", empty, builder)
        (event,) = miss.engine_cache
        assert (event.outcome, event.stored) == ("miss", False)
        assert "read-only" in event.reason
        assert engines_in(here_fs / "c.pte") == [builder.built[0][1]]
        with pytest.raises(OSError, match="pass a writable directory"):
            trtet_store.EngineCache(mnt / "missing", max_bytes=MiB)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", os.fspath(mnt)], check=True)
    assert first.engine_cache[0].stored


def test_a_failing_cache_never_fails_the_export(here_fs, caplog):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=32 * MiB, min_free=0)
    tmp = cache.directory / "tmp"
    tmp.rmdir()
    tmp.write_bytes(b"")  # every put now fails with ENOTDIR: not a skip the cache knows
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    with caplog.at_level(logging.WARNING, logger="trtet_store.engine_cache"):
        report = _compile(here_fs / "m.pte", cache, builder)
    (event,) = report.engine_cache
    assert (event.outcome, event.stored) == ("miss", False)
    assert "NotADirectoryError" in event.reason
    assert "not cached" in caplog.text
    assert engines_in(here_fs / "m.pte") == [builder.built[0][1]]
    assert report.to_json()["engine_cache"][0]["reason"] == event.reason


# -- the call itself ---------------------------------------------------------------------


def test_keywords_are_checked_and_the_callers_cache_is_unchanged(here_fs):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=32 * MiB, min_free=0)
    with pytest.raises(TypeError, match="engine_cache"):
        _compile(here_fs / "m.pte", cache, MustNotBuild(), engine_cahce=True)
    with pytest.raises(TypeError, match="engine_cache must be an EngineCache"):
        _compile(here_fs / "m.pte", "yes", MustNotBuild())
    with pytest.raises(ValueError, match="engine_cache applies to backend='tensorrt'"):
        _compile(here_fs / "m.pte", cache, MustNotBuild(), backend="xnnpack")
    _nothing_written(here_fs, "cache")
    # A put on the staging filesystem raised the floor on a view, not on the caller's object.
    _compile(here_fs / "m.pte", cache, FakeBuilder(engine_sizes=(MiB,)))
    assert (cache.max_bytes, cache.min_free) == (32 * MiB, 0)
    assert cache.blobs.min_free == 0


def test_the_cache_never_takes_the_room_the_save_needs(make_fs):
    mnt = make_fs("ext4", 320)
    size = 96 * MiB
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=128 * MiB, min_free=0)
    # Free once the engine is staged: 80 MiB. The cache would take the staged engine by
    # hard link (no room), but the save then copies it from the cache's file (96 MiB,
    # which does not fit), where without the entry it inserts the staged engine (its
    # budget: a 64 MiB move, which fits). So the put is skipped with the reason, and the
    # export succeeds.
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - (size + 80 * MiB))
    builder = FakeBuilder(engine_sizes=(size,))
    report = _compile(mnt / "m.pte", cache, builder)
    (event,) = report.engine_cache
    assert (event.outcome, event.stored) == ("miss", False), event
    assert "not enough free space" in event.reason
    assert engines_in(mnt / "m.pte") == [builder.built[0][1]]
    assert cache.entries() == []
    assert (cache.max_bytes, cache.min_free) == (128 * MiB, 0)  # the caller's object as it was


def test_on_ext4_the_cache_links_the_engine_where_a_copy_would_not_fit(make_fs):
    mnt = make_fs("ext4", 192)
    size = 16 * MiB
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=64 * MiB, min_free=0)
    # Free once the engine is staged: 16 MiB and 60 MiB more. A copy into the cache would
    # leave the consuming save less than its 64 MiB move budget; a hard link takes no
    # room, and the save's copy from the cache (16 MiB) fits.
    st = os.statvfs(mnt)
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - (2 * size + 60 * MiB))
    builder = FakeBuilder(engine_sizes=(size,))
    report = _compile(mnt / "m.pte", cache, builder)
    assert [(e.outcome, e.stored, e.placement) for e in report.engine_cache] == \
        [("miss", True, "link")]
    assert engines_in(mnt / "m.pte") == [builder.built[0][1]]
    assert engines_in(mnt / "m.pte") == [xxhash.xxh3_128_hexdigest(
        _cached_engine(cache, report.engine_cache[0].key).read_bytes())]


def test_on_xfs_a_nearly_full_disk_still_caches_by_clone(make_fs):
    mnt = make_fs("xfs", 400)
    size = 64 * MiB
    cache = trtet_store.EngineCache(mnt / "cache", max_bytes=256 * MiB, min_free=0)
    # 40 MiB free once the engine is staged: less than a copy's reserve, but a clone
    # takes no room, and the save clones too.
    st = os.statvfs(mnt)
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - (size + 40 * MiB))
    builder = FakeBuilder(engine_sizes=(size,))
    report = _compile(mnt / "m.pte", cache, builder)
    assert [(e.outcome, e.stored, e.placement) for e in report.engine_cache] == \
        [("miss", True, "clone")]
    assert engines_in(mnt / "m.pte") == [builder.built[0][1]]


def test_export_takes_the_cache_and_a_hit_left_unconsumed_leaves_no_file(here_fs):
    from executorch.exir import ExecutorchBackendConfig

    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=32 * MiB, min_free=0)
    _compile(here_fs / "a.pte", cache, FakeBuilder(engine_sizes=(2 * MiB,)))
    staging = here_fs / "staging"
    module, inputs = linear_relu()
    with installed(MustNotBuild()), trtet_store.BlobStore(staging) as store:
        edge = trtet_store.export.export(module, inputs=inputs, store=store, engine_cache=cache)
        assert [e.outcome for e in edge.trtet_cache] == ["hit"]
        program = edge.to_executorch(ExecutorchBackendConfig(segment_alignment=4096))
        trtet_store.save_program(program, here_fs / "b.pte")  # not consumed: a copy
        del edge, program
    # The staged hit was the store's own file: released with it, never given back anywhere.
    assert sorted(os.listdir(staging)) == []
    assert engines_in(here_fs / "b.pte") == engines_in(here_fs / "a.pte")
    assert len(cache.entries()) == 2


def test_a_two_method_program_is_served_per_method(here_fs):
    import torch

    def methods():
        module, inputs = linear_relu()
        other, _ = linear_relu()
        with torch.no_grad():
            other[0].weight.add_(1)  # another build: another key
        return {"prefill": torch.export.export(module, inputs),
                "decode": torch.export.export(other, inputs)}

    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=64 * MiB, min_free=0)
    builder = FakeBuilder(engine_sizes=(MiB,))
    with installed(builder):
        cold = trtet_store.compile_and_save(methods(), None, here_fs / "a.pte",
                                            engine_cache=cache)
    assert len(builder.built) == 2
    assert sorted(e.outcome for e in cold.engine_cache) == ["miss", "miss"]
    assert len({e.key for e in cold.engine_cache}) == 2
    with installed(MustNotBuild()):
        warm = trtet_store.compile_and_save(methods(), None, here_fs / "b.pte",
                                            engine_cache=cache)
    assert [e.outcome for e in warm.engine_cache] == ["hit", "hit"]
    assert engines_in(here_fs / "b.pte") == engines_in(here_fs / "a.pte")
