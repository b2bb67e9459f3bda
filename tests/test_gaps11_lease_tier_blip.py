"""A build lease's renewal (``trtet_store.cache.tier.lease``: ``Lease.renew``, ``_renew``,
``_renew_loop``) rides out a network blip: a renewal the server answers 503 (twice: the
tier's client tries twice) is logged and counts as "try again at the next beat", never as the
lease lost. The renewal thread goes on, the lease object keeps changing (waiters see it live),
``lost`` stays False, and the release deletes it. tests/conditions_proxy.py injects the 503s
in front of the real SeaweedFS server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from test_tier_probe import proxy

from trtet_store.cache.tier import Lease, RemoteTier


def _etag(env: Any, key: str) -> str | None:
    try:
        return env.client.head_object(Bucket=env.bucket, Key=key)["ETag"].strip('"')
    except env.client.exceptions.ClientError:
        return None


def test_a_renewal_answered_503_is_a_blip_and_the_lease_stays_renewed(s3env: Any,
                                                                      tmp_path: Path) -> None:
    key = "cache/k.lease"
    with proxy(s3env) as px:
        tier = RemoteTier(f"s3://{s3env.bucket}/cache", endpoint_url=px.url, origin="a",
                          journal_dir=tmp_path / "j", lease_ttl=60.0)
        lease = tier.claim("k")
        assert isinstance(lease, Lease)
        try:
            px.fail_next(key, 503, "SlowDown", 2)
            assert lease.renew() is True  # a blip: the next beat tries again
            assert not lease.lost
            assert not px._failures  # both injected answers were used by that renewal
            first = _etag(s3env, key)
            assert lease.renew() is True  # the next beat gets through
            assert _etag(s3env, key) != first and _etag(s3env, key) == lease.etag
            assert not lease.lost
        finally:
            lease.release()
        assert _etag(s3env, key) is None  # released (If-Match our ETag)


def test_the_renewal_thread_goes_on_after_a_blip(s3env: Any, tmp_path: Path) -> None:
    key = "cache/k.lease"
    with proxy(s3env) as px:
        tier = RemoteTier(f"s3://{s3env.bucket}/cache", endpoint_url=px.url, origin="a",
                          journal_dir=tmp_path / "j", lease_ttl=0.9)  # a beat every 0.3 s
        lease = tier.claim("k")
        assert isinstance(lease, Lease)
        try:
            px.fail_next(key, 503, "SlowDown", 2)  # the next renewal's two tries
            deadline = time.monotonic() + 10
            while px._failures and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not px._failures  # the blip happened
            seen = {_etag(s3env, key)}
            while len(seen) < 3 and time.monotonic() < deadline:  # renewed twice more
                time.sleep(0.1)
                seen.add(_etag(s3env, key))
            assert len(seen) >= 3, seen
            assert not lease.lost
        finally:
            lease.release()
        assert _etag(s3env, key) is None
