"""New weights across machines: structure entries through the shared tier (issue 46 item 5).

Each "machine" is a cache directory used by its own process (a warm
child, tests/warm.py, running CHILD) against the real SeaweedFS fixture, as in
``test_engine_cache_shared``. The child exports the small model with
refittable settings (``immutable_weights=False``), its weights multiplied by
``scale`` (a fine-tune when not 1), through the stub builder (counted in a
shared file) and :class:`FakeRefitter` (refits counted likewise).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import warm
from test_engine_cache_shared import Machines, engines_in, key_of

from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeRefitter, linear_relu

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, logging, os, sys, time
cfg = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(levelname)s %(name)s: %(message)s")
import torch
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed, linear_relu

def note(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")

class Counting(FakeBuilder):
    def __call__(self, *args, **kwargs):
        note(cfg["builds"])
        return super().__call__(*args, **kwargs)

builder = Counting(engine_sizes=tuple(cfg["sizes"]),
                   seeds=tuple(os.getpid() * 10 + i for i in range(len(cfg["sizes"]))))
refitter = FakeRefitter(hook=lambda w: note(cfg["refits"]))
cache = trtet_store.EngineCache(cfg["cache"], max_bytes=1 << 30, min_free=0,
                                remote=cfg["url"], endpoint_url=cfg["endpoint"],
                                **({"wait_timeout": cfg["wait"]} if "wait" in cfg else {}))
module, inputs = linear_relu()
with torch.no_grad():
    module[0].weight.mul_(cfg.get("scale", 1.0))
with installed(builder, refitter=refitter):
    report = trtet_store.compile_and_save(module, inputs, cfg["out"], engine_cache=cache,
                                          immutable_weights=False)
print(json.dumps({"pid": os.getpid(), "built": [d for _, d in builder.built],
                  "events": [e.to_json() for e in report.engine_cache],
                  "origin": cache.origin()}))
'''


class RefitMachines(Machines):
    """:class:`Machines` whose child exports with refittable settings and counts refits."""

    def config(self, name: str, run: str = "", **kw: Any) -> dict:
        return super().config(name, run, refits=os.fspath(self.base / "refits"), **kw)

    def start(self, cfg: dict, env: dict | None = None) -> warm.WarmChild:
        return warm.popen(CHILD, [json.dumps(cfg)], cwd=ROOT, env=env)

    def refits(self) -> list[str]:
        path = self.base / "refits"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def machines(here_fs: Path, s3env: Any) -> RefitMachines:
    return RefitMachines(here_fs, s3env)


def _program(scale: float) -> Any:
    module, inputs = linear_relu()
    with torch.no_grad():
        module[0].weight.mul_(scale)
    return torch.export.export(module, inputs)


def _structure_key(machines: RefitMachines) -> str:
    skeys = [k.removesuffix(".json") for k in machines.objects()
             if k.startswith("trt-s-") and k.endswith(".json") and "/" not in k]
    assert len(skeys) == 1, sorted(machines.objects())
    return skeys[0]


def _expected(structure_engine_of: Path, scale: float) -> list[str]:
    import xxhash
    from test_engine_refit_cache import engine_bytes

    [engine] = engine_bytes(structure_engine_of)
    return [xxhash.xxh3_128_hexdigest(FakeRefitter.expected(engine, _program(scale)))]


def test_a_teammates_fine_tune_downloads_the_structure_entry_once_and_refits(machines):
    from trtet_store.testing.proxy import CountingProxy

    size = 8 * MiB
    a, _ = machines.run("a", sizes=(size,))
    assert len(a["built"]) == 1 and a["events"][0]["published"] is True, a["events"]
    # The tier holds A's full entry and its structure entry (a build's files).
    skey = _structure_key(machines)
    pointer, _ = machines.pointer(skey)
    assert [f["name"] for f in pointer["files"]] == ["record", "e0"]
    assert pointer["metadata"]["record"]["kind"] == "trtet_store.tensorrt.structure"
    structure_bytes = sum(f["size"] for f in pointer["files"])

    with CountingProxy.for_url(machines.s3.endpoint.url) as proxy:
        b, err = machines.run("b", sizes=(size,), scale=-1.0, endpoint=proxy.endpoint_url)
        down = proxy.downstream
    [event] = b["events"]
    assert b["built"] == [] and len(machines.built()) == 1, err[-3000:]
    assert len(machines.refits()) == 1
    assert (event["outcome"], event["stored"], event["published"]) == ("refit", True, True), \
        event
    # The structure entry once: its engine and record, plus headers, pointers, manifest.
    assert event["downloaded"] == structure_bytes
    assert structure_bytes <= down < structure_bytes + 512 * 1024, down
    assert engines_in(machines.pte("b")) == _expected(machines.pte("a"), -1.0)
    # B's refit is in the tier under its full key (published under its lease), and B
    # kept the structure entry: its next fine-tune refits with nothing downloaded.
    assert f"{key_of(b)}.json" in machines.objects()
    b2, err = machines.run("b", "2", sizes=(size,), scale=2.0)
    assert [e["outcome"] for e in b2["events"]] == ["refit"], err[-3000:]
    assert b2["events"][0]["downloaded"] is None and len(machines.refits()) == 2
    # A third machine exporting B's fine-tune downloads B's refit: no build, no refit.
    c, _ = machines.run("c", sizes=(size,), scale=-1.0)
    assert [e["outcome"] for e in c["events"]] == ["remote-hit"]
    assert engines_in(machines.pte("c")) == engines_in(machines.pte("b"))
    assert len(machines.built()) == 1 and len(machines.refits()) == 2


def test_a_tampered_shared_structure_entry_is_never_refit_from_and_is_replaced(machines):
    size = 4 * MiB
    a, _ = machines.run("a", sizes=(size,))
    skey = _structure_key(machines)
    before, etag = machines.pointer(skey)
    engine_object = f"{before['attempt']}e0"
    machines.put(engine_object, os.urandom(len(machines.get(engine_object))))

    b, err = machines.run("b", sizes=(size,), scale=-1.0)
    [event] = b["events"]
    assert len(b["built"]) == 1 and machines.refits() == [], err[-3000:]
    assert (event["outcome"], event["stored"], event["published"]) == ("miss", True, True)
    assert event["reason"].startswith(f"the shared structure entry {skey} was not used "
                                      "(damaged: "), event["reason"]
    assert event["reason"].endswith("; built instead")
    assert engines_in(machines.pte("b")) == b["built"]
    # B's build replaced the damaged structure entry (If-Match it only).
    after, new_etag = machines.pointer(skey)
    assert new_etag != etag and after["origin"] == b["origin"]
    # A third machine's fine-tune refits from B's structure entry.
    c, err = machines.run("c", sizes=(size,), scale=3.0)
    assert [e["outcome"] for e in c["events"]] == ["refit"], err[-3000:]
    assert engines_in(machines.pte("c")) == _expected(machines.pte("b"), 3.0)


def test_a_refit_from_a_local_structure_entry_takes_the_full_keys_lease(machines):
    from test_engine_refit_cache import _full_key

    size = 2 * MiB
    machines.run("a", sizes=(size,))
    machines.run("b", sizes=(size,), scale=-1.0)  # B now keeps the structure entry
    module, inputs = linear_relu()
    with torch.no_grad():
        module[0].weight.mul_(5.0)
    key = _full_key(module, inputs, {"immutable_weights": False})
    from trtet_store.cache.tier import Lease

    lease = machines.tier().claim(key)  # another machine refitting this fine-tune
    assert isinstance(lease, Lease)
    try:
        b2, err = machines.run("b", "2", sizes=(size,), scale=5.0, wait=1.0)
    finally:
        lease.release()
    # B waited on the lease (its refit is under the tier's single flight), then went on.
    assert f"building {key} here (the first machine to publish it wins)" in err, err[-3000:]
    assert [e["outcome"] for e in b2["events"]] == ["refit"]
    assert b2["events"][0]["published"] is True
    # A (its own structure entry) exporting B's first fine-tune, which the tier holds:
    # the lease answers with the entry; A refits from its local structure entry (before
    # the tier's full entry is asked) and does not publish.
    a2, err = machines.run("a", "2", sizes=(size,), scale=-1.0)
    [event] = a2["events"]
    assert (event["outcome"], event["published"]) == ("refit", False), err[-3000:]
    assert event["publish_reason"] == "the shared cache holds an entry of this build already"
    assert event["downloaded"] is None and len(machines.built()) == 1
    assert not (machines.base / "a" / "remote-pending" / key_of(a2)).exists()


def test_push_and_pull_carry_structure_entries(machines):
    import trtet_store
    from trtet_store.export import engine_refit
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    def cache(name: str, **kw: Any) -> trtet_store.EngineCache:
        return trtet_store.EngineCache(machines.base / name, max_bytes=1 << 30, min_free=0,
                                       **kw)

    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(MiB,))):  # built with no tier: nothing published
        trtet_store.compile_and_save(module, inputs, machines.base / "a.pte",
                                     engine_cache=cache("a"), immutable_weights=False)
    [skey] = [e.key for e in cache("a").entries()
              if e.metadata.get("kind") == engine_refit.STRUCTURE_KIND]
    remote = {"remote": machines.url, "endpoint_url": machines.s3.endpoint.url}
    pushed = cache("a", **remote).push()
    assert sorted(p.key for p in pushed if p.published) == sorted([skey, key_of_cache(cache("a"))])
    b = cache("b", **remote)
    assert b.pull([skey]) == [(skey, sum(f["size"] for f in machines.pointer(skey)[0]["files"]))]
    with b.lookup(skey) as got:
        assert got.record.metadata["kind"] == engine_refit.STRUCTURE_KIND


def key_of_cache(cache: Any) -> str:
    from trtet_store.export.engine_key import RECORD_KIND

    [key] = [e.key for e in cache.entries() if e.metadata.get("kind") == RECORD_KIND]
    return key
