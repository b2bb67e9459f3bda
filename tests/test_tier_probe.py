"""The tier's probe of conditional writes (issue 45, item 25), on the SeaweedFS fixture.

A server that ignores ``If-None-Match``/``If-Match`` is SeaweedFS behind
tests/conditions_proxy.py, which drops those headers from every write and
signs the request again: the server really never sees them. An honest
server is SeaweedFS behind the same proxy with nothing dropped, so the
probe's requests can be counted (each test's bucket is fresh, so each
``(endpoint, bucket)`` is probed for the first time).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import warm
from conditions_proxy import ConditionsProxy

ROOT = Path(__file__).resolve().parents[1]
PROBE = "/.trtet-probe/"
BOTH = ("if-none-match", "if-match")


def proxy(s3: Any, ignore: tuple[str, ...] = (), refuse: bool = False) -> ConditionsProxy:
    e = s3.endpoint
    return ConditionsProxy(e.url, access_key=e.access_key, secret_key=e.secret_key,
                           region=e.region, ignore=ignore, refuse=refuse)


def bucket_state(s3: Any) -> tuple[dict[str, str], list[str]]:
    """Every object of the bucket (key -> ETag) and every open multipart upload, read directly."""
    objects: dict[str, str] = {}
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket):
        objects.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    return objects, sorted(u["Key"] for u in uploads)


def files(tmp_path: Path, name: str, size: int = 300_000) -> list[tuple[str, Path]]:
    out = []
    for f in ("record", "e0"):
        p = tmp_path / f"{name}-{f}"
        p.write_bytes(os.urandom(size))
        out.append((f, p))
    return out


def tier(url: str, endpoint: str, tmp_path: Path) -> Any:
    from trtet_store.cache.tier import RemoteTier

    return RemoteTier(url, endpoint_url=endpoint, journal_dir=tmp_path / "journal",
                      lease_ttl=30)


def test_an_honest_server_is_probed_once_per_endpoint_and_bucket(tmp_path, s3env):
    with proxy(s3env) as px:
        a = tier(f"s3://{s3env.bucket}/team", px.url, tmp_path)
        for key in ("k1", "k2", "k3"):
            assert a.publish(key, files(tmp_path, key), {"key": key}).published
        # Another tier (another prefix) on the same endpoint and bucket: no second probe.
        b = tier(f"s3://{s3env.bucket}/other", px.url, tmp_path)
        assert b.publish("k4", files(tmp_path, "k4"), {}).published
        lease = b.claim("k5")
        lease.release()
        probed = px.seen(PROBE)
        everything = px.seen()
    # One probe: create, create again (412), If-Match on a missing key (412), If-Match with
    # another ETag (412), and the delete of the one object it created.
    assert [s.method for s in probed] == ["PUT", "PUT", "PUT", "PUT", "DELETE"], probed
    assert len({s.target.split(PROBE)[1].split("/")[0] for s in probed}) == 1, probed
    assert probed[0].target.startswith(f"/{s3env.bucket}/team{PROBE}"), probed
    # ... before the tier's first write of an entry (after its first read: the bucket is
    # there; SeaweedFS would create a missing bucket on a PutObject).
    first_entry = next(i for i, s in enumerate(everything)
                       if "/team/k1" in s.target and s.method in ("PUT", "POST"))
    assert everything.index(probed[-1]) < first_entry
    objects, uploads = bucket_state(s3env)
    assert not [k for k in objects if ".trtet-probe" in k], objects  # never left behind
    assert uploads == []
    assert {k for k in objects if k.endswith(".json") and "/" not in k.split("/", 1)[1]} == \
        {"team/k1.json", "team/k2.json", "team/k3.json", "other/k4.json"}


@pytest.mark.parametrize("ignore,broken", [
    (BOTH, "a second create-only PutObject (If-None-Match: *) of s3://{bucket}/team"
           "/.trtet-probe/{probe}/created succeeded, not refused with 412"),
    (("if-none-match",), "a second create-only PutObject (If-None-Match: *) of s3://{bucket}"
                         "/team/.trtet-probe/{probe}/created succeeded, not refused with 412"),
    (("if-match",), "a PutObject If-Match: {etag} of the missing key s3://{bucket}/team"
                    "/.trtet-probe/{probe}/missing succeeded, not refused"),
], ids=["ignores-both", "creates-twice", "if-match-creates"])
def test_a_server_ignoring_conditions_gets_nothing_written_and_still_serves_reads(
        tmp_path, s3env, ignore, broken):
    from trtet_store.cache.tier import ConditionalWritesUnsupportedError
    from trtet_store.remote import RemoteError

    url = f"s3://{s3env.bucket}/team"
    seeded = files(tmp_path, "seeded")
    assert tier(url, s3env.endpoint.url, tmp_path).publish("seeded", seeded, {"n": 1}).published
    before = bucket_state(s3env)
    with proxy(s3env, ignore) as px:
        t = tier(url, px.url, tmp_path)
        with pytest.raises(ConditionalWritesUnsupportedError) as refused:
            t.publish("new", files(tmp_path, "new"), {"n": 2})
        said = str(refused.value)
        probed = px.seen(PROBE)
        # The proxy did drop the headers: the server never saw the probe's conditions.
        assert any(s.stripped for s in probed), probed
        name = probed[0].target.split(PROBE)[1].split("/")[0]
        etag = next((v for s in probed for k, v in s.stripped if k == "if-match"), None)
        want = (f"{px.url} (bucket {s3env.bucket}) does not honour conditional writes: "
                + broken.format(bucket=s3env.bucket, probe=name, etag=etag)
                + f"; nothing is published to {url} and no build lease is claimed there "
                "(reads still work): use a server that honours If-None-Match and If-Match on "
                "PutObject")
        assert said == want, said
        assert "\n" not in said
        assert isinstance(refused.value, RemoteError)  # callers' "the tier failed"
        # Remembered: a lease claim and a second publish are refused without a new probe.
        with pytest.raises(ConditionalWritesUnsupportedError, match="does not honour"):
            t.claim("new")
        with pytest.raises(ConditionalWritesUnsupportedError, match="does not honour"):
            t.publish("new", files(tmp_path, "new"), {"n": 2})
        assert px.seen(PROBE) == probed
        # Nothing of the entry (nor its lease) was written: no write reached /team/new.
        writes = [s for s in px.seen("/team/new") if s.method in ("PUT", "POST", "DELETE")]
        assert writes == [], writes
        # Reads still work through the same server: the seeded entry, byte for byte.
        entry = t.lookup("seeded")
        assert entry is not None and entry.metadata == {"n": 1}
        got = t.download(entry, tmp_path / "down")
        for name_, path in seeded:
            assert got.paths[name_].read_bytes() == path.read_bytes()
    assert bucket_state(s3env) == before  # byte-identical listing: keys and ETags



# Two models (two keys) exported by one cache; no logging configured, as a user's script.
CHILD = r'''
import json, os, sys
cfg = json.loads(sys.argv[1])
import torch
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

cache = trtet_store.EngineCache(cfg["cache"], min_free=0, remote=cfg["url"],
                                endpoint_url=cfg["endpoint"])
torch.manual_seed(0)
wide = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
runs = []
for i, (module, inputs) in enumerate([linear_relu(), (wide, (torch.randn(2, 16),))]):
    builder = FakeBuilder(engine_sizes=(1 << 20,), seeds=(os.getpid() * 10 + i,))
    with installed(builder):
        report = trtet_store.compile_and_save(module, inputs, f"{cfg['out']}.{i}.pte",
                                              engine_cache=cache)
    runs.append({"built": len(builder.built),
                 "events": [e.to_json() for e in report.engine_cache]})
print(json.dumps(runs))
'''


def export_two(tmp_path: Path, url: str, endpoint: str, out: str) -> tuple[list[dict], str]:
    cfg = {"cache": os.fspath(tmp_path / "cache"), "url": url, "endpoint": endpoint,
           "out": os.fspath(tmp_path / out)}
    proc = warm.run(CHILD, [json.dumps(cfg)], cwd=ROOT, timeout=600)  # tests/warm.py
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_server_that_answers_not_implemented_is_a_verdict_remembered_once(tmp_path, s3env):
    """501 NotImplemented for a conditional write (said, not ignored) is the same on every
    try: the probe's verdict, remembered; not a transient failure probed again each call."""
    from trtet_store.cache.tier import ConditionalWritesUnsupportedError

    url = f"s3://{s3env.bucket}/team"
    before = bucket_state(s3env)
    with proxy(s3env, refuse=True) as px:
        t = tier(url, px.url, tmp_path)
        for _ in range(2):
            with pytest.raises(ConditionalWritesUnsupportedError, match="NotImplemented"):
                t.publish("new", files(tmp_path, "new"), {"n": 2})
        assert [s.method for s in px.seen(PROBE)] == ["PUT"]  # one probe, one request
    assert bucket_state(s3env) == before


