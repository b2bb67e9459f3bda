"""The tier's probe verdict (``trtet_store.cache.tier.probe``: ``require_conditional_writes``,
``_verdicts``) is remembered per endpoint AND bucket: a second bucket on the same endpoint is
probed for itself, never handed the first bucket's "honours conditional writes".

Some servers decide conditional writes per bucket (a bucket on another backend or
gateway behind one endpoint). tests/conditions_proxy.py stands for that: it forwards honestly
while the first bucket is probed and published to, then drops ``If-None-Match``/``If-Match``
from every write while the second bucket is used. The second bucket's publish must be
refused (``ConditionalWritesUnsupportedError``) with nothing of the entry written there;
the first bucket's verdict stays (no third probe).
"""

from __future__ import annotations

import pytest
from test_tier_probe import BOTH, PROBE, bucket_state, files, proxy, tier

from trtet_store.cache.tier import ConditionalWritesUnsupportedError


def test_a_second_bucket_on_the_same_endpoint_is_probed_for_itself(tmp_path, s3env):
    second = f"{s3env.bucket}-b"
    s3env.client.create_bucket(Bucket=second)
    try:
        with proxy(s3env) as px:
            a = tier(f"s3://{s3env.bucket}/team", px.url, tmp_path / "a")
            assert a.publish("k1", files(tmp_path, "k1", 1000), {}).published
            first = px.seen(PROBE)
            assert first and all(s.target.startswith(f"/{s3env.bucket}/") for s in first)
            px.ignore = BOTH  # from now on the server ignores conditions on every write
            b = tier(f"s3://{second}/team", px.url, tmp_path / "b")
            with pytest.raises(ConditionalWritesUnsupportedError, match="does not honour"):
                b.publish("k2", files(tmp_path, "k2", 1000), {})
            probed_b = [s for s in px.seen(PROBE) if s.target.startswith(f"/{second}/")]
            assert [s.method for s in probed_b][:2] == ["PUT", "PUT"], probed_b
            # Nothing of the entry reached the second bucket (no object, no pointer).
            writes = [s for s in px.seen(f"/{second}/team/k2") if s.method in ("PUT", "POST")]
            assert writes == [], writes
            px.ignore = ()
            # The first bucket keeps its own verdict: no new probe there.
            assert a.publish("k3", files(tmp_path, "k3", 1000), {}).published
            assert [s for s in px.seen(PROBE) if s.target.startswith(f"/{s3env.bucket}/")] \
                == first
        listing = s3env.client.list_objects_v2(Bucket=second).get("Contents", [])
        assert [o["Key"] for o in listing] == [], listing
        objects, uploads = bucket_state(s3env)
        assert {k for k in objects if k.endswith(".json") and k.count("/") == 1} == \
            {"team/k1.json", "team/k3.json"}
        assert uploads == []
    finally:
        for o in s3env.client.list_objects_v2(Bucket=second).get("Contents", []):
            s3env.client.delete_object(Bucket=second, Key=o["Key"])
        s3env.client.delete_bucket(Bucket=second)
