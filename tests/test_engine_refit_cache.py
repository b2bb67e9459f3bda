"""New weights, same engine: the cache refits, never rebuilds (issue 46 items 2, 4, 7's events).

Real filesystems, the stub builder counting builds and :class:`FakeRefitter`
(its engine is a function of the structure entry and the new weights, so
each test computes what the ``.pte`` must hold). Cross-process claims run in
separate processes (CHILD, as warm children: tests/warm.py) that count builds and refits by
appending to files.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import warm

import trtet_store
from trtet_store.export import engine_cache, engine_refit, engine_reuse
from trtet_store.export.engine_key import RECORD_KIND
from trtet_store.io.names import BLOB_PART_SUFFIX
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed, linear_relu

ROOT = Path(__file__).resolve().parents[1]
REFITTABLE = {"immutable_weights": False}

CHILD = r'''
import json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed, linear_relu

def note(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())

class Counting(FakeBuilder):
    def __call__(self, *args, **kwargs):
        note(cfg["builds"])
        return super().__call__(*args, **kwargs)

def hook(writer):
    note(cfg["refits"])
    if cfg.get("block"):  # the barrier: the test SIGKILLs us here, mid-refit
        while True:
            time.sleep(0.05)
    time.sleep(cfg.get("sleep", 0))  # a refit that takes a while: the others wait on it

builder = Counting(engine_sizes=(cfg["size"],))
cache = trtet_store.EngineCache(cfg["cache"], max_bytes=1 << 30, min_free=0)
module, inputs = linear_relu()
with torch.no_grad():
    module[0].weight.mul_(-1)  # the fine-tune
if cfg.get("ready"):
    open(cfg["ready"] + str(os.getpid()), "w").close()
    while not os.path.exists(cfg["go"]):
        time.sleep(0.005)
with installed(builder, refitter=FakeRefitter(hook=hook)):
    report = trtet_store.compile_and_save(module, inputs, cfg["out"], engine_cache=cache,
                                          store=cfg["store"], immutable_weights=False)
print(json.dumps({"events": [e.to_json() for e in report.engine_cache]}))
'''


def _start(here: Path, name: str, **cfg) -> warm.WarmChild:
    cfg = {"cache": os.fspath(here / "cache"), "builds": os.fspath(here / "builds"),
           "refits": os.fspath(here / "refits"), "size": 2 * MiB,
           "out": os.fspath(here / f"{name}.pte"), "store": os.fspath(here / f"store-{name}"),
           **cfg}
    return warm.popen(CHILD, [json.dumps(cfg)], cwd=ROOT)


def _result(proc: warm.WarmChild, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def engine_bytes(pte: Path) -> list[bytes]:
    """Each inline engine of ``pte``, read where ``trtet-store inspect`` finds it."""
    from trtet_store import inspector

    out = []
    with open(pte, "rb") as f:
        for d in inspector.inspect_file(pte).delegates:
            engine = d["tensorrt"]["engine"]
            f.seek(engine["file_offset"])
            out.append(f.read(engine["size"]))
    return out


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _export(here: Path, name: str, module: torch.nn.Module, inputs: tuple,
            builder: FakeBuilder, refitter: FakeRefitter, **settings):
    with installed(builder, refitter=refitter):
        return trtet_store.compile_and_save(module, inputs, here / f"{name}.pte",
                                            engine_cache=_cache(here), store=here / "store",
                                            **settings)


def _fine_tune(module: torch.nn.Module) -> None:
    with torch.no_grad():
        module[0].weight.mul_(-1)


def _kinds(here: Path) -> list[str]:
    return sorted(e.metadata.get("kind", "") for e in _cache(here).entries()
                  if e.metadata.get("kind") in (RECORD_KIND, engine_refit.STRUCTURE_KIND))


def _full_key(module: torch.nn.Module, inputs: tuple, settings: dict) -> str:
    fingerprint = engine_reuse.build_fingerprint(torch.export.export(module, inputs), inputs,
                                                 None, settings)
    return engine_cache.build_key(fingerprint)


def _no_stray_files(*dirs: Path) -> None:
    for d in dirs:
        stray = [p.name for p in d.rglob(f"*{BLOB_PART_SUFFIX}")] if d.exists() else []
        assert stray == [], stray


def test_new_weights_with_refittable_settings_are_refit_then_a_clone(here_fs):
    module, inputs = linear_relu()
    builder, refitter = FakeBuilder(engine_sizes=(3 * MiB + 5,)), FakeRefitter()
    first = _export(here_fs, "a", module, inputs, builder, refitter, **REFITTABLE)
    assert [e.outcome for e in first.engine_cache] == ["miss"]
    assert _kinds(here_fs) == [RECORD_KIND, engine_refit.STRUCTURE_KIND]
    [structure_engine] = engine_bytes(here_fs / "a.pte")  # as built: the structure entry's

    _fine_tune(module)
    second = _export(here_fs, "b", module, inputs, builder, refitter, **REFITTABLE)
    [event] = second.engine_cache
    assert (event.outcome, event.stored, event.reason) == ("refit", True, None)
    assert event.missed_because == "weights changed"
    assert event.written == event.size and event.seconds is not None
    assert len(builder.built) == 1 and len(refitter.refits) == 1  # 0 builds for B
    expected = FakeRefitter.expected(structure_engine, torch.export.export(module, inputs))
    assert engine_bytes(here_fs / "b.pte") == [expected]
    # The refit is cached under B's full key: B again is a clone hit, no refit, no build.
    third = _export(here_fs, "b2", module, inputs, builder, refitter, **REFITTABLE)
    assert [e.outcome for e in third.engine_cache] == ["hit"]
    assert len(builder.built) == 1 and len(refitter.refits) == 1
    assert engine_bytes(here_fs / "b2.pte") == [expected]
    # One structure entry (the first build's), two full entries (A built, B refit); B's
    # record names the structure it was refit from, and `cache list` shows the kinds.
    assert _kinds(here_fs) == [RECORD_KIND, RECORD_KIND, engine_refit.STRUCTURE_KIND]
    from trtet_store.cli.cache import _rows

    rows = {r["key"]: r for r in _rows(_cache(here_fs))}
    b_key = event.key.removesuffix(".e0")
    assert rows[b_key]["metadata"]["refit_from"].startswith("trt-s-")
    assert rows[rows[b_key]["metadata"]["refit_from"]]["kind"] == "structure"
    assert rows[first.engine_cache[0].key.removesuffix(".e0")]["kind"] == "build"
    _no_stray_files(here_fs / "store", here_fs / "cache")


def test_the_structure_key_holds_no_weights_and_the_entry_says_what_a_refit_needs(here_fs):
    module, inputs = linear_relu()
    _export(here_fs, "a", module, inputs, FakeBuilder(engine_sizes=(MiB,)), FakeRefitter(),
            **REFITTABLE)
    before = _full_key(module, inputs, REFITTABLE)
    _fine_tune(module)
    assert _full_key(module, inputs, REFITTABLE) != before
    [structure] = [e for e in _cache(here_fs).entries()
                   if e.metadata.get("kind") == engine_refit.STRUCTURE_KIND]
    fingerprint = engine_reuse.build_fingerprint(torch.export.export(module, inputs), inputs,
                                                 None, REFITTABLE)
    assert structure.key == engine_refit.structure_key(fingerprint)  # the new weights' too
    assert structure.metadata["refit"] == {"refittable": True, "stripped": False,
                                           "settings": {"immutable_weights": False}}
    assert structure.metadata["built_as"] == before


@pytest.mark.parametrize("settings", [
    {},  # Torch-TensorRT's default: immutable weights
    {"immutable_weights": True},
    {"immutable_weights": False, "refit_identical_engine_weights": True},
], ids=["default", "immutable", "refit-identical"])
def test_an_engine_that_may_not_take_other_weights_is_never_refit(here_fs, settings):
    module, inputs = linear_relu()
    builder, refitter = FakeBuilder(engine_sizes=(MiB,)), FakeRefitter()
    _export(here_fs, "a", module, inputs, builder, refitter, **settings)
    assert engine_refit.STRUCTURE_KIND not in _kinds(here_fs)
    _fine_tune(module)
    report = _export(here_fs, "b", module, inputs, builder, refitter, **settings)
    assert [e.outcome for e in report.engine_cache] == ["miss"]
    assert refitter.refits == [] and len(builder.built) == 2


@pytest.mark.parametrize("failure", ["raises", "bad-bytes"])
def test_a_failed_refit_falls_back_to_a_build_with_the_reason_and_nothing_torn(here_fs,
                                                                              failure):
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    _export(here_fs, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    cache_before = {e.key: (e.size, e.digest) for e in _cache(here_fs).entries()}
    _fine_tune(module)
    refitter = FakeRefitter(fail="2 weight(s) of the engine have no new value") \
        if failure == "raises" else FakeRefitter(corrupt=True)
    report = _export(here_fs, "b", module, inputs, builder, refitter, **REFITTABLE)
    [event] = report.engine_cache
    assert (event.outcome, event.stored) == ("miss", True)
    said = "have no new value" if failure == "raises" else "fails its check"
    assert event.reason.startswith("refit failed: RefitError: ") and said in event.reason
    assert event.reason.endswith("; built instead")
    assert len(builder.built) == 2
    assert engine_bytes(here_fs / "b.pte") == [engine_bytes(here_fs / "a.pte")[0]]  # built
    # Nothing torn: every entry of before is there, unchanged, but the structure entry
    # whose refit failed (replaced by B's build's: the test below); no staged part left.
    after = {e.key: (e.size, e.digest) for e in _cache(here_fs).entries()}
    kept = {k: v for k, v in cache_before.items() if not k.startswith("trt-s-")}
    assert {k: after.get(k) for k in kept} == kept
    assert {k for k in cache_before if k.startswith("trt-s-")} <= set(after)
    assert _cache(here_fs).verify().ok
    _no_stray_files(here_fs / "store", here_fs / "cache")
    # The build is cached under B's full key: B again is a hit.
    again = _export(here_fs, "b2", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    assert [e.outcome for e in again.engine_cache] == ["hit"] and len(builder.built) == 2


def test_a_sigkill_during_a_refit_leaves_no_full_entry_and_the_next_run_refits(here_fs):
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    _export(here_fs, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    entries_before = sorted(e.key for e in _cache(here_fs).entries())
    child = _start(here_fs, "b", block=True, store=os.fspath(here_fs / "store"))
    deadline = time.monotonic() + 300
    while not _lines(here_fs / "refits"):  # the child is mid-refit (its header written)
        assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()
    _fine_tune(module)
    key = _full_key(module, inputs, REFITTABLE)
    assert key not in {e.key for e in _cache(here_fs).entries()}
    assert sorted(e.key for e in _cache(here_fs).entries()) == entries_before
    assert not (here_fs / "b.pte").exists()
    assert _lines(here_fs / "builds") == []
    refitter = FakeRefitter()
    report = _export(here_fs, "b", module, inputs, builder, refitter, **REFITTABLE)
    assert [e.outcome for e in report.engine_cache] == ["refit"]
    assert len(refitter.refits) == 1 and len(builder.built) == 1
    assert key in {e.key for e in _cache(here_fs).entries()}
    _no_stray_files(here_fs / "store", here_fs / "cache")


def test_eight_processes_exporting_one_fine_tune_make_one_refit(here_fs):
    module, inputs = linear_relu()
    _export(here_fs, "a", module, inputs, FakeBuilder(engine_sizes=(2 * MiB,)), FakeRefitter(),
            **REFITTABLE)
    ready, go = here_fs / "ready-", here_fs / "go"
    procs = [_start(here_fs, f"b{i}", sleep=2.0, ready=os.fspath(ready), go=os.fspath(go))
             for i in range(8)]
    deadline = time.monotonic() + 600
    while len(list(here_fs.glob("ready-*"))) < 8:  # every interpreter loaded, then all go
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    results = [_result(p) for p in procs]
    assert len(_lines(here_fs / "refits")) == 1, _lines(here_fs / "refits")
    assert _lines(here_fs / "builds") == []
    assert sorted(r["events"][0]["outcome"] for r in results) == ["hit"] * 7 + ["refit"]
    _fine_tune(module)
    [structure_engine] = engine_bytes(here_fs / "a.pte")
    expected = FakeRefitter.expected(structure_engine, torch.export.export(module, inputs))
    for i in range(8):
        assert engine_bytes(here_fs / f"b{i}.pte") == [expected]


def test_the_cli_line_of_a_refit_says_what_it_wrote_and_took():
    from trtet_store.cli.compile import _engine_event
    from trtet_store.export.engine_record import EngineCacheEvent

    event = EngineCacheEvent("e0", "trt-x-sm_90.e0", 3 * MiB, "refit", "clone", True,
                             missed_because="weights changed", written=3 * MiB, seconds=1.25)
    assert _engine_event(event) == \
        "refit (3.0 MiB written, 1.2 s), cached (clone), missed because weights changed"
    shared = EngineCacheEvent("e0", "trt-x-sm_90.e0", 3 * MiB, "refit", "clone", True,
                              downloaded=3 * MiB + 4096, published=True,
                              missed_because="weights changed", written=3 * MiB, seconds=1.25)
    assert _engine_event(shared) == \
        "refit (3.0 MiB written, 1.2 s, structure entry 3.0 MiB downloaded), cached (clone), " \
        "missed because weights changed, published"


def test_a_program_with_weights_outside_its_engines_keeps_no_structure_entry(here_fs):
    # A partial compile leaves CPU operators with weights: a refit of the engines alone
    # would ship the old ones beside the new engines.
    module, inputs = linear_relu()
    builder, refitter = FakeBuilder(engine_sizes=(MiB,), cpu_tail=4), FakeRefitter()
    _export(here_fs, "a", module, inputs, builder, refitter, **REFITTABLE)
    assert engine_refit.STRUCTURE_KIND not in _kinds(here_fs)
    _fine_tune(module)
    report = _export(here_fs, "b", module, inputs, builder, refitter, **REFITTABLE)
    assert [e.outcome for e in report.engine_cache] == ["miss"] and refitter.refits == []


@pytest.mark.parametrize(("refit", "settings", "refused"), [
    ({"refittable": True, "settings": {"immutable_weights": False}}, REFITTABLE, None),
    ({"refittable": True, "settings": {"immutable_weights": False}}, {},
     "the export's settings make no refittable engine"),
    ({"refittable": True, "settings": {}}, REFITTABLE,
     "the structure entry is not a refittable build"),
    ({"refittable": True, "settings": {"immutable_weights": False,
                                       "refit_identical_engine_weights": True}}, REFITTABLE,
     "the structure entry is not a refittable build"),
    ({"refittable": False, "settings": {"immutable_weights": False}}, REFITTABLE,
     "the structure entry is not a refittable build"),
    (None, REFITTABLE, "the structure entry is not a refittable build"),
])
def test_the_refit_gate_reads_both_the_entry_and_the_export(refit, settings, refused):
    # Behind the structure key (which holds the settings): an entry whose record does not
    # say it was built refittable is never refit, whatever the export asks.
    assert engine_refit._refuse({"refit": refit}, settings) == refused


def test_on_xfs_a_refit_writes_the_new_engines_once(make_fs):
    # The refit's output is the one copy: the cache and the .pte take it by clone.
    from trtet_store.bench import measure

    mnt = make_fs("xfs", 600)
    engine_mib, engines = 32, 2
    total = engines * engine_mib * MiB
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(engine_mib * MiB,) * engines)
    _export(mnt, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    _fine_tune(module)
    refitter = FakeRefitter()
    measure.syncfs(mnt)
    before = measure.device_io(mnt)
    report = _export(mnt, "b", module, inputs, builder, refitter, **REFITTABLE)
    measure.syncfs(mnt)
    written = measure.device_io(mnt)[1] - before[1]
    assert [e.outcome for e in report.engine_cache] == ["refit"] * engines
    assert [e.placement for e in report.engine_cache] == ["clone"] * engines
    assert written <= total + 4 * MiB, \
        f"a refit wrote {written / total:.2f} copies of the engines (floor 1)"


def _device_written(mnt: Path, run) -> tuple[int, object]:
    from trtet_store.bench import measure

    measure.syncfs(mnt)
    before = measure.device_io(mnt)
    out = run()
    measure.syncfs(mnt)
    return measure.device_io(mnt)[1] - before[1], out


def test_on_ext4_a_refit_writes_two_copies_the_cache_links_the_refit(make_fs):
    # No clone: the refit's output enters the cache by hard link and the .pte copies it
    # from the cache's file (two copies; a put by copy, then an insert and a move, wrote 2.5).
    mnt = make_fs("ext4", 640)
    engine_mib, engines = 32, 2
    total = engines * engine_mib * MiB
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(engine_mib * MiB,) * engines)
    _export(mnt, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    structure_engines = engine_bytes(mnt / "a.pte")
    _fine_tune(module)
    written, report = _device_written(mnt, lambda: _export(
        mnt, "b", module, inputs, builder, FakeRefitter(), **REFITTABLE))
    assert [(e.outcome, e.placement) for e in report.engine_cache] == [("refit", "link")] * 2
    assert written <= 2 * total + 4 * MiB, \
        f"a refit wrote {written / total:.2f} copies of the engines (floor 2)"
    program = torch.export.export(module, inputs)
    assert engine_bytes(mnt / "b.pte") == [FakeRefitter.expected(e, program)
                                           for e in structure_engines]
    assert _cache(mnt).verify().ok
    _no_stray_files(mnt / "store", mnt / "cache")
    again = _export(mnt, "b2", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    assert [e.outcome for e in again.engine_cache] == ["hit"] * 2
    assert engine_bytes(mnt / "b2.pte") == engine_bytes(mnt / "b.pte")


def _linked_refit(here: Path, monkeypatch: pytest.MonkeyPatch,
                  plant: Callable[[str], None]):
    """A refittable build "a" (its structure entry cached), the weights fine-tuned, then
    "b" with no clone (the cache takes the refit by hard link) and ``plant(full key)`` in
    place. b.pte holds the refit engine and no file is left stray; returns b's report."""
    from trtet_store.export import engine_build

    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(2 * MiB,))
    _export(here, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    [structure_engine] = engine_bytes(here / "a.pte")
    _fine_tune(module)
    plant(_full_key(module, inputs, REFITTABLE))
    monkeypatch.setattr(engine_build, "_clones", lambda engines, cache_dir: False)
    report = _export(here, "b", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    program = torch.export.export(module, inputs)
    assert engine_bytes(here / "b.pte") == [FakeRefitter.expected(structure_engine, program)]
    _no_stray_files(here / "store", here / "cache")
    return report


def test_a_linked_refit_the_cache_lets_go_of_at_once_is_copied_back_not_lost(here_fs,
                                                                             monkeypatch):
    # Another process's eviction between the put and our pin: the bytes come back from our
    # own descriptor of the file the cache took.
    from trtet_store.cache import BlobCache

    real_get = BlobCache.get

    def plant(record: str) -> None:
        gone = record + ".e0"

        def get(self, key, **kw):
            if key == gone:
                return None
            return real_get(self, key, **kw)

        monkeypatch.setattr(BlobCache, "get", get)

    report = _linked_refit(here_fs, monkeypatch, plant)
    assert [(e.outcome, e.placement) for e in report.engine_cache] == [("refit", "link")]


def test_a_cache_failing_after_it_took_a_linked_refit_never_fails_the_export(here_fs,
                                                                            monkeypatch):
    # The engines went in by link (their staged files given up), then the record's put
    # raised: the save still finds every engine (the cache's files, shared).
    from trtet_store.cache import BlobCache

    real_put = BlobCache.put

    def plant(record: str) -> None:
        def put(self, key, *args, **kw):
            if key == record:
                raise RuntimeError("planted: the record's put failed")
            return real_put(self, key, *args, **kw)

        monkeypatch.setattr(BlobCache, "put", put)

    report = _linked_refit(here_fs, monkeypatch, plant)
    [event] = report.engine_cache
    assert (event.outcome, event.stored) == ("refit", False)
    assert "planted: the record's put failed" in event.reason


def test_a_structure_entry_whose_refit_fails_is_dropped_and_the_build_keeps_a_fresh_one(
        here_fs):
    # Every fine-tune of a structure entry whose refits fail its check would try it again
    # and build after: dropped on the failure, and the build that follows keeps its own.
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(MiB,))
    _export(here_fs, "a", module, inputs, builder, FakeRefitter(), **REFITTABLE)
    a_key = _full_key(module, inputs, REFITTABLE)
    _fine_tune(module)
    b_key = _full_key(module, inputs, REFITTABLE)
    report = _export(here_fs, "b", module, inputs, builder, FakeRefitter(corrupt=True),
                     **REFITTABLE)
    [event] = report.engine_cache
    assert event.outcome == "miss" and "fails its check" in event.reason
    assert "; the structure entry trt-s-" in event.reason and "was dropped" in event.reason
    [structure] = [e for e in _cache(here_fs).entries()
                   if e.metadata.get("kind") == engine_refit.STRUCTURE_KIND]
    assert structure.metadata["built_as"] == b_key != a_key  # B's build's, not A's
    # The next fine-tune refits from it.
    with torch.no_grad():
        module[0].weight.mul_(3.0)
    refitter = FakeRefitter()
    again = _export(here_fs, "c", module, inputs, builder, refitter, **REFITTABLE)
    assert [e.outcome for e in again.engine_cache] == ["refit"] and len(builder.built) == 2
    _no_stray_files(here_fs / "store", here_fs / "cache")


def test_cache_list_and_prune_say_which_full_entries_came_from_a_structure(here_fs):
    from test_cli_cache import cli, cli_json

    module, inputs = linear_relu()
    builder, refitter = FakeBuilder(engine_sizes=(MiB,)), FakeRefitter()
    _export(here_fs, "a", module, inputs, builder, refitter, **REFITTABLE)
    a_key = _full_key(module, inputs, REFITTABLE)
    _fine_tune(module)
    _export(here_fs, "b", module, inputs, builder, refitter, **REFITTABLE)
    b_key = _full_key(module, inputs, REFITTABLE)
    rows = {r["key"]: r for r in cli_json("--dir", here_fs / "cache", "list")}
    [skey] = [k for k, r in rows.items() if r["kind"] == "structure"]
    assert rows[skey]["full_entries"] == [a_key, b_key]  # built as A, refit into B
    assert rows[b_key]["refit_from"] == skey and "refit_from" not in rows[a_key]
    shown = cli("--dir", here_fs / "cache", "list").stdout
    assert f"structure trt-s-{skey[6:14]}" in shown and "came from it" in shown, shown
    # A full entry never needs its structure entry to be served; each use of a full
    # entry of its structure touches it, so a bound evicts the full entries first (the
    # refit B, least recently used; A's engine is the structure entry's bytes, stored
    # once, so it frees nothing) and prune says when it drops the structure entry.
    _export(here_fs, "b2", module, inputs, builder, refitter, **REFITTABLE)  # a hit
    got = cli_json("--dir", here_fs / "cache", "prune", "--max-bytes",
                   str(_cache(here_fs).stats().bytes - 1))
    assert f"{b_key}.e0" in got["evicted"] and skey not in got["evicted"], got
    assert f"{skey}.e0" not in got["evicted"] and got["structures_dropped"] == {}, got
    done = cli("--dir", here_fs / "cache", "prune", "--max-bytes", "0")
    assert f"dropped the structure entry {skey}: no cached full entry came from it" \
        in done.stdout, done.stdout
