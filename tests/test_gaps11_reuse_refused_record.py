"""engine_reuse.reuse: a staged build record that record_check refuses (load_record raises
UnsafeRecordError) is checked BEFORE anything is taken, so the refusal leaves the staging
store as it was: the refused record and the engines stay staged (kept blobs in the caller's
store, orphans of a dead store's directory), and an older record of the same build that is
data is still reused, its engines with it.

The order is the guarantee: taking (``_Staged.take``: an orphan adopted by rename, a kept
blob un-kept) and only then loading would leave a refused record adopted into this store
(deleted with it: "its files are kept" broken) and its engines taken away from the next
record. A bucket writer's record never runs (the marker its pickle would write is absent).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_tier_no_code import pickled_weight

import trtet_store
from trtet_store.export import engine_reuse
from trtet_store.export import tensorrt as trt
from trtet_store.io import BlobStore
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

pytestmark = pytest.mark.executorch(reason="a build record is a torch.export archive")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """One real build of the small model through an engine cache: its record's bytes and
    metadata, and its engine's bytes (what a staging store holds after a failed export)."""
    here = tmp_path_factory.mktemp("reuse-record")
    cache = trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)
    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(MiB,), seeds=(7,))):
        report = trtet_store.compile_and_save(module, inputs, here / "a.pte",
                                              engine_cache=cache)
    [event] = report.engine_cache
    key = event.key.rsplit(".e", 1)[0]
    with cache.blobs.get(key) as hit:
        metadata, record = dict(hit.metadata), Path(hit.path).read_bytes()
    with cache.blobs.get(f"{key}.e0") as hit:
        engine = Path(hit.path).read_bytes()
    trt.unregister_engines(list(trt._engines.values()))
    return {"metadata": metadata, "record": record, "engine": engine, "here": here}


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))


def _stage(store: BlobStore, built: dict, marker: Path) -> tuple[list, str]:
    """The engine and the good record kept first, then a forged (pickled) record of the same
    build: the newest, so reuse tries it first."""
    fp = built["metadata"]["fingerprint"]
    engine = store.put(built["engine"], metadata={"kind": engine_reuse.ENGINE_KIND,
                                                  "fingerprint": fp})
    record_meta = {"kind": engine_reuse.RECORD_KIND, "fingerprint": fp,
                   "engines": built["metadata"]["engines"]}
    good = store.put(built["record"], metadata=record_meta)
    forged = store.put(pickled_weight(built["record"], marker), metadata=record_meta)
    return [engine, good, forged], fp


def test_reuse_checks_a_kept_record_before_taking_it_or_its_engines(tmp_path, built, caplog):
    marker = tmp_path / "marker"
    store = BlobStore(tmp_path / "store")
    (engine, good, forged), fp = _stage(store, built, marker)
    engine_reuse.keep(store, [engine, good], own_store=False)
    engine_reuse.keep(store, [forged], own_store=False)
    with caplog.at_level(logging.WARNING, logger="trtet_store.tensorrt"):
        result = engine_reuse.reuse(store, fp)
    assert not marker.exists(), "the forged record's code ran"
    assert any("refused, never loaded" in r.getMessage() for r in caplog.records)
    # The older record, which is data, is reused with the engine (no build).
    assert result is not None and result.record is good
    assert [e.blob for e in result.engines] == [engine]
    # The refused record is left as it was: still kept, open, staged for this build.
    assert any(b is forged for b in engine_reuse._KEPT.get(store, [])), \
        "the refused record was taken (un-kept) before it was checked"
    assert not forged.closed and not forged.consumed
    left = engine_reuse._staged(store, fp)
    assert [s.blob for s in left] == [forged]
    store.close()