def test_the_engine_cache_builds_locally_warns_once_and_loses_nothing(here_fs, s3env):
    url = f"s3://{s3env.bucket}/engines"
    before = bucket_state(s3env)
    with proxy(s3env, BOTH) as px:
        runs, err = export_two(here_fs, url, px.url, "refused")
    assert [r["built"] for r in runs] == [1, 1], err[-3000:]
    for run in runs:
        [event] = run["events"]
        assert (event["outcome"], event["stored"], event["published"]) == \
            ("miss", True, False), event
        assert "(claim: ConditionalWritesUnsupportedError: " in event["publish_reason"], event
        assert "does not honour conditional writes" in event["publish_reason"], event
    # Said once (both keys), as the user sees it: one line, never "works again".
    lines = [line for line in err.splitlines() if "SharedCacheWarning" in line]
    assert len(lines) == 1, err[-3000:]
    assert "was not usable (claim: ConditionalWritesUnsupportedError: " in lines[0], lines
    assert lines[0].endswith("; going on with the local cache only"), lines
    assert bucket_state(s3env) == before  # no entry, no lease, no probe object
    # Nothing lost: both builds are cached and kept for publishing; an honest server
    # (the same bucket, directly) gets them from the next export's local hits.
    pending = sorted(p.name for p in (here_fs / "cache" / "remote-pending").iterdir())
    assert len(pending) == 2, pending
    again, err = export_two(here_fs, url, s3env.endpoint.url, "again")
    assert [r["built"] for r in again] == [0, 0], err[-3000:]
    assert [(e["outcome"], e["published"]) for r in again for e in r["events"]] == \
        [("hit", True), ("hit", True)], again
    objects, _ = bucket_state(s3env)
    assert sorted(k for k in objects if k.count("/") == 1 and k.endswith(".json")) == \
        [f"engines/{k}.json" for k in pending]


def test_the_cli_push_is_refused_with_one_line(here_fs, s3env):
    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    cache = trtet_store.EngineCache(here_fs / "cache", min_free=0)
    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(1 << 20,))):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", engine_cache=cache)
    local = sorted((e.key, e.size, e.digest) for e in cache.entries())
    url = f"s3://{s3env.bucket}/team"
    before = bucket_state(s3env)
    with proxy(s3env, BOTH) as px:
        done = warm.cli("cache", "push", "--remote", url, "--endpoint-url", px.url,
                        "--dir", here_fs / "cache", timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("trtet-store")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(
        f"trtet-store cache: ConditionalWritesUnsupportedError: {px.url} (bucket "
        f"{s3env.bucket}) does not honour conditional writes: a second create-only PutObject "
        "(If-None-Match: *) of "), lines
    assert lines[0].endswith("use a server that honours If-None-Match and If-Match on "
                             "PutObject"), lines
    assert bucket_state(s3env) == before
    assert sorted((e.key, e.size, e.digest) for e in cache.entries()) == local
