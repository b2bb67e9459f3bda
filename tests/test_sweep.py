"""One bucket sweep (trtet_store/remote/sweep.py), run against each caller's layout.

The three collectors (the tier's prune, a set publish's clean-up and prune, a
program's replaced objects) plan with :func:`plan_sweep` and delete with
:meth:`SweepPlan.execute`. The same behaviours are checked on each one's keys,
on the real SeaweedFS server: what a root names stays, what is younger than
the grace stays, the rest goes, and an object a bucket writer rewrote between
the plan and the delete stays (every delete is ``If-Match`` the listed ETag).
Then each caller is driven through its own entry point with the same races.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier.lease import Clock
from trtet_store.remote.s3 import S3
from trtet_store.remote.sweep import Listed, plan_sweep

HEX = "0123456789abcdef" * 2
# Each caller's layout: (what goes, what a root names) as it lists them.
LAYOUTS = {
    "tier-prune": (["cache/old.json", "cache/dead.lease"], ["cache/live.json"]),
    "sets-publish": ([f"rel/blobs/{HEX}", f"rel/blobs/{HEX}.trtet.json"],
                     [f"rel/blobs/{'f' * 32}"]),
    "program-replace": (["p/gpu.ptd"], ["p/cpu.ptd"]),
}


class RewritesBeforeDelete(S3):
    """A client whose delete of a key in ``targets`` is preceded by a bucket writer's put
    of that key (another client, on the server): the race between a plan and its delete."""

    def __init__(self, url: str, writer: Any, bucket: str, targets: set[str]) -> None:
        super().__init__(url)
        self.writer, self.bucket, self.targets = writer, bucket, targets
        self.rewritten: dict[str, bytes] = {}

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        if key in self.targets and key not in self.rewritten:
            body = f"written by another client at {time.time()}".encode()
            self.writer.put_object(Bucket=self.bucket, Key=key, Body=body)
            self.rewritten[key] = body
        super().delete(bucket, key, if_match)


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    """``{key: sha256 of its bytes}`` of everything under ``prefix``."""
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def _listing(s3env: Any, prefix: str) -> list[Listed]:
    return [Listed(k, etag, modified)
            for k, modified, etag in S3(client=s3env.client).list_etags(s3env.bucket, prefix)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_sweep_keeps_the_named_the_young_and_the_rewritten(s3env: Any, layout: str) -> None:
    doomed, named = LAYOUTS[layout]
    prefix = doomed[0].split("/")[0] + "/"
    for k in doomed + named:
        s3env.client.put_object(Bucket=s3env.bucket, Key=k, Body=f"bytes of {k}".encode())
    listing = _listing(s3env, prefix)
    newest = max(i.modified for i in listing)
    before = _state(s3env, prefix)

    # Younger than the grace (by the listing's clock): nothing goes.
    young = plan_sweep(listing, named, 3600, now=newest + 10)
    assert young.doomed == [] and young.execute(S3(client=s3env.client), s3env.bucket) == []
    assert sorted(young.kept) == sorted(doomed + named)
    assert _state(s3env, prefix) == before

    # Older: the unnamed go; a bucket writer rewrites the first between plan and delete.
    plan = plan_sweep(listing, named, 5, now=newest + 10)
    assert [i.key for i in plan.doomed] == sorted(doomed)
    client = RewritesBeforeDelete(s3env.endpoint.url, s3env.client, s3env.bucket,
                                  {sorted(doomed)[0]})
    removed = plan.execute(client, s3env.bucket)
    assert removed == sorted(doomed)[1:]
    assert plan.kept[sorted(doomed)[0]] == "changed since it was listed"
    after = _state(s3env, prefix)
    rewritten = sorted(doomed)[0]
    assert after[rewritten] == hashlib.sha256(client.rewritten[rewritten]).hexdigest()
    assert {k: v for k, v in after.items() if k != rewritten} == \
        {k: before[k] for k in named}  # the named untouched, nothing else left


# --- each caller through its own entry point ------------------------------------------------


class FixedClock(Clock):
    """A clock whose wall time stands still at ``now`` (what the prune calls now)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def _tier(s3env: Any, client: S3 | None = None) -> RemoteTier:
    return RemoteTier(f"s3://{s3env.bucket}/cache", endpoint_url=s3env.endpoint.url,
                      client=client, origin="a", journal_dir=s3env.journal_dir / "a")