def test_reuse_leaves_a_refused_orphan_record_and_its_engines_in_place(tmp_path, built):
    """Orphans of a dead store (a crashed export's): the forged record alone, then the
    engine stays an orphan too; nothing adopted, nothing deleted, nothing run."""
    marker = tmp_path / "marker"
    first = BlobStore(tmp_path / "store")
    fp = built["metadata"]["fingerprint"]
    engine = first.put(built["engine"], metadata={"kind": engine_reuse.ENGINE_KIND,
                                                  "fingerprint": fp})
    forged = first.put(pickled_weight(built["record"], marker), metadata={
        "kind": engine_reuse.RECORD_KIND, "fingerprint": fp,
        "engines": built["metadata"]["engines"]})
    engine_reuse.keep(first, [engine, forged], own_store=True)  # orphans once closed
    first.close()

    store = BlobStore(tmp_path / "store")
    before = sorted((o.path.name, o.path.read_bytes()) for o in store.orphans())
    assert len(before) == 2
    assert engine_reuse.reuse(store, fp) is None
    assert not marker.exists(), "the forged record's code ran"
    after = sorted((o.path.name, o.path.read_bytes()) for o in store.orphans())
    assert after == before, "a refused record (or its engine) was adopted out of the orphans"
    store.close()
    again = BlobStore(tmp_path / "store")  # closing the store deleted nothing of them
    assert sorted((o.path.name, o.path.read_bytes()) for o in again.orphans()) == before
    again.close()


def _rewrite_in_place(path: Path) -> None:
    """The same size, other bytes, the mtime put back: only ctime says it changed."""
    import os

    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[100:102] = bytes(b ^ 0xFF for b in data[100:102])
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.mark.parametrize("tamper", [True, False])
def test_reuse_never_trusts_a_staged_orphan_engine_rewritten_with_its_mtime_put_back(
        tmp_path, built, tamper) -> None:
    """engine_reuse._trusted_digest compares the orphan's whole sealed identity (device,
    inode, size, mtime, ctime): an engine rewritten in place with os.utime back is not
    its recorded digest any more, so the record is not complete and nothing is reused
    (the engine is built again), the changed engine never shipped."""
    marker = tmp_path / "marker"
    first = BlobStore(tmp_path / "store")
    fp = built["metadata"]["fingerprint"]
    engine = first.put(built["engine"], metadata={"kind": engine_reuse.ENGINE_KIND,
                                                  "fingerprint": fp})
    record = first.put(built["record"], metadata={
        "kind": engine_reuse.RECORD_KIND, "fingerprint": fp,
        "engines": built["metadata"]["engines"]})
    engine_reuse.keep(first, [engine, record], own_store=True)
    first.close()
    store = BlobStore(tmp_path / "store")
    [orphan] = [o for o in store.orphans()
                if o.metadata.get("kind") == engine_reuse.ENGINE_KIND]
    if not tamper:  # the control: unchanged, it is reused (no build)
        assert engine_reuse.reuse(store, fp) is not None and not marker.exists()
        store.close()
        return
    _rewrite_in_place(orphan.path)
    assert engine_reuse.reuse(store, fp) is None, \
        "an engine rewritten in place (mtime put back) was reused as the one built"
    store.close()


@pytest.mark.parametrize("tamper", [True, False])
def test_reuse_never_trusts_a_kept_engine_rewritten_with_its_mtime_put_back(
        tmp_path, built, tamper) -> None:
    """The same for a blob kept in the caller's store (``Blob.identity_matches``)."""
    store = BlobStore(tmp_path / "store")
    fp = built["metadata"]["fingerprint"]
    engine = store.put(built["engine"], metadata={"kind": engine_reuse.ENGINE_KIND,
                                                  "fingerprint": fp})
    record = store.put(built["record"], metadata={
        "kind": engine_reuse.RECORD_KIND, "fingerprint": fp,
        "engines": built["metadata"]["engines"]})
    engine_reuse.keep(store, [engine, record], own_store=False)
    if not tamper:  # the control: unchanged, it is reused
        assert engine_reuse.reuse(store, fp) is not None
        store.close()
        return
    _rewrite_in_place(Path(engine.path))
    assert engine_reuse.reuse(store, fp) is None, \
        "a kept engine rewritten in place (mtime put back) was reused as the one built"
    store.close()
