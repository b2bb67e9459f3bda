"""Torch-TensorRT 2.14.0's own engine cache beside our adapter, both through upstream's code.

The wheel's ``torch_tensorrt/dynamo/_engine_cache.py`` runs unchanged, only
its imports stubbed (``trtet_store.testing.upstream_engine_cache``): entries
are packed by its ``insert`` and unpickled by its ``check``. Our adapter
(``trtet_store.export.trt_engine_cache.for_torch_tensorrt``) subclasses its
``BaseEngineCache`` and implements only ``save``/``load`` on a BlobCache.

Side by side, each step in its own process, as Torch-TensorRT users run
compiles: a 100 MiB cache filled with 5 x 20 MiB by one process, the first
entry used by a second, a sixth inserted by a third. Upstream's empties the
directory (every entry evicted for 0 credited bytes, the new one not cached);
ours keeps the four most recently used plus the new one. A truncated entry
makes upstream's ``check`` raise; ours misses and rebuilds.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import upstream
import warm

from trtet_store.cache import BlobCache
from trtet_store.io import MiB
from trtet_store.testing import upstream_engine_cache as uec

ROOT = Path(__file__).resolve().parent.parent
TRT, SM = "10.14.1.48", "sm_90"
#: 5 packed entries fit in 100 MiB (pickle adds a few hundred bytes); a sixth does not.
ENGINE = 20 * MiB - 4096
BOUND = 100 * MiB


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return upstream.wheel("torch-tensorrt")
    except upstream.WheelUnavailable as exc:
        from filesystems import unavailable

        unavailable(str(exc))


@pytest.fixture
def mod(wheel):
    """The wheel's module, also importable as torch_tensorrt.dynamo._engine_cache meanwhile."""
    module = uec.load(wheel)
    with uec.as_torch_tensorrt(module):
        yield module


def adapter(directory: Path, *, trt: str = TRT, sm: str = SM, max_bytes: int = BOUND):
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    return for_torch_tensorrt(BlobCache(directory, max_bytes=max_bytes),
                              tensorrt_version=trt, compute_capability=sm)


def engine(i: int, size: int = ENGINE) -> bytes:
    import random

    return random.Random(i).randbytes(size)


def entry(i: int, size: int = ENGINE) -> tuple:
    """An UnpackedCacheHit as torch-tensorrt's compile inserts it (engine i)."""
    return (engine(i, size), [f"in_{i}"], [f"out_{i}"], [uec.Input((1, 16 + i))],
            uec.CompilationSettings(workspace_size=i), False, False, {})


def hash_of(i: int) -> str:
    return f"{i:064x}" * 3  # upstream's hashes are 192 hex characters


# Each step runs in a process of its own: upstream keeps its sizes per process. (A warm
# child, tests/warm.py: forked from a server that never loaded the wheel's module, which
# each child loads afresh, as a new interpreter would.)
CHILD = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    from trtet_store.cache import BlobCache
    from trtet_store.testing import upstream_engine_cache as uec
    kind, directory, wheel, step, size, bound = sys.argv[1:7]
    size, bound = int(size), int(bound)
    mod = uec.load(wheel)
    if kind == "upstream":
        cache = mod.DiskEngineCache(directory, bound)
    else:
        with uec.as_torch_tensorrt(mod):
            from trtet_store.export.trt_engine_cache import for_torch_tensorrt
            cache = for_torch_tensorrt(BlobCache(directory, max_bytes=bound),
                                       tensorrt_version=%(trt)r, compute_capability=%(sm)r)
    def entry(i):
        return (random.Random(i).randbytes(size), [f"in_{i}"], [f"out_{i}"],
                [uec.Input((1, 16 + i))], uec.CompilationSettings(workspace_size=i),
                False, False, {})
    for word in step.split(","):
        op, i = word[0], int(word[1:])
        h = f"{i:064x}" * 3
        if op == "i":
            cache.insert(h, entry(i))
        elif op == "c":
            got = cache.check(h)
            print(f"c{i}", "hit" if got is not None and tuple(got) == entry(i) else got)