def _entry(tier: RemoteTier, tmp_path: Path, key: str, age: float) -> None:
    """An entry published now whose pointer says it was created ``age`` s ago."""
    from trtet_store.cache.tier.lease import put

    f = tmp_path / key / "record"
    f.parent.mkdir(parents=True)
    f.write_bytes(hashlib.sha256(key.encode()).digest() * 40)
    tier.publish(key, [("record", f)], {})
    e = tier.lookup(key)
    e.created = time.time() - age
    put(tier.s3, tier.bucket, f"cache/{key}.json", e.to_json(), if_match=e.etag)


def test_tier_prune_keeps_a_young_entry_and_one_rewritten_before_its_delete(
        s3env: Any, tmp_path: Path) -> None:
    writer = s3env.client
    plain = _tier(s3env)
    _entry(plain, tmp_path, "old", 7200)
    _entry(plain, tmp_path, "raced", 7200)
    s3env.client.put_object(Bucket=s3env.bucket, Key="cache/dead.lease", Body=b"{}")
    s3env.client.put_object(Bucket=s3env.bucket, Key="cache/raced2.lease", Body=b"{}")
    time.sleep(2.1)  # the leases' LastModified (whole seconds) 2 s behind
    _entry(plain, tmp_path, "young", 0)
    before = _state(s3env, "cache/")
    tier = _tier(s3env, RewritesBeforeDelete(s3env.endpoint.url, writer, s3env.bucket,
                                             {"cache/raced.json", "cache/raced2.lease"}))
    # "Now" is one second after the young entry was made, however long a loaded machine
    # takes to get here: the leases are over 3 s old by then, the young entry 1 s.
    tier.clock = FixedClock(plain.lookup("young").created + 1.0)
    assert sorted(tier.prune(2.0)) == ["dead.lease", "old"]
    after = _state(s3env, "cache/")
    kept = {k: v for k, v in before.items() if not k.startswith(("cache/old", "cache/dead"))}
    for k in ("cache/raced.json", "cache/raced2.lease"):  # the writer's version, kept
        kept[k] = hashlib.sha256(tier.s3.rewritten[k]).hexdigest()
    assert after == kept
    assert [e.key for e in RemoteTier.entries(plain)] == ["young"]  # raced: now unreadable
    assert sorted(_tier(s3env).prune(3600)) == []  # young, by an hour's grace


def test_a_set_publish_prunes_only_what_is_old_enough_and_as_listed(s3env: Any,
                                                                    tmp_path: Path) -> None:
    from sets_helpers import write

    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import publish_set

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    kept = [write(tmp_path / "k" / "model.pte", 5000, 1)]  # named throughout, and old
    publish_set({"k": kept}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    first = next(k for k in _state(s3env, "rel/blobs/") if not k.endswith(".json"))
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=first)["Body"].read()
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=f"{first}.trtet.json")["Body"].read())
    stray, raced = (f"rel/blobs/{d * 32}" for d in "ab")
    for k in (stray, raced):  # blobs no manifest names (a loser's), each with its manifest
        s3env.client.put_object(Bucket=s3env.bucket, Key=k, Body=body)
        head = s3env.client.head_object(Bucket=s3env.bucket, Key=k)
        doc["program"] = k.rpartition("/")[2]
        doc["objects"][0].update(key=k, name=doc["program"], etag=head["ETag"].strip('"'))
        s3env.client.put_object(Bucket=s3env.bucket, Key=f"{k}.trtet.json",
                                Body=json.dumps(doc).encode())
    before = {k: v for k, v in _state(s3env, "rel/blobs/").items()
              if k.startswith((stray, raced))}
    time.sleep(2.1)
    m2 = [write(tmp_path / "b" / "model.pte", 5000, 2)]
    young = publish_set({"k": kept, "a": m2}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                        if_exists="replace", gc_grace=3600)
    assert young.pruned == []
    assert {k: v for k, v in _state(s3env, "rel/blobs/").items() if k in before} == before
    client = RewritesBeforeDelete(s3env.endpoint.url, s3env.client, s3env.bucket, {raced})
    report = publish_set({"k": kept, "a": m2 + [write(tmp_path / "b" / "x.ptd", 5000, 3)]}, url,
                         client=client, config=cfg, if_exists="replace", gc_grace=1)
    after = _state(s3env, "rel/blobs/")
    assert stray not in after and f"{stray}.trtet.json" not in after
    assert after[raced] == hashlib.sha256(client.rewritten[raced]).hexdigest()
    assert "a" * 32 in report.pruned and "b" * 32 not in report.pruned
    assert {first, f"{first}.trtet.json"} <= set(after)  # the named blob and its manifest
