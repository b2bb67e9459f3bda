"""The shared tier's prune (``trtet_store.cache.tier.prune.prune``, through
``RemoteTier.prune``) and objects it did not make: a lease-like object one level down
(``<prefix><key>/x.lease``, neither a lease, a pointer nor an attempt's object) is left alone
however old; a real dead lease at ``<prefix><key>.lease`` goes; a young lease stays.

On the real SeaweedFS fixture; "now" is the prune's clock (a fixed time), not the wall clock.
"""

from __future__ import annotations

import json
import time
from typing import Any

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier.lease import Clock


class _At(Clock):
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def _keys(s3env: Any) -> list[str]:
    got = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="cache/")
    return sorted(o["Key"] for o in got.get("Contents", []))


def test_prune_leaves_a_lease_like_object_one_level_down_alone(s3env: Any) -> None:
    c, bucket = s3env.client, s3env.bucket
    body = json.dumps({"holder": "f" * 32, "host": "x", "pid": 1, "started": 1.0,
                       "renewed": 1.0, "ttl": 0.1, "beat": 1}).encode()
    for key in ("cache/k/x.lease", "cache/dead.lease"):
        c.put_object(Bucket=bucket, Key=key, Body=body)
    time.sleep(1.5)  # dead by the server's clock too (its Date less Last-Modified, in s)
    modified = max(o["LastModified"].timestamp()
                   for o in c.list_objects_v2(Bucket=bucket, Prefix="cache/")["Contents"])
    tier = RemoteTier(f"s3://{bucket}/cache", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=s3env.journal_dir, lease_ttl=1.0)
    tier.clock = _At(modified + 3600.0)  # an hour on: the lease is long dead
    removed = tier.prune(60.0)
    assert removed == ["dead.lease"], removed
    assert _keys(s3env) == ["cache/k/x.lease"]


def _old_lease_and_attempt(s3env: Any) -> tuple[RemoteTier, float]:
    c, bucket = s3env.client, s3env.bucket
    body = json.dumps({"holder": "f" * 32, "host": "x", "pid": 1, "started": 1.0,
                       "renewed": 1.0, "ttl": 0.1, "beat": 1}).encode()
    c.put_object(Bucket=bucket, Key="cache/dead.lease", Body=body)
    c.put_object(Bucket=bucket, Key="cache/gone/c-00000000000000bb/record", Body=b"orphan")
    time.sleep(1.5)  # the lease dead by the server's clock (Date less Last-Modified)
    stamps = {o["LastModified"].timestamp()
              for o in c.list_objects_v2(Bucket=bucket, Prefix="cache/")["Contents"]}
    tier = RemoteTier(f"s3://{bucket}/cache", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=s3env.journal_dir, lease_ttl=1.0)
    return tier, max(stamps) if len(stamps) == 1 else -1.0


def test_prune_removes_a_lease_and_an_orphan_attempt_of_exactly_the_age_asked(s3env):
    tier, modified = _old_lease_and_attempt(s3env)
    for _ in range(5):  # the two objects' Last-Modified fell in two seconds: again (a loaded
        if modified >= 0:  # machine puts them further apart, so more often)
            break
        for k in _keys(s3env):
            s3env.client.delete_object(Bucket=s3env.bucket, Key=k)
        tier, modified = _old_lease_and_attempt(s3env)
    assert modified >= 0
    tier.clock = _At(modified + 60.0)  # exactly 60 s old by the prune's clock
    removed = sorted(tier.prune(60.0))
    assert removed == ["dead.lease", "gone/c-00000000000000bb/"], removed
    assert _keys(s3env) == []


def test_prune_keeps_a_lease_younger_than_asked_though_its_server_age_is_dead(s3env):
    tier, modified = _old_lease_and_attempt(s3env)
    tier.clock = _At(max(modified, 0.0) + 10.0 if modified >= 0 else time.time())
    removed = tier.prune(60.0)
    assert removed == [], removed
    assert "cache/dead.lease" in _keys(s3env)
