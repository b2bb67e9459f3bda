"""Timing caches through the shared tier (SeaweedFS): fetched, verified, merged with If-Match.

Machines are cache directories in this process (the stub builder, real
filesystems, a real S3 server); a bucket writer is boto3 on the bucket
directly. "Machine B's first build of a model A built" is the same layers with
new weights (non-refittable settings: a full build, whose engine the tier
cannot serve).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from keyed import with_keys
from timing_machine import SM89, machine  # noqa: F401 - the autouse fixture

import trtet_store
from trtet_store.cache import mergeable_tier
from trtet_store.export import timing_cache
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    linear_relu,
    parse_timing_cache,
    timing_tactics,
    write_timing_cache,
)

MiB = 1 << 20


def _cache(here: Path, name: str, s3: Any, **kw: Any) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / name, max_bytes=1 << 30, min_free=0,
                                   remote=f"s3://{s3.bucket}/tier",
                                   endpoint_url=s3.endpoint.url, **kw)


def _export(here: Path, name: str, cache, module, inputs, builder):
    with installed(builder):
        return trtet_store.compile_and_save(module, inputs, here / f"{name}.pte",
                                            engine_cache=cache, store=here / f"store-{name}")


def _key() -> str:
    return timing_cache.timing_key(timing_cache.timing_facts({}))


def _tier_entry(s3: Any) -> tuple[dict, bytes]:
    """The tier's timing entry, read by a bucket client: its pointer and its file's bytes."""
    key = _key()
    got = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"tier/{key}")
    names = [o["Key"] for o in got.get("Contents", [])]
    pointer = next(n for n in names if n.endswith(".json") and "/" not in n[len("tier/"):])
    doc = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=pointer)["Body"].read())
    data = s3.client.get_object(Bucket=s3.bucket,
                                Key=f"tier/{doc['attempt']}timing")["Body"].read()
    return doc, data


def test_machine_b_first_build_starts_warm_from_the_tier(here_fs, s3env):
    module, inputs = linear_relu()
    a = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "a", _cache(here_fs, "A", s3env), module, inputs,
                      a).engine_cache
    assert event.timing_cache == "timing cache: cold" and event.published
    doc, data = _tier_entry(s3env)
    wanted = set(timing_tactics(torch.export.export(module, inputs)))
    assert set(parse_timing_cache(data)[1]) == wanted
    assert doc["metadata"]["kind"] == timing_cache.TIMING_KIND

    with torch.no_grad():
        module[0].weight.mul_(-1)  # B's model: A's layers, new weights: B must build
    b = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "b", _cache(here_fs, "B", s3env), module, inputs,
                      b).engine_cache
    assert event.outcome == "miss"
    assert event.timing_cache.startswith(f"timing cache: warm, {len(wanted):,} entries")
    assert f"{len(data):,} bytes from the shared cache" in event.timing_cache
    assert b.timed == [0] and b.mismatched == []


def test_two_machines_racing_a_publish_both_end_up_in_the_entry(here_fs, s3env):
    key = _key()
    facts = timing_cache.timing_facts({})
    tier = _cache(here_fs, "A", s3env).remote
    mine = {"A": write_timing_cache(key, {"a" * 16: "0000000a"}),
            "B": write_timing_cache(key, {"b" * 16: "0000000b"})}

    def meta(out: bytes) -> dict:
        return {"kind": timing_cache.TIMING_KIND, "timing": facts,
                "entries": FakeBuilder.count_entries(out)}

    def check(m: dict) -> str | None:
        return timing_cache.entry_problem(m, facts)

    raced = []

    def combine_a(theirs: bytes, ours: bytes) -> bytes:
        return FakeBuilder.combine(theirs, ours)

    def publish(name: str, combine) -> Any:
        return mergeable_tier.publish_merged(tier, key, mine[name], combine, check, meta,
                                             here_fs / f"scratch-{name}", limit=MiB)

    # A reads the (empty) tier; before its conditional write lands, B publishes.
    def a_first_read(theirs: bytes, ours: bytes) -> bytes:
        return FakeBuilder.combine(theirs, ours)

    original = mergeable_tier.fetch

    def fetch_then_b_wins(*args: Any, **kw: Any) -> Any:
        got = original(*args, **kw)
        if not raced:
            raced.append(True)
            mergeable_tier.fetch = original
            pub_b, why_b, _ = publish("B", combine_a)
            assert pub_b.published, why_b
            mergeable_tier.fetch = fetch_then_b_wins
        return got

    mergeable_tier.fetch = fetch_then_b_wins
    try:
        pub_a, why_a, _ = publish("A", a_first_read)
    finally:
        mergeable_tier.fetch = original
    assert raced and pub_a is not None and pub_a.published, why_a
    _, data = _tier_entry(s3env)
    assert parse_timing_cache(data)[1] == {"a" * 16: "0000000a", "b" * 16: "0000000b"}


def test_a_damaged_shared_entry_is_refused_and_the_build_runs_cold(here_fs, s3env):
    module, inputs = linear_relu()
    _export(here_fs, "a", _cache(here_fs, "A", s3env), module, inputs,
            FakeBuilder(keep_timing=True, engine_sizes=(MiB,)))
    doc, data = _tier_entry(s3env)
    bad = bytearray(data)
    bad[-3] ^= 1
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"tier/{doc['attempt']}timing",
                            Body=bytes(bad))  # a bucket writer
    with torch.no_grad():
        module[0].weight.mul_(-1)
    b = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    [event] = _export(here_fs, "b", _cache(here_fs, "B", s3env), module, inputs,
                      b).engine_cache
    assert event.timing_cache.startswith("timing cache: cold"), event.timing_cache
    assert "the shared entry is damaged" in event.timing_cache
    assert b.warm == [0]


def test_an_unsigned_shared_entry_is_refused_where_keys_are_trusted(here_fs, s3env, tmp_path,
                                                                     monkeypatch):
    env = with_keys(s3env, tmp_path, monkeypatch)
    module, inputs = linear_relu()
    _export(here_fs, "a", _cache(here_fs, "A", env), module, inputs,
            FakeBuilder(keep_timing=True, engine_sizes=(MiB,)))  # unsigned
    with torch.no_grad():
        module[0].weight.mul_(-1)
    b = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    cache = _cache(here_fs, "B", env, trusted_keys=[env.keys / "team.key.pub"],
                   signing_key=env.keys / "team.key")
    [event] = _export(here_fs, "b", cache, module, inputs, b).engine_cache
    assert event.timing_cache.startswith("timing cache: cold"), event.timing_cache
    assert "the shared entry is refused" in event.timing_cache
    assert b.warm == [0]
    # B's signed merge replaced it: a third machine trusting the team key starts warm.
    with torch.no_grad():
        module[0].bias.add_(1.0)
    c = FakeBuilder(keep_timing=True, engine_sizes=(MiB,))
    cache = _cache(here_fs, "C", env, trusted_keys=[env.keys / "team.key.pub"])
    [event] = _export(here_fs, "c", cache, module, inputs, c).engine_cache
    assert event.timing_cache.startswith("timing cache: warm"), event.timing_cache
    assert c.timed == [0]


def test_push_and_pull_carry_timing_entries(here_fs, s3env, monkeypatch):
    module, inputs = linear_relu()
    local = trtet_store.EngineCache(here_fs / "A", max_bytes=1 << 30, min_free=0)
    _export(here_fs, "a", local, module, inputs, FakeBuilder(keep_timing=True, engine_sizes=(MiB,)))
    with installed(FakeBuilder()):  # the timing seam (combine) is the stub's here
        key = _key()
        pushed = {p.key: p for p in _cache(here_fs, "A", s3env).push()}
        assert pushed[key].published and pushed[key].sent > 0
        _, data = _tier_entry(s3env)
        # Pushed again with nothing new: nothing sent, said so.
        again = {p.key: p for p in _cache(here_fs, "A", s3env).push([key])}
        assert not again[key].published and again[key].sent == 0

        b = _cache(here_fs, "B", s3env)
        assert b.pull([key]) == [(key, len(data))]
        hit = b.blobs.get(key)
        with hit:
            assert parse_timing_cache(Path(hit.path).read_bytes())[1] == \
                parse_timing_cache(data)[1]
        # A machine of another compute capability is refused the entry, nothing cached.
        monkeypatch.setattr(timing_cache, "gpu_facts",
                            lambda: {**SM89, "compute_capability": "sm_86"})
        c = _cache(here_fs, "C", s3env)
        with pytest.raises(ValueError, match="compute_capability 'sm_89' \\(here 'sm_86'\\)"):
            c.pull([key])
        assert [e.key for e in c.entries()] == []