""") % {"trt": TRT, "sm": SM}


def child(kind: str, directory: Path, wheel: Path, step: str, *,
          size: int = ENGINE) -> str:
    done = warm.run(CHILD, [kind, directory, wheel, step, size, BOUND], timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def fill_use_insert(kind: str, directory: Path, wheel: Path) -> None:
    """Process 1 fills the cache (5 x 20 MiB), process 2 uses entry 0, process 3 inserts a 6th."""
    child(kind, directory, wheel, "i0,i1,i2,i3,i4")
    assert child(kind, directory, wheel, "c0").split() == ["c0", "hit"]
    child(kind, directory, wheel, "i5")


def test_upstream_disk_engine_cache_empties_a_full_cache_from_a_new_process(here_fs, wheel):
    """The failure to show: a new process's insert evicts everything, then caches nothing."""
    directory = here_fs / "upstream"
    child("upstream", directory, wheel, "i0,i1,i2,i3,i4")
    assert sorted(os.listdir(directory)) == sorted(hash_of(i) for i in range(5))
    assert child("upstream", directory, wheel, "c0").split() == ["c0", "hit"]
    child("upstream", directory, wheel, "i5")
    assert os.listdir(directory) == []  # 5 entries evicted for 0 credited bytes, 6th not cached
    assert child("upstream", directory, wheel, "c0,c5").split() == ["c0", "None", "c5", "None"]


def test_our_adapter_keeps_the_four_most_recently_used_plus_the_new_one(here_fs, wheel, mod):
    """Same steps through upstream's insert/check: entry 1, least recently used, goes.

    Not entry 0, the oldest written (upstream's "LRU" sorts by mtime, which
    ``load`` never touches): process 2's hit was recorded on disk.
    """
    directory = here_fs / "ours"
    fill_use_insert("ours", directory, wheel)
    ours = adapter(directory)
    assert [i for i in range(6) if ours.check(hash_of(i)) is not None] == [0, 2, 3, 4, 5]
    for i in (0, 2, 3, 4, 5):  # each the very entry inserted, through upstream's unpickling
        assert tuple(ours.check(hash_of(i))) == entry(i)
    stats = ours.cache.stats()
    assert stats.entries == 5 and stats.bytes <= BOUND
    assert os.listdir(directory / "tmp") == []


def test_a_packed_entry_goes_through_insert_and_comes_back_through_check(here_fs, mod):
    from trtet_store import EngineCache
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    engines = EngineCache(here_fs / "c", max_bytes=BOUND, min_free=0)
    ours = for_torch_tensorrt(engines, tensorrt_version=TRT, compute_capability=SM)
    assert ours.cache is engines.blobs  # one store, one bound with the export's builds
    assert isinstance(ours, mod.BaseEngineCache)
    packed = mod.BaseEngineCache.pack(*entry(7, 1 * MiB))
    ours.insert(hash_of(7), entry(7, 1 * MiB))
    assert ours.last_put.stored, ours.last_put
    assert ours.load(hash_of(7)) == packed  # the bytes upstream's pack made, unchanged
    got = ours.check(hash_of(7))
    assert tuple(got) == entry(7, 1 * MiB)
    assert ours.check(hash_of(8)) is None
    [info] = ours.cache.entries()
    assert info.metadata == {"kind": "torch_tensorrt.packed", "torch_tensorrt_hash": hash_of(7),
                             "versions": [["tensorrt", TRT]], "compute_capability": SM}
    assert info.key.endswith("-sm_90")
    assert info.hits == 2


