"""A probe that could not ask decides nothing (issue 55 item 4), on the SeaweedFS fixture.

The tier probes conditional writes once per endpoint and bucket, and remembers a
server that does not honour them for the rest of the process. A probe whose first
write fails for another reason (a server error that outlasted botocore's retries,
access denied, no bucket) has learnt nothing: its error is raised, nothing is
remembered, and the next write probes again and finds the conditions honoured.
The failures are answered by tests/conditions_proxy.py instead of the server.
"""

from __future__ import annotations

import pytest
from test_tier_probe import PROBE, bucket_state, files, proxy, tier

from trtet_store.cache.tier import ConditionalWritesUnsupportedError, Lease
from trtet_store.remote.errors import AccessDeniedError, BucketNotFoundError, RemoteError
from trtet_store.remote.s3 import Transient

# (status, S3 code, how many answers: the tier's client tries twice where botocore retries)
FAILURES = {
    "503 SlowDown": (503, "SlowDown", 2, Transient),
    "500 InternalError": (500, "InternalError", 2, Transient),
    "403 AccessDenied": (403, "AccessDenied", 1, AccessDeniedError),
    "404 NoSuchBucket": (404, "NoSuchBucket", 1, BucketNotFoundError),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_first_probe_write_is_not_remembered_as_a_verdict(tmp_path, s3env, failure):
    status, code, times, kind = FAILURES[failure]
    url = f"s3://{s3env.bucket}/team"
    with proxy(s3env) as px:
        px.fail_next(PROBE, status, code, times)
        t = tier(url, px.url, tmp_path)
        with pytest.raises(RemoteError) as failed:
            t.claim("k1")
        assert isinstance(failed.value, kind), repr(failed.value)
        assert not isinstance(failed.value, ConditionalWritesUnsupportedError), failed.value
        assert "does not honour" not in str(failed.value)
        first = px.seen(PROBE)
        # Answered by the proxy; then the delete of the key the server might have stored.
        assert [s.method for s in first] == ["PUT"] * times + ["DELETE"], first
        assert not px._failures  # every injected answer was used by the first probe
        # The same process, the same endpoint and bucket: probed again, honoured, a lease.
        lease = t.claim("k1")
        assert isinstance(lease, Lease), lease
        lease.release()
        second = px.seen(PROBE)[len(first):]
        assert [s.method for s in second] == ["PUT", "PUT", "PUT", "PUT", "DELETE"], second
        # Now remembered: a publish asks no third probe.
        assert t.publish("k2", files(tmp_path, "k2", 1000), {}).published
        assert len(px.seen(PROBE)) == len(first) + len(second)
    objects, uploads = bucket_state(s3env)
    assert sorted(objects) == ["team/k2.json", *sorted(k for k in objects if "/k2/" in k)]
    assert uploads == []
