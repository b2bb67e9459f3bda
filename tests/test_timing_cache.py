"""TensorRT timing caches in the engine cache: keyed narrow, copied privately, merged by key.

Real filesystems (``here_fs``), the stub builder reading and writing its timing
cache (:class:`FakeBuilder`, whose tactics its cache lacks are counted in
``builder.timed``), and real processes (warm children, tests/warm.py) where two
builds race or one is killed mid-merge. "Another machine" is
:func:`trtet_store.export.timing_cache.gpu_facts` replaced: what the key reads
of the GPU, TensorRT, CUDA and driver.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import warm
import xxhash

import trtet_store
from trtet_store.cache.mergeable import merge_in
from trtet_store.export import timing_cache
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    linear_relu,
    parse_timing_cache,
    timing_tactics,
    write_timing_cache,
)

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

SM89 = {"gpu": "NVIDIA L4", "compute_capability": "sm_89",
        "tensorrt": ["tensorrt-cu12 10.14.1.48"], "cuda": "12.8", "driver": "570.124.06"}


@pytest.fixture
def machine(monkeypatch):
    """This process plays a machine with ``facts`` (default: an L4)."""
    def play(**facts):
        monkeypatch.setattr(timing_cache, "gpu_facts", lambda: {**SM89, **facts})
    play()
    return play


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _export(here: Path, name: str, module, inputs, builder: FakeBuilder, **settings):
    with installed(builder):
        return trtet_store.compile_and_save(module, inputs, here / f"{name}.pte",
                                            engine_cache=_cache(here), store=here / "store",
                                            **settings)


def _timing_entries(here: Path) -> dict[str, object]:
    return {e.key: e for e in _cache(here).entries()
            if e.metadata.get("kind") == timing_cache.TIMING_KIND}


def _entry_bytes(here: Path, key: str) -> bytes:
    hit = _cache(here).blobs.get(key)
    assert hit is not None
    with hit:
        return Path(hit.path).read_bytes()


def _tactics(module, inputs) -> set[str]:
    return set(timing_tactics(torch.export.export(module, inputs)))


def _fine_tune(module) -> None:
    with torch.no_grad():
        module[0].weight.mul_(-1)


# -- 1. the key -----------------------------------------------------------------------------


def test_the_key_names_gpu_tensorrt_build_cuda_driver_and_implementation_flags(machine):
    base = timing_cache.timing_key(timing_cache.timing_facts({}))
    assert base.startswith("trt-t-") and base.endswith("-sm_89")
    facts = timing_cache.timing_facts({"disable_tf32": True, "optimization_level": 5})
    assert {k: facts[k] for k in SM89} == SM89 and facts["flags"] == {"disable_tf32": True}
    differ = {}
    for name, fact in [("capability", {"compute_capability": "sm_86"}),
                       ("gpu", {"gpu": "NVIDIA L40S"}),
                       ("trt build", {"tensorrt": ["tensorrt-cu12 10.14.1.49"]}),
                       ("cuda", {"cuda": "12.9"}), ("driver", {"driver": "575.51.03"})]:
        machine(**fact)
        differ[name] = timing_cache.timing_key(timing_cache.timing_facts({}))
    machine()
    for name, flags in [("tf32", {"disable_tf32": True}), ("refit", {"immutable_weights": False}),
                        ("precisions", {"enabled_precisions": {torch.float16}})]:
        differ[name] = timing_cache.timing_key(timing_cache.timing_facts(flags))
    assert base not in differ.values() and len(set(differ.values())) == len(differ), differ
    # Settings that change no implementation share the cache; a set's order never matters.
    same = [timing_cache.timing_key(timing_cache.timing_facts(s)) for s in (
        {"optimization_level": 5}, {"workspace_size": 1 << 30, "min_block_size": 3})]
    assert same == [base, base]
    a = timing_cache.timing_facts({"enabled_precisions": {torch.float16, torch.float32}})
    b = timing_cache.timing_facts({"enabled_precisions": {torch.float32, torch.float16}})
    assert timing_cache.timing_key(a) == timing_cache.timing_key(b)


def test_the_facts_come_from_where_the_build_key_takes_them():
    from trtet_store.export import engine_key, engine_reuse

    facts = timing_cache.gpu_facts()
    assert facts["compute_capability"] == engine_key.compute_capability()
    assert facts["tensorrt"] == sorted(f"{n} {v}" for n, v in engine_reuse.build_versions()
                                       if n.startswith("tensorrt"))
    assert facts["cuda"] == str(torch.version.cuda or "none")


# -- 2-4. an entry kind; a build starts warm from a private copy; the event says so ------------


def test_a_second_build_starts_warm_and_times_nothing_it_learned(here_fs, machine):
    module, inputs = linear_relu()
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    first = _export(here_fs, "a", module, inputs, builder)
    wanted = _tactics(module, inputs)
    [event] = first.engine_cache
    assert event.outcome == "miss" and event.timing_cache == "timing cache: cold"
    assert builder.timed == [len(wanted)] and builder.warm == [0]
    [(key, entry)] = _timing_entries(here_fs).items()
    assert key == timing_cache.timing_key(timing_cache.timing_facts({}))
    assert entry.metadata["entries"] == len(wanted)
    assert entry.metadata["timing"]["compute_capability"] == "sm_89"
    header, tactics = parse_timing_cache(_entry_bytes(here_fs, key))
    assert header == key and set(tactics) == wanted

    _fine_tune(module)  # another build (new fingerprint), same layers: every tactic known
    second = _export(here_fs, "b", module, inputs, builder)
    [event] = second.engine_cache
    assert event.outcome == "miss"
    assert event.timing_cache == f"timing cache: warm, {len(wanted):,} entries"
    assert builder.timed == [len(wanted), 0] and builder.warm == [0, len(wanted)]
    assert builder.mismatched == []
    # The build wrote a private copy, never the entry: no copy is left in the cache's
    # tmp/ (looked at before another open of the cache, whose recovery would sweep it),
    # and the entry is whole and sealed.
    assert os.listdir(here_fs / "cache" / "tmp") == []
    assert _cache(here_fs).verify().ok
    # Counted and listed like any entry, kind "timing".
    from trtet_store.cli.cache import _rows

    rows = {r["key"]: r for r in _rows(_cache(here_fs))}
    assert rows[key]["kind"] == "timing" and rows[key]["gpu"] == "sm_89"
    assert rows[key]["versions"] == {"tensorrt-cu12": "10.14.1.48"}
    assert _cache(here_fs).stats().entries == len(rows)


class _DiesMidWrite(FakeBuilder):
    """A build that fails halfway through rewriting its timing cache (as a crash would)."""

    def __call__(self, exported_program, arg_inputs, kwarg_inputs, store, settings):
        with open(settings["timing_cache_path"], "r+b") as f:
            f.write(b"half-written garbage")
        raise RuntimeError("the build died mid-write")


def test_a_build_dying_mid_write_of_its_copy_leaves_the_entry_whole(here_fs, machine):
    module, inputs = linear_relu()
    _export(here_fs, "a", module, inputs, FakeBuilder(keep_timing=True, engine_sizes=(MiB,)))
    [key] = _timing_entries(here_fs)
    before = _entry_bytes(here_fs, key)
    _fine_tune(module)
    with pytest.raises(RuntimeError, match="died mid-write"):
        _export(here_fs, "b", module, inputs, _DiesMidWrite(engine_sizes=(MiB,)))
    # The build wrote its private copy, never the entry: whole, sealed, and warm next time.
    assert _entry_bytes(here_fs, key) == before
    assert _cache(here_fs).verify().ok
    assert os.listdir(here_fs / "cache" / "tmp") == []
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "c", module, inputs, builder).engine_cache
    assert event.timing_cache.startswith("timing cache: warm") and builder.timed == [0]


def test_a_caller_timing_cache_path_is_left_to_the_caller(here_fs, machine):
    module, inputs = linear_relu()
    mine = here_fs / "mine.bin"
    mine.write_bytes(b"")
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    report = _export(here_fs, "a", module, inputs, builder, timing_cache_path=os.fspath(mine))
    assert report.engine_cache[0].timing_cache is None
    assert _timing_entries(here_fs) == {}
    assert parse_timing_cache(mine.read_bytes())[1]  # the builder wrote the caller's file


def test_a_timing_entry_is_evicted_like_any_entry(here_fs, machine):
    module, inputs = linear_relu()
    _export(here_fs, "a", module, inputs, FakeBuilder(keep_timing=True, engine_sizes=(MiB,)))
    [key] = _timing_entries(here_fs)
    cache = _cache(here_fs)
    cache.blobs.touch(key)  # the most recent: a bound of one tiny entry keeps only it
    size = next(e.size for e in cache.entries() if e.key == key)
    cache.prune(size)
    assert [e.key for e in cache.entries()] == [key]
    cache.prune(1)
    assert _timing_entries(here_fs) == {}


# -- what is never loaded or merged -----------------------------------------------------------


def test_a_cache_of_another_gpu_or_tensorrt_build_is_never_loaded(here_fs, machine):
    module, inputs = linear_relu()
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    machine(compute_capability="sm_86", gpu="NVIDIA A10")
    _export(here_fs, "a", module, inputs, builder)
    for n, fact in enumerate([{}, {"tensorrt": ["tensorrt-cu12 10.14.1.49"]}]):
        machine(**fact)
        with torch.no_grad():
            module[0].bias.add_(1.0)  # a new build each time (no hit of an earlier one)
        [event] = _export(here_fs, f"b{n}", module, inputs, builder).engine_cache
        assert event.timing_cache == "timing cache: cold", event.timing_cache
    assert builder.mismatched == [] and builder.warm == [0, 0, 0]
    # Three keys, three entries: none mixed into another.
    entries = _timing_entries(here_fs)
    assert len(entries) == 3
    for key in entries:
        header, _ = parse_timing_cache(_entry_bytes(here_fs, key))
        assert header == key


def test_an_entry_under_this_key_made_for_another_device_is_refused_and_replaced(here_fs,
                                                                                 machine):
    module, inputs = linear_relu()
    key = timing_cache.timing_key(timing_cache.timing_facts({}))
    foreign = {**SM89, "compute_capability": "sm_86", "flags": {}}
    planted = write_timing_cache("trt-t-other-sm_86", {"0" * 16: "deadbeef"})
    (here_fs / "planted").write_bytes(planted)
    _cache(here_fs).blobs.put(key, here_fs / "planted", {
        "kind": timing_cache.TIMING_KIND, "timing": foreign})
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "a", module, inputs, builder).engine_cache
    assert event.timing_cache.startswith("timing cache: cold (it was made for another "
                                         "compute_capability 'sm_86' (here 'sm_89')")
    assert builder.mismatched == [] and builder.warm == [0]
    header, tactics = parse_timing_cache(_entry_bytes(here_fs, key))
    assert header == key and "0" * 16 not in tactics  # replaced by this build's, not merged


def test_a_merge_tensorrt_refuses_leaves_the_entry_as_it_was_and_says_why(here_fs, machine):
    module, inputs = linear_relu()
    key = timing_cache.timing_key(timing_cache.timing_facts({}))
    # Our key and facts, but bytes whose own header TensorRT will not combine with ours.
    planted = write_timing_cache("trt-t-otherheader-sm_89", {"1" * 16: "cafef00d"})
    (here_fs / "planted").write_bytes(planted)
    _cache(here_fs).blobs.put(key, here_fs / "planted", {
        "kind": timing_cache.TIMING_KIND, "timing": timing_cache.timing_facts({})})
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "a", module, inputs, builder).engine_cache
    assert event.outcome == "miss" and event.stored  # the export itself is unharmed
    assert "not merged: the merge was refused, the entry is left as it was: timing cache " \
           "header mismatch" in event.timing_cache, event.timing_cache
    assert _entry_bytes(here_fs, key) == planted
    assert os.listdir(here_fs / "cache" / "tmp") == []


def test_a_damaged_entry_is_never_handed_to_a_build_which_runs_cold(here_fs, machine):
    module, inputs = linear_relu()
    builder = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    _export(here_fs, "a", module, inputs, builder)
    [key] = _timing_entries(here_fs)
    hit = _cache(here_fs).blobs.get(key)
    with hit:
        path = Path(hit.path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a choice flipped, same size
    os.chmod(path, 0o600)
    path.write_bytes(bytes(data))
    _fine_tune(module)
    [event] = _export(here_fs, "b", module, inputs, builder).engine_cache
    assert event.timing_cache == "timing cache: cold"  # the blob cache dropped it unread
    assert builder.warm == [0, 0]
    assert _cache(here_fs).verify().ok


# -- processes: no lost update; a SIGKILL mid-merge --------------------------------------------

CHILD = r'''
import json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
import trtet_store
from trtet_store.export import timing_cache
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

timing_cache.gpu_facts = lambda: cfg["facts"]
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(16, cfg["width"]), torch.nn.ReLU()).eval()
inputs = (torch.randn(2, 16),)
builder = FakeBuilder(keep_timing=True, engine_sizes=(1 << 20,),
                      tactic_seconds=cfg["tactic_seconds"])
open(cfg["ready"] + str(os.getpid()), "w").close()
while not os.path.exists(cfg["go"]):
    time.sleep(0.005)
cache = trtet_store.EngineCache(cfg["cache"], max_bytes=1 << 30, min_free=0)
with installed(builder):
    report = trtet_store.compile_and_save(module, inputs, cfg["out"], engine_cache=cache,
                                          store=cfg["store"])
print(json.dumps({"timed": builder.timed, "line": report.engine_cache[0].timing_cache}))
'''


def _wait_files(here: Path, prefix: str, n: int, procs) -> None:
    deadline = time.monotonic() + 60
    while len([p for p in here.iterdir() if p.name.startswith(prefix)]) < n:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.01)


def test_two_processes_building_different_models_on_one_key_both_end_up_in_it(here_fs,
                                                                              machine):
    procs = []
    for width in (16, 32):
        cfg = {"cache": os.fspath(here_fs / "cache"), "facts": SM89, "width": width,
               "tactic_seconds": 0.02, "ready": os.fspath(here_fs / "ready-"),
               "go": os.fspath(here_fs / "go"), "out": os.fspath(here_fs / f"{width}.pte"),
               "store": os.fspath(here_fs / f"store-{width}")}
        procs.append(warm.popen(CHILD, [json.dumps(cfg)], cwd=ROOT))
    _wait_files(here_fs, "ready-", 2, procs)
    (here_fs / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Both started cold (together), each timed its own tactics ...
    assert [r["line"] for r in results] == ["timing cache: cold"] * 2
    torch.manual_seed(0)
    wanted = set()
    for width in (16, 32):
        module = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU()).eval()
        wanted |= _tactics(module, (torch.randn(2, 16),))
    # ... and the entry holds both: the second merge combined with the first's entry.
    [key] = _timing_entries(here_fs)
    _, tactics = parse_timing_cache(_entry_bytes(here_fs, key))
    assert set(tactics) == wanted
    assert _timing_entries(here_fs)[key].metadata["entries"] == len(wanted)


MERGE_CHILD = r'''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
from trtet_store.cache import BlobCache
from trtet_store.cache.mergeable import merge_in
from trtet_store.testing.stub_tensorrt import FakeBuilder

def combine(current, learned):
    out = FakeBuilder.combine(current, learned)
    open(cfg["ready"], "w").close()  # mid-merge: the entry read, the lock held
    while True:
        time.sleep(0.05)

cache = BlobCache(cfg["cache"], max_bytes=1 << 30, min_free=0)
merge_in(cache, cfg["key"], cfg["learned"], combine, lambda m: None, {"kind": "t"},
         limit=1 << 20)
'''


def test_a_sigkill_mid_merge_leaves_the_previous_entry_whole(here_fs):
    from trtet_store.cache import BlobCache

    cache = BlobCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    key = "trt-t-0123456789abcdef-sm_89"
    before = write_timing_cache(key, {"a" * 16: "00000001", "b" * 16: "00000002"})
    (here_fs / "before").write_bytes(before)
    assert cache.put(key, here_fs / "before", {"kind": "t"}).stored
    learned = write_timing_cache(key, {"c" * 16: "00000003"})
    (here_fs / "learned").write_bytes(learned)
    cfg = {"cache": os.fspath(here_fs / "cache"), "key": key,
           "learned": os.fspath(here_fs / "learned"), "ready": os.fspath(here_fs / "ready")}
    proc = warm.popen(MERGE_CHILD, [json.dumps(cfg)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (here_fs / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    cache = BlobCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)  # recovers tmp/
    hit = cache.get(key, verify="full")
    assert hit is not None
    with hit:
        assert Path(hit.path).read_bytes() == before
        assert hit.digest == xxhash.xxh3_128_hexdigest(before)
    assert os.listdir(here_fs / "cache" / "tmp") == []
    # The dead merger's lock went with it: the next merge runs and keeps all three.
    done = merge_in(cache, key, here_fs / "learned",
                    lambda c, n: (FakeBuilder.combine(c, n), {}), lambda m: None,
                    {"kind": "t"}, limit=1 << 20, timeout=10)
    assert done.merged
    hit = cache.get(key)
    with hit:
        assert parse_timing_cache(Path(hit.path).read_bytes())[1] == {
            "a" * 16: "00000001", "b" * 16: "00000002", "c" * 16: "00000003"}
