"""No code from a bucket: a build record that asks for pickle is refused before torch loads it.

A bucket writer (the test, with boto3 on SeaweedFS) replaces a shared entry's
record with a ``torch.export`` archive whose weight is pickled with a
``__reduce__`` that writes a marker file, in a new attempt directory, and
points the entry's unsigned pointer (size, digest, attempt) at it: what the
second attack trial did. Machine B (another cache directory, in this
process, with the stub builder) exports the same model through
``EngineCache(remote=...)`` without trusted keys. The marker must never
exist; the export builds B's own engine (a miss, the refusal in one line),
and B's program holds B's engine. The same record refused from a local
cache and a staging store; the check's refusals one by one.

Where (for a grep): ``trtet_store.export.engine_build._served`` catches the
``UnsafeRecordError`` of a tier hit, drops the local copy (``drop_build``) and
sets ``cache.tiered.replace[key]`` so B's build replaces the forged entry
(If-Match); ``engine_reuse.reuse`` refuses a staged record the same way.
"""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from test_engine_cache_export import engines_in

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

PREFIX = "engines/"


class Payload:
    """Unpickling this writes ``marker``: the attacker's code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def archive(members: dict[str, bytes]) -> bytes:
    """A torch.export archive of ``members`` (torch's own writer, as torch.export.save)."""
    from torch.export.pt2_archive._package import PT2ArchiveWriter

    buf = io.BytesIO()
    with PT2ArchiveWriter(buf) as w:
        for name, data in members.items():
            w.write_bytes(name, data)
    return buf.getvalue()


def members_of(record: bytes) -> dict[str, bytes]:
    from torch.export.pt2_archive._package import PT2ArchiveReader

    with PT2ArchiveReader(io.BytesIO(record)) as r:
        return {n: r.read_bytes(n) for n in r.get_file_names()
                if n not in ("archive_format", "archive_version", ".data/version",
                             "byteorder", ".data/serialization_id")}


def pickled_weight(record: bytes, marker: Path) -> bytes:
    """``record`` with a weight marked use_pickle whose unpickling runs the payload."""
    import torch

    m = members_of(record)
    payload = io.BytesIO()
    torch.save(Payload(os.fspath(marker)), payload)
    m["data/weights/weight_0"] = payload.getvalue()
    m["data/weights/model_weights_config.json"] = json.dumps({"config": {"evil": {
        "path_name": "weight_0", "is_param": False, "use_pickle": True,
        "tensor_meta": None}}}).encode()
    return archive(m)


def export(cache: Any, out: Path, seed: int) -> tuple[Any, list[str]]:
    builder = FakeBuilder(engine_sizes=(MiB,), seeds=(seed,))
    module, inputs = linear_relu()
    with installed(builder):
        report = trtet_store.compile_and_save(module, inputs, out, engine_cache=cache)
    return report, [d for _, d in builder.built]


def cache_of(directory: Path, s3: Any) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(directory, max_bytes=1 << 30, min_free=0,
                                   remote=f"s3://{s3.bucket}/{PREFIX.rstrip('/')}",
                                   endpoint_url=s3.endpoint.url)


def get(s3: Any, name: str) -> bytes:
    return s3.client.get_object(Bucket=s3.bucket, Key=PREFIX + name)["Body"].read()


def forge_record(s3: Any, key: str, record: bytes, here: Path) -> dict:
    """The trial's forgery: ``record`` and the entry's own engine in a new attempt
    directory (manifest consistent), the unsigned pointer's record size, digest and
    attempt updated to match. Returns the new pointer."""
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    doc = json.loads(get(s3, f"{key}.json"))
    (here / "evil-record").write_bytes(record)
    (here / "evil-e0").write_bytes(get(s3, f"{doc['attempt']}e0"))
    attempt = f"{key}/evil-0000000000000000/"
    publish_sources([ObjectSource.of_file(here / "evil-record", "record"),
                     ObjectSource.of_file(here / "evil-e0", "e0")],
                    f"s3://{s3.bucket}/{PREFIX}{attempt}record", endpoint_url=s3.endpoint.url,
                    replace=False, config=PublishConfig(index=False,
                                                        journal_dir=here / "evil-journal"))
    doc["attempt"] = attempt
    for f in doc["files"]:
        if f["name"] == "record":
            f["size"], f["digest"] = len(record), xxhash.xxh3_128_hexdigest(record)
    s3.client.put_object(Bucket=s3.bucket, Key=f"{PREFIX}{key}.json",
                         Body=json.dumps(doc).encode())
    return doc


@pytest.fixture
def published(here_fs: Path, s3env: Any) -> dict:
    """Machine A's build of the small model, published to the bucket (unsigned)."""
    a = cache_of(here_fs / "a", s3env)
    report, built = export(a, here_fs / "a.pte", seed=1)
    [event] = report.engine_cache
    assert (event.outcome, event.published) == ("miss", True)
    key = event.key.rsplit(".e", 1)[0]
    doc = json.loads(get(s3env, f"{key}.json"))
    return {"key": key, "record": get(s3env, f"{doc['attempt']}record"), "a": built,
            "s3": s3env, "here": here_fs}


def test_a_pickled_record_in_the_bucket_is_a_miss_and_never_runs(published, caplog):
    s3, here, key = published["s3"], published["here"], published["key"]
    marker = here / "marker"
    forged = pickled_weight(published["record"], marker)
    doc = forge_record(s3, key, forged, here)
    b = cache_of(here / "b", s3)
    with caplog.at_level(logging.WARNING):
        report, built = export(b, here / "b.pte", seed=2)
    assert not marker.exists(), "the bucket writer's code ran"
    [event] = report.engine_cache
    # A miss: B's own engine, in B's program; the refusal said in one line.
    assert event.outcome == "miss" and len(built) == 1, event
    assert engines_in(here / "b.pte") == built and built != published["a"]
    assert "is refused, never loaded: its weights entry 'evil' asks to be unpickled " \
           "(use_pickle)" in (event.remote_reason or ""), event
    said = [r.getMessage() for r in caplog.records if "refused, never loaded" in r.getMessage()]
    assert said and all("\n" not in s for s in said), said
    # The forged entry is replaced by B's build (If-Match it), and B's next export hits.
    after = json.loads(get(s3, f"{key}.json"))
    assert event.published is True and after["attempt"] != doc["attempt"], after
    again, rebuilt = export(b, here / "b2.pte", seed=3)
    assert [e.outcome for e in again.engine_cache] == ["hit"] and rebuilt == []
    assert not marker.exists()


def test_a_pickled_record_in_the_local_cache_or_a_store_is_never_loaded(published):
    """The same record entered in a local cache under the build's key (sealed, with the
    record's metadata, as a pull enters one), and kept in a staging store: refused,
    rebuilt or not reused, the marker never written."""
    from trtet_store.export import engine_reuse
    from trtet_store.io import BlobStore

    here, key = published["here"], published["key"]
    marker = here / "marker-local"
    forged = here / "forged.pt2"
    forged.write_bytes(pickled_weight(published["record"], marker))
    a = trtet_store.EngineCache(here / "a", max_bytes=1 << 30, min_free=0)
    with a.blobs.get(key) as hit:
        metadata = dict(hit.metadata)
    with a.blobs.get(f"{key}.e0") as hit:
        engine = Path(hit.path).read_bytes()
    a.blobs.drop(key, "the test's forgery")
    assert a.blobs.put(key, forged, metadata).stored
    report, built = export(a, here / "local.pte", seed=4)
    assert not marker.exists(), "the planted record's code ran"
    [event] = report.engine_cache
    assert event.outcome == "miss" and engines_in(here / "local.pte") == built
    assert "refused, never loaded: its weights entry 'evil' asks to be unpickled" in \
        (event.reason or ""), event
    again, rebuilt = export(a, here / "local2.pte", seed=5)  # the rebuild replaced it
    assert [e.outcome for e in again.engine_cache] == ["hit"] and rebuilt == []
    assert engines_in(here / "local2.pte") == built and not marker.exists()

    # A staging store: the forged record with its engine, kept for the next export.
    store = BlobStore(here / "store")
    fingerprint = metadata["fingerprint"]
    kept = [store.put(engine, metadata={"kind": engine_reuse.ENGINE_KIND,
                                        "fingerprint": fingerprint}),
            store.put(forged.read_bytes(), metadata={
                "kind": engine_reuse.RECORD_KIND, "fingerprint": fingerprint,
                "engines": metadata["engines"]})]
    engine_reuse.keep(store, kept, own_store=False)
    assert engine_reuse.reuse(store, fingerprint) is None
    assert not marker.exists(), "the staged record's code ran"
    assert all(not b.closed for b in kept)  # left as they were
    store.close()


def test_each_way_of_asking_for_code_is_refused(published):
    """The check's refusals, each a one-line reason, on A's own record made hostile."""
    import torch

    from trtet_store.export.record_check import record_problem

    record = published["record"]
    assert record_problem(record) is None  # our own record is data
    base = members_of(record)
    model = json.loads(base["models/model.json"])

    def with_program(edit: Any) -> bytes:
        doc = json.loads(json.dumps(model))
        edit(doc)
        return archive({**base, "models/model.json": json.dumps(doc).encode()})

    def node(doc: dict) -> dict:
        return doc["graph_module"]["graph"]["nodes"][0]

    def evil_inputs() -> bytes:
        buf = io.BytesIO()
        torch.save(Payload("/nonexistent/x"), buf)
        return buf.getvalue()

    cases = {
        "custom_obj": archive({**base, "data/constants/custom_obj_0": b"x",
                               "data/constants/model_constants_config.json": json.dumps(
                                   {"config": {"c": {"path_name": "custom_obj_0",
                                                     "use_pickle": True}}}).encode()}),
        "opaque_obj": archive({**base, "data/constants/opaque_obj_0": b"x"}),
        "legacy": archive({**base, "data/weights/model.pt": b"x"}),
        "aoti": archive({**base, "data/aotinductor/model/x.so": b"x"}),
        "sample inputs": archive({**base, "data/sample_inputs/model.pt": evil_inputs()}),
        "target": with_program(lambda d: node(d).update(target="torch.ops.load_library")),
        "ops attribute": with_program(lambda d: node(d).update(
            target="torch.ops.loaded_libraries.add")),
        "builtin": with_program(lambda d: node(d).update(target="builtins.exec")),
        "expr": with_program(lambda d: d["graph_module"]["graph"]["sym_int_values"].update(
            {"s0": {"as_expr": {"expr_str": "eval(chr(49))", "hint": None}}})),
        "guards": with_program(lambda d: d.update(guards_code=["import os"])),
        "comment": with_program(lambda d: node(d)["metadata"].update(
            stack_trace="x\rimport os")),
        "name": with_program(lambda d: node(d).update(name='x"); import os; ("')),
        "not a zip": b"PK\x03\x04 not really",
    }
    said = {what: record_problem(data) for what, data in cases.items()}
    assert all(said.values()), {k: v for k, v in said.items() if not v}
    assert all("\n" not in s for s in said.values())
    assert "unpickled" in said["custom_obj"] or "custom_obj_0" in said["custom_obj"]
    assert "weights_only" in said["sample inputs"]
    assert "eval" in said["expr"] and "guard code" in said["guards"]


def test_programs_with_weights_constants_and_dynamic_shapes_are_data():
    """What torch.export.save writes for ordinary programs passes the check (no refusal
    of a record this package could have made): parameters (one not contiguous), a
    buffer, a tensor constant, a dynamic dimension (its symbols in srepr form)."""
    import torch

    from trtet_store.export.record_check import record_problem

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.w = torch.nn.Parameter(torch.randn(4, 8).t())
            self.register_buffer("b", torch.ones(4))
            self.c = torch.randn(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x) + self.b + self.c
            return torch.cat([y, y]) * x.shape[0] + (y @ self.w.t()).sum() * (x.shape[0] // 3)

    ep = torch.export.export(M(), (torch.randn(6, 4),),
                             dynamic_shapes=({0: torch.export.Dim("n", min=2, max=64)},))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    assert "expr_str" in members_of(buf.getvalue())["models/model.json"].decode()
    assert record_problem(buf.getvalue()) is None
