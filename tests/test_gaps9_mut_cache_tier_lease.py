"""How a waiter of the shared tier tells a renewed build lease (``trtet_store.cache.tier.lease``
``LeaseWatch._token``/``look``, through ``RemoteTier.claim``): without trusted keys a lease
whose bytes change (a new ETag) is renewed, whatever it says, so a live holder of a version
that writes no ``beat`` (only its ``renewed`` time changes) holds the waiter until its
deadline and is never taken over; the same lease left unchanged is taken over after its ttl.

On the real SeaweedFS fixture; the holder is another client writing the lease with boto3
between the waiter's looks; the waiter's clock moves only as it sleeps (no wall time waited).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from clocks import TestClock

from trtet_store.cache.tier import Lease, LeaseWaitTimeout, RemoteTier

HOLDER = "f" * 32


@pytest.fixture
def env(s3env: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "TRTET_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return s3env


def _tier(env: Any) -> RemoteTier:
    return RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url, origin="w",
                      journal_dir=env.journal_dir / "w", lease_ttl=10.0, poll=1.0)


def _lease_without_beat(n: int) -> bytes:
    # An older holder's lease: no "beat"; each renewal rewrites "renewed" (a new ETag).
    return json.dumps({"holder": HOLDER, "host": "elsewhere", "pid": 4242,
                       "started": time.time() - 60, "renewed": time.time() + n * 1e-3,
                       "ttl": 10.0}).encode()


def _holder_of(env: Any, lkey: str) -> str:
    got = env.client.get_object(Bucket=env.bucket, Key=lkey)["Body"].read()
    return json.loads(got)["holder"]


def test_an_unsigned_lease_renewed_without_a_beat_holds_the_waiter_to_its_deadline(env):
    waiter = _tier(env)
    lkey = waiter.where.lease_key("R")
    env.client.put_object(Bucket=env.bucket, Key=lkey, Body=_lease_without_beat(0))
    # The live holder rewrites its lease every third poll (3 s of the waiter's clock,
    # within the ttl of 10 s).
    waiter.clock = TestClock(lambda c: c.sleeps % 3 or env.client.put_object(
        Bucket=env.bucket, Key=lkey, Body=_lease_without_beat(c.sleeps)))
    with pytest.raises(LeaseWaitTimeout, match="waited 30 s for the build lease"):
        waiter.claim("R", timeout=30)
    assert _holder_of(env, lkey) == HOLDER  # never taken over


def test_the_same_lease_left_unchanged_is_taken_over_after_its_ttl(env):
    waiter = _tier(env)
    lkey = waiter.where.lease_key("R")
    env.client.put_object(Bucket=env.bucket, Key=lkey, Body=_lease_without_beat(0))
    clock = TestClock()
    waiter.clock = clock
    got = waiter.claim("R", timeout=30)
    try:
        assert isinstance(got, Lease)
        assert 10 < clock.t <= 12, clock.t
        assert _holder_of(env, lkey) == got.holder != HOLDER
    finally:
        got.release()


def test_two_holders_old_signed_leases_alternated_do_not_renew_it(env, tmp_path):
    """With trusted keys a lease counts as renewed only when its holder's signed beat moves
    on: a bucket writer who alternates two genuine old signed leases of two holders (A at
    beat 5, B at beat 3) renews nothing after each has been seen once: the waiter takes over
    one ttl after the last change, not at its deadline."""
    from trtet_store.cache.tier import keygen
    from trtet_store.cache.tier.lease import lease_body
    from trtet_store.cache.tier.signing import load_signing_key

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    keygen(keys / "team.key")
    team = load_signing_key(keys / "team.key")
    waiter = RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url, origin="w",
                        journal_dir=env.journal_dir / "w", lease_ttl=40.0, poll=10.0,
                        signing_key=keys / "team.key", trusted_keys=[keys / "team.key.pub"])
    lkey = waiter.where.lease_key("R")
    bodies = [lease_body(h * 32, time.time() - 60, 40.0, beat, signing_key=team,
                         bucket=env.bucket, object_key=lkey) for h, beat in (("a", 5), ("b", 3))]
    env.client.put_object(Bucket=env.bucket, Key=lkey, Body=bodies[0])
    clock = TestClock(lambda c: env.client.put_object(Bucket=env.bucket, Key=lkey,
                                                      Body=bodies[c.sleeps % 2]))
    waiter.clock = clock
    got = waiter.claim("R", timeout=200)
    try:
        assert isinstance(got, Lease)
        # B first seen at 10 s (a new holder: a change); nothing after: taken over once
        # more than the ttl (40 s) has passed since, at the next look.
        assert 50 < clock.t <= 60, clock.t
    finally:
        got.release()
