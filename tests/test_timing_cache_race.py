"""Two machines racing a timing cache's publish both end up in the shared entry.

Two real processes (warm children, tests/warm.py: they import torch), each an
EngineCache with its own local directory, each building a different model with the
stub builder on one timing key, against one SeaweedFS bucket. They start together
(a barrier), and a second barrier holds each one's first write of the timing entry's
pointer until both are there: both read the tier empty and both send a conditional
write in the same window, so exactly one loses and must read again, merge and retry.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import warm

from trtet_store.export import timing_cache
from trtet_store.testing.stub_tensorrt import parse_timing_cache, timing_tactics

ROOT = Path(__file__).resolve().parents[1]
SM89 = {"gpu": "NVIDIA L4", "compute_capability": "sm_89",
        "tensorrt": ["tensorrt-cu12 10.14.1.48"], "cuda": "12.8", "driver": "570.124.06"}

CHILD = r'''
import json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
import trtet_store
from trtet_store.cache.tier import store as tier_store
from trtet_store.export import timing_cache
from trtet_store.remote.s3 import PreconditionFailed
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

timing_cache.gpu_facts = lambda: cfg["facts"]
real_put = tier_store.put
writes = []

def arrived(prefix):
    return [n for n in os.listdir(cfg["dir"]) if n.startswith(prefix)]

def put(s3, bucket, key, body, **kw):
    timing = os.path.basename(key).startswith("trt-t-") and key.endswith(".json")
    if timing and not writes:  # the first pointer write of the timing entry: both here
        open(os.path.join(cfg["dir"], f"at-put-{os.getpid()}"), "w").close()
        deadline = time.monotonic() + 60
        while len(arrived("at-put-")) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
    try:
        etag = real_put(s3, bucket, key, body, **kw)
    except PreconditionFailed:
        if timing:
            writes.append("lost")
        raise
    if timing:
        writes.append("won")
    return etag

tier_store.put = put
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(16, cfg["width"]), torch.nn.ReLU()).eval()
inputs = (torch.randn(2, 16),)
builder = FakeBuilder(keep_timing=True, engine_sizes=(1 << 20,))
cache = trtet_store.EngineCache(cfg["cache"], max_bytes=1 << 30, min_free=0,
                                remote=cfg["remote"], endpoint_url=cfg["endpoint"])
open(os.path.join(cfg["dir"], f"ready-{os.getpid()}"), "w").close()
while len(arrived("ready-")) < 2:
    time.sleep(0.002)
with installed(builder):
    report = trtet_store.compile_and_save(module, inputs, cfg["out"], engine_cache=cache,
                                          store=cfg["store"])
print(json.dumps({"writes": writes, "line": report.engine_cache[0].timing_cache}))
'''


def _tier_entry(s3, key: str) -> tuple[dict, bytes]:
    doc = json.loads(s3.client.get_object(Bucket=s3.bucket,
                                          Key=f"tier/{key}.json")["Body"].read())
    data = s3.client.get_object(Bucket=s3.bucket, Key=f"tier/{doc['attempt']}timing")
    return doc, data["Body"].read()


def test_two_machines_racing_a_publish_both_end_up_in_the_entry(here_fs, s3env):
    procs = []
    for name, width in (("A", 16), ("B", 32)):
        cfg = {"cache": os.fspath(here_fs / name), "facts": SM89, "width": width,
               "dir": os.fspath(here_fs), "remote": f"s3://{s3env.bucket}/tier",
               "endpoint": s3env.endpoint.url, "out": os.fspath(here_fs / f"{name}.pte"),
               "store": os.fspath(here_fs / f"store-{name}")}
        procs.append(warm.popen(CHILD, [json.dumps(cfg)], cwd=ROOT))
    results = []
    deadline = time.monotonic() + 120
    for p in procs:
        out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    wanted = set()
    torch.manual_seed(0)
    for width in (16, 32):
        module = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU()).eval()
        wanted |= set(timing_tactics(torch.export.export(module, (torch.randn(2, 16),))))
    key = timing_cache.timing_key({**SM89, "flags": {}})
    doc, data = _tier_entry(s3env, key)
    header, tactics = parse_timing_cache(data)
    assert header == key
    assert set(tactics) == wanted  # both machines' tactics: no lost update
    assert doc["metadata"]["entries"] == len(wanted)
    # Both wrote the pointer in the same window: one won, the other lost, read the
    # winner's entry, merged and won its retry (If-Match the winner's ETag).
    assert sorted(r["writes"] for r in results) == [["lost", "won"], ["won"]], results
    for r in results:  # both started before either published; neither gave up
        assert r["line"] == "timing cache: cold", r["line"]
