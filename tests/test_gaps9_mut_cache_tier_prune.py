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
