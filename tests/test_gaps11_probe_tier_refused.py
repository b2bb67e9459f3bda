"""The tier's probe (``trtet_store.cache.tier.probe``: ``probe``, ``_refused``,
``require_conditional_writes``) decides nothing when a LATER step of the probe could not ask.

The first write's failure is covered by test_tier_probe_transient.py. Here the probe's third
step (an ``If-Match`` PutObject of the missing key) is answered 503 SlowDown (twice: the
tier's client tries twice) or 403 AccessDenied by tests/conditions_proxy.py: ``_refused``
must raise it (``_NOT_A_VERDICT``), never take it for "refused otherwise", which would be
remembered as "does not honour conditional writes" for the rest of the process. The next
claim probes again, finds the conditions honoured and takes its lease; the probe's objects
are all deleted.
"""

from __future__ import annotations

import pytest
from test_tier_probe import PROBE, bucket_state, proxy, tier

from trtet_store.cache.tier import ConditionalWritesUnsupportedError, Lease
from trtet_store.remote.errors import AccessDeniedError, RemoteError
from trtet_store.remote.s3 import Transient


@pytest.mark.parametrize("status,code,times,kind", [
    (503, "SlowDown", 2, Transient), (403, "AccessDenied", 1, AccessDeniedError)],
    ids=["503", "403"])
def test_a_failed_later_probe_step_is_not_remembered_as_a_verdict(tmp_path, s3env, status, code,
                                                                   times, kind):
    url = f"s3://{s3env.bucket}/team"
    with proxy(s3env) as px:
        px.fail_next("/missing", status, code, times)
        t = tier(url, px.url, tmp_path)
        with pytest.raises(RemoteError) as failed:
            t.claim("k1")
        assert isinstance(failed.value, kind), repr(failed.value)
        assert not isinstance(failed.value, ConditionalWritesUnsupportedError), failed.value
        assert "does not honour" not in str(failed.value)
        first = px.seen(PROBE)
        # create, create again (412), the failed step, then the clean-up of what it made.
        assert [s.method for s in first[:2 + times]] == ["PUT"] * (2 + times), first
        assert not px._failures
        # No lease was written for k1 by the failed claim.
        assert not [s for s in px.seen("/team/k1.lease") if s.method == "PUT"]
        # The same process: probed again, honoured, the lease is ours.
        lease = t.claim("k1")
        assert isinstance(lease, Lease), lease
        lease.release()
        second = px.seen(PROBE)[len(first):]
        assert [s.method for s in second] == ["PUT", "PUT", "PUT", "PUT", "DELETE"], second
    objects, uploads = bucket_state(s3env)
    assert not [k for k in objects if ".trtet-probe" in k], objects  # nothing left behind
    assert uploads == []


def test_a_first_create_refused_412_is_a_verdict_and_deletes_nothing(tmp_path, s3env):
    """A server that answers the probe's very first create-only PutObject of a new key with
    412 does not honour conditions (remembered); that key was not made by the probe, so the
    probe never sends a DELETE for it (``made.clear()``: only its own objects are deleted)."""
    url = f"s3://{s3env.bucket}/team"
    before = bucket_state(s3env)
    with proxy(s3env) as px:
        px.fail_next(PROBE, 412, "PreconditionFailed", 1)
        t = tier(url, px.url, tmp_path)
        with pytest.raises(ConditionalWritesUnsupportedError, match=r"was refused \(412\)"):
            t.claim("k1")
        assert [s.method for s in px.seen(PROBE)] == ["PUT"], px.seen(PROBE)  # no DELETE
        with pytest.raises(ConditionalWritesUnsupportedError, match="does not honour"):
            t.claim("k1")  # remembered: no second probe
        assert [s.method for s in px.seen(PROBE)] == ["PUT"]
    assert bucket_state(s3env) == before


def test_a_missing_keys_if_match_answered_404_counts_as_refused(tmp_path, s3env):
    """AWS answers an ``If-Match`` PutObject of a missing key with 404 NoSuchKey, not 412:
    ``_refused(..., missing_ok=True)`` takes that as the refusal the probe's third step wants,
    so the server honours conditions and the lease is ours (probed once)."""
    url = f"s3://{s3env.bucket}/team"
    with proxy(s3env) as px:
        px.fail_next("/missing", 404, "NoSuchKey", 1)
        t = tier(url, px.url, tmp_path)
        lease = t.claim("k1")
        assert isinstance(lease, Lease), lease
        lease.release()
        assert not px._failures
        assert [s.method for s in px.seen(PROBE)] == ["PUT", "PUT", "PUT", "PUT", "DELETE"]
        again = t.claim("k2")  # remembered as honoured: no second probe
        assert isinstance(again, Lease)
        again.release()
        assert len(px.seen(PROBE)) == 5
    objects, uploads = bucket_state(s3env)
    assert objects == {} and uploads == [], (objects, uploads)