def test_the_key_holds_the_tensorrt_version_and_the_compute_capability(here_fs, mod):
    """One directory shared by two GPUs / TensorRTs: each gets only its own engines."""
    directory = here_fs / "shared"
    a = adapter(directory)
    a.insert(hash_of(1), entry(1, MiB))
    assert a.check(hash_of(1)) is not None
    other_gpu = adapter(directory, sm="sm_86")
    other_trt = adapter(directory, trt="10.13.0")
    assert other_gpu.check(hash_of(1)) is None
    assert other_trt.check(hash_of(1)) is None
    other_gpu.insert(hash_of(1), entry(2, MiB))  # same upstream hash, another GPU's engine
    assert tuple(other_gpu.check(hash_of(1))) == entry(2, MiB)
    assert tuple(a.check(hash_of(1))) == entry(1, MiB)
    assert len({a.key_for("h"), other_gpu.key_for("h"), other_trt.key_for("h")}) == 3


def test_a_truncated_entry_makes_upstreams_check_raise(here_fs, wheel):
    """As a crash mid-write leaves it (plain open + write: no temp file, no rename)."""
    mod = uec.load(wheel)
    cache = mod.DiskEngineCache(os.fspath(here_fs / "upstream"), BOUND)
    cache.insert(hash_of(3), entry(3, MiB))
    blob = here_fs / "upstream" / hash_of(3) / "blob.bin"
    os.truncate(blob, blob.stat().st_size // 2)
    with pytest.raises((pickle.UnpicklingError, EOFError)):
        cache.check(hash_of(3))


def test_a_truncated_entry_in_ours_is_a_miss_and_is_rebuilt(here_fs, mod):
    directory = here_fs / "ours"
    ours = adapter(directory)
    ours.insert(hash_of(3), entry(3, MiB))
    ours.insert(hash_of(4), entry(4, MiB))
    [info] = [e for e in ours.cache.entries() if e.key == ours.key_for(hash_of(3))]
    victim = directory / "blobs" / f"{info.digest}-{info.size}"  # entry 3's bytes
    os.truncate(victim, victim.stat().st_size // 2)
    assert ours.check(hash_of(3)) is None  # missed, never unpickled
    assert not victim.exists()  # dropped
    assert tuple(ours.check(hash_of(4))) == entry(4, MiB)  # the other entry untouched
    ours.insert(hash_of(3), entry(3, MiB))  # the rebuild enters again
    assert tuple(ours.check(hash_of(3))) == entry(3, MiB)


def test_a_process_killed_between_its_temp_file_and_the_put_leaves_nothing(here_fs, wheel):
    """The adapter's own step before the cache's put: its temp file is the cache's to recover."""
    directory = here_fs / "killed"
    BlobCache(directory, max_bytes=BOUND)
    code = textwrap.dedent(f"""
        import os, signal
        from trtet_store.cache import BlobCache
        from trtet_store.testing import upstream_engine_cache as uec
        mod = uec.load({os.fspath(wheel)!r})
        with uec.as_torch_tensorrt(mod):
            from trtet_store.export.trt_engine_cache import for_torch_tensorrt
            cache = for_torch_tensorrt(BlobCache({os.fspath(directory)!r}, max_bytes={BOUND}),
                                       tensorrt_version="t", compute_capability="sm_90")
        # Die at the put: the packed bytes are in the temp file, nothing is entered.
        cache.cache.put = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        cache.save("h" * 64, os.urandom(3 << 20))
    """)
    done = warm.run(code, timeout=120, cwd=ROOT)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    ours = ("lock", "CACHEDIR.TAG")  # the cache's own lock and marker
    left = [p for p in directory.rglob("*") if p.is_file() and p.name not in ours]
    assert [p.parent.name for p in left] == ["tmp"] and left[0].stat().st_size == 3 << 20
    reopened = BlobCache(directory, max_bytes=BOUND)
    assert reopened.recovered == left
    assert [p for p in directory.rglob("*") if p.is_file() and p.name not in ours] == []


def test_an_entry_larger_than_the_bound_is_skipped_and_nothing_else_moves(here_fs, mod):
    directory = here_fs / "small"
    ours = adapter(directory, max_bytes=4 * MiB)
    ours.insert(hash_of(1), entry(1, MiB))
    before = {p: p.read_bytes() for p in (directory / "blobs").iterdir()}
    ours.insert(hash_of(2), entry(2, 5 * MiB))
    assert not ours.last_put.stored
    assert "larger than the cache's bound of 4194304 bytes" in ours.last_put.reason
    assert ours.check(hash_of(2)) is None
    assert {p: p.read_bytes() for p in (directory / "blobs").iterdir()} == before
    assert os.listdir(directory / "tmp") == []
    assert tuple(ours.check(hash_of(1))) == entry(1, MiB)


def test_refusals(here_fs, mod):
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    ours = adapter(here_fs / "r")
    with pytest.raises(TypeError, match=r"save\(\) takes only \(hash, blob\); got also ttl="):
        ours.save("h", b"x", ttl=3)
    with pytest.raises(TypeError, match=r"load\(\) takes only \(hash\); got also 'x'"):
        ours.load("h", "x")
    with pytest.raises(TypeError, match="hash must be a non-empty str"):
        ours.save(b"h", b"x")
    with pytest.raises(TypeError, match="blob must be bytes-like"):
        ours.save("h", "text")
    with pytest.raises(ValueError, match=r"compute_capability must be 'sm_90'.*'sm90x'"):
        for_torch_tensorrt(here_fs / "r", tensorrt_version="t", compute_capability="sm90x")
    with pytest.raises(TypeError, match="has its own bound"):
        for_torch_tensorrt(ours.cache, max_bytes=MiB, tensorrt_version="t",
                           compute_capability="sm_90")
    assert adapter(here_fs / "r", sm=(8, 9)).compute_capability == "sm_89"
    assert adapter(here_fs / "r", sm="10.0").compute_capability == "sm_100"
    assert for_torch_tensorrt(here_fs / "r", max_bytes=MiB, tensorrt_version="t",
                              compute_capability="sm_90").compute_capability == "sm_90"
    with pytest.raises(RuntimeError, match="no CUDA device"):  # this machine has none
        for_torch_tensorrt(here_fs / "r", tensorrt_version="t")
    assert os.listdir(here_fs / "r" / "tmp") == [] and ours.cache.entries() == []


def test_without_torch_tensorrt_the_adapter_says_so(here_fs):
    """Imported lazily: trtet_store never needs torch-tensorrt until the adapter is asked for."""
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    if "torch_tensorrt" in sys.modules:
        pytest.skip("a torch_tensorrt is imported in this process")
    with pytest.raises(ImportError, match="needs torch-tensorrt"):
        for_torch_tensorrt(here_fs / "x", tensorrt_version="t", compute_capability="sm_90")
    assert not (here_fs / "x").exists()


def test_another_users_cache_directory_is_refused(here_fs, mod):
    """Per user: unlike upstream's shared <tmp>/torch_tensorrt_engine_cache."""
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    directory = here_fs / "theirs"
    adapter(directory).insert(hash_of(1), entry(1, MiB))
    before = sorted((p, p.stat().st_size) for p in directory.rglob("*"))
    os.chown(directory, 65534, 65534)
    try:
        with pytest.raises(PermissionError, match="owned by uid 65534"):
            for_torch_tensorrt(directory, tensorrt_version=TRT, compute_capability=SM)
    finally:
        os.chown(directory, os.getuid(), os.getgid())
    assert sorted((p, p.stat().st_size) for p in directory.rglob("*")) == before


INSERTER = textwrap.dedent("""
    import os, random, sys
    from trtet_store.cache import BlobCache
    from trtet_store.testing import upstream_engine_cache as uec
    directory, wheel, first, bound = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mod = uec.load(wheel)
    with uec.as_torch_tensorrt(mod):
        from trtet_store.export.trt_engine_cache import for_torch_tensorrt
        cache = for_torch_tensorrt(BlobCache(directory, max_bytes=bound),
                                   tensorrt_version="t", compute_capability="sm_90")
    for i in range(first, first + 3):
        cache.insert(f"{i:064x}" * 3, (random.Random(i).randbytes(8 << 20), [f"in_{i}"],
                                       [f"out_{i}"], [uec.Input((1, 16 + i))],
                                       uec.CompilationSettings(workspace_size=i), False, False,
                                       {}))
""")


def test_four_processes_inserting_at_once_keep_the_bound(here_fs, wheel, mod):
    """Each save's temp file is outside the bound; the commits are under the cache's lock."""
    directory, bound = here_fs / "busy", 40 * MiB  # 12 entries of 8 MiB, room for 4
    BlobCache(directory, max_bytes=bound)
    procs = [warm.popen(INSERTER, [directory, wheel, 3 * n, bound], cwd=ROOT)
             for n in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    ours = adapter(directory, trt="t", max_bytes=bound)
    assert ours.cache.stats().bytes <= bound
    kept = [i for i in range(12) if ours.check(hash_of(i)) is not None]
    assert 1 <= len(kept) <= 4
    for i in kept:
        assert tuple(ours.check(hash_of(i))) == entry(i, 8 * MiB)  # the child's very entry
    assert os.listdir(directory / "tmp") == []


# --- the shared tier (issue 37): two cache directories standing in for two machines -------


def shared(directory: Path, s3, *, endpoint: str | None = None, bucket: str | None = None,
           sm: str = SM, max_bytes: int = BOUND):
    """An adapter on its own EngineCache whose remote tier is the test bucket's ``tt/``."""
    from trtet_store import EngineCache
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    cache = EngineCache(directory, max_bytes=max_bytes, min_free=0,
                        remote=f"s3://{bucket or s3.bucket}/tt",
                        endpoint_url=endpoint or s3.endpoint.url)
    # No trusted keys here: these tests are about sharing, not trust (test_signed_entries).
    return for_torch_tensorrt(cache, tensorrt_version=TRT, compute_capability=sm,
                              trust_bucket_writers=True)


def _files(directory: Path) -> list[str]:
    return sorted(os.fspath(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file())


def _warnings(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and words in r.getMessage()]


def test_a_second_machine_loads_the_first_ones_engine_from_the_bucket(here_fs, mod, s3env):
    a = shared(here_fs / "a", s3env)
    a.insert(hash_of(1), entry(1, MiB))
    assert a.last_put.stored and a.last_remote.action == "published", a.last_remote
    packed = a.load(hash_of(1))
    assert a.last_remote.sent == len(packed)

    b = shared(here_fs / "b", s3env)
    got = b.check(hash_of(1))  # upstream's check: load, then pickle.loads
    assert tuple(got) == entry(1, MiB)
    assert (b.last_remote.action, b.last_remote.downloaded) == ("hit", len(packed))
    # Entered by a hard link of the download (put(consume=True)): no second copy of it.
    assert b.last_remote.placement == "link", b.last_remote
    assert b.load(hash_of(1)) == packed  # the bytes A's pack made, exactly
    [info] = b.cache.entries()  # entered in B's own cache, as A put it
    assert (info.key, info.size, info.metadata) == \
        (a.key_for(hash_of(1)), len(packed), a.cache.entries()[0].metadata)
    assert [f for f in _files(b.cache.directory) if "downloads" in f] == []
    b.last_remote = None
    assert tuple(b.check(hash_of(1))) == entry(1, MiB)
    assert b.last_remote is None  # a local hit now: the bucket is not asked again
    b.insert(hash_of(1), entry(1, MiB))  # B compiled it anyway: the first publisher wins
    assert b.last_remote.action == "not-published"
    assert "already in the shared cache" in b.last_remote.reason
    assert b.check(hash_of(9)) is None and b.last_remote.action == "miss"


def test_a_download_the_local_cache_cannot_take_is_served_once_and_removed(
        here_fs, mod, s3env, caplog):
    """The put(consume=True) of a remote hit skipped (the entry is over B's bound): the
    verified download is served as it is, not entered, and downloads/ is left empty."""
    a = shared(here_fs / "a", s3env)
    a.insert(hash_of(1), entry(1, MiB))
    assert a.last_remote.action == "published"
    b = shared(here_fs / "b", s3env, max_bytes=MiB // 2)
    assert tuple(b.check(hash_of(1))) == entry(1, MiB)
    assert (b.last_remote.action, b.last_remote.placement) == ("hit", None), b.last_remote
    assert b.cache.entries() == []
    assert [f for f in _files(b.cache.directory) if "downloads" in f] == []
    assert [w for w in _warnings(caplog, "not stored") if "larger than the cache's bound" in w]


def _blob_object(s3, adapter, h: str) -> str:
    key = adapter.key_for(h)
    [obj] = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket,
                                                          Prefix=f"tt/{key}/")["Contents"]
             if o["Key"].endswith("/blob")]
    return obj


def test_a_tampered_or_truncated_entry_in_the_bucket_is_a_miss_and_is_replaced(
        here_fs, mod, s3env, caplog):
    a = shared(here_fs / "a", s3env)
    b = shared(here_fs / "b", s3env)
    for i, damage in ((2, "other bytes"), (3, "truncated")):
        a.insert(hash_of(i), entry(i, MiB))
        assert a.last_remote.action == "published"
        obj = _blob_object(s3env, a, hash_of(i))
        body = s3env.client.get_object(Bucket=s3env.bucket, Key=obj)["Body"].read()
        bad = os.urandom(len(body)) if damage == "other bytes" else body[:len(body) // 2]
        s3env.client.put_object(Bucket=s3env.bucket, Key=obj, Body=bad)
        caplog.clear()
        assert b.check(hash_of(i)) is None, damage  # never unpickled, never entered
        assert b.last_remote.action == "miss" and "damaged" in b.last_remote.reason
        assert _warnings(caplog, "failed its checks, never served"), damage
        assert b.cache.entries() == [] if i == 2 else len(b.cache.entries()) == 1
        assert [f for f in _files(b.cache.directory) if "downloads" in f] == []
        # The rebuild's save replaces the damaged entry (If-Match its pointer): C gets it.
        b.insert(hash_of(i), entry(i, MiB))
        assert b.last_remote.action == "published", (damage, b.last_remote)
        c = shared(here_fs / f"c{i}", s3env)
        assert tuple(c.check(hash_of(i))) == entry(i, MiB)
        assert c.last_remote.action == "hit"
    assert not s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads")


def test_an_entry_for_another_gpu_is_a_miss(here_fs, mod, s3env, caplog):
    """The key already differs per GPU; an entry whose metadata disagrees is refused too."""
    from trtet_store.cache.tier import RemoteTier

    b = shared(here_fs / "b", s3env)
    blob = here_fs / "foreign"
    blob.write_bytes(mod.BaseEngineCache.pack(*entry(4, MiB)))
    tier = RemoteTier(f"s3://{s3env.bucket}/tt", endpoint_url=s3env.endpoint.url)
    done = tier.publish(b.key_for(hash_of(4)), [("blob", blob)], {
        "kind": "torch_tensorrt.packed", "torch_tensorrt_hash": hash_of(4),
        "versions": [["tensorrt", TRT]], "compute_capability": "sm_86"})
    assert done.published
    assert b.check(hash_of(4)) is None
    assert b.last_remote.action == "miss" and "'sm_86'" in b.last_remote.reason
    assert _warnings(caplog, "is not for this machine")
    assert b.cache.entries() == []


def test_no_server_is_a_miss_with_one_warning_and_the_local_cache_works(
        here_fs, mod, s3env, caplog, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    cases = [("no server", {"endpoint": f"http://127.0.0.1:{port}"}),
             ("no bucket", {"bucket": "no-such-bucket-here"}),
             ("wrong credentials", {})]
    for n, (what, where) in enumerate(cases):
        if what == "wrong credentials":
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        ours = shared(here_fs / f"m{n}", s3env, **where)
        caplog.clear()
        ours.insert(hash_of(5), entry(5, MiB))  # stored locally; the publish fails
        assert ours.last_put.stored, what
        assert ours.last_remote.action == "error", (what, ours.last_remote)
        assert ours.check(hash_of(6)) is None  # a local miss, the bucket unusable: a miss
        assert ours.check(hash_of(7)) is None
        assert tuple(ours.check(hash_of(5))) == entry(5, MiB)  # the local hit, unharmed
        warned = _warnings(caplog, "the shared tier")
        assert len(warned) == 1 and "the local cache alone" in warned[0], (what, warned)
    assert [o["Key"] for o in s3env.client.list_objects_v2(Bucket=s3env.bucket)
            .get("Contents", [])] == []


def test_a_load_waits_for_another_process_placing_the_same_key(here_fs, mod, s3env):
    """Held build lock = another process of this machine downloading the key: the load
    waits, then serves that entry locally and asks the bucket nothing (no second download
    into the same downloads/<key>/)."""
    import threading

    ours = shared(here_fs / "m", s3env)
    key = ours.key_for(hash_of(8))
    first_get = threading.Event()
    real_get = ours.cache.get

    def get(k, *a, **kw):  # tells the test when the load has missed locally
        got = real_get(k, *a, **kw)
        first_get.set()
        return got

    ours.cache.get = get
    other = BlobCache(ours.cache.directory, max_bytes=BOUND)  # "the other process"
    result = []
    with other.single_flight(key):
        worker = threading.Thread(target=lambda: result.append(ours.check(hash_of(8))))
        worker.start()
        assert first_get.wait(60)
        blob = here_fs / "placed"  # what the other process downloaded and places
        blob.write_bytes(mod.BaseEngineCache.pack(*entry(8, MiB)))
        assert other.put(key, blob, {
            "kind": "torch_tensorrt.packed", "torch_tensorrt_hash": hash_of(8),
            "versions": [["tensorrt", TRT]], "compute_capability": SM}).stored
    worker.join(60)
    assert not worker.is_alive() and tuple(result[0]) == entry(8, MiB)
    assert ours.last_remote is None  # the bucket was never asked


def test_for_torch_tensorrt_opens_a_shared_cache_and_refuses_remote_twice(here_fs, mod, s3env):
    from trtet_store import EngineCache
    from trtet_store.export.trt_engine_cache import for_torch_tensorrt
    from trtet_store.remote.errors import RemoteURLError

    url, ep = f"s3://{s3env.bucket}/tt", s3env.endpoint.url
    a = for_torch_tensorrt(here_fs / "a", remote=url, endpoint_url=ep, tensorrt_version=TRT,
                           compute_capability=SM, trust_bucket_writers=True)
    assert a.remote is not None and a.remote.url == url
    a.insert(hash_of(1), entry(1, MiB))
    assert a.last_remote.action == "published"
    assert tuple(shared(here_fs / "b", s3env).check(hash_of(1))) == entry(1, MiB)
    cache = EngineCache(here_fs / "c")
    with pytest.raises(TypeError, match="remote= applies to a cache opened here"):
        for_torch_tensorrt(cache, remote=url, tensorrt_version=TRT, compute_capability=SM)
    with pytest.raises(TypeError, match="endpoint_url= applies to remote="):
        for_torch_tensorrt(here_fs / "d", endpoint_url=ep, tensorrt_version=TRT,
                           compute_capability=SM)
    with pytest.raises(RemoteURLError):
        for_torch_tensorrt(here_fs / "e", remote="s3:/x", tensorrt_version=TRT,
                           compute_capability=SM, trust_bucket_writers=True)
    assert for_torch_tensorrt(cache, tensorrt_version=TRT, compute_capability=SM).remote is None
    assert not (here_fs / "d").exists()
