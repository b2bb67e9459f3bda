"""The shared tier's prune (trtet_store.cache.tier.prune: ``RemoteTier.prune``, which
``EngineCache.prune_remote`` calls) refuses an ``older_than`` that is NaN before it lists
anything: every comparison with NaN is false, so the sweep dooms every pointer and
"now - modified < older_than" keeps no attempt directory: an entry and a publisher's attempt
uploading right now (no pointer yet) would be removed. The bucket, written by another client
on SeaweedFS, is left byte for byte.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier


def _objects(env: Any) -> dict[str, str]:
    """Every object of the bucket: its key and the sha256 of its bytes."""
    out = {}
    for page in env.client.get_paginator("list_objects_v2").paginate(Bucket=env.bucket):
        for o in page.get("Contents", []):
            body = env.client.get_object(Bucket=env.bucket, Key=o["Key"])["Body"].read()
            out[o["Key"]] = hashlib.sha256(body).hexdigest()
    return out


@pytest.mark.parametrize("older_than", [math.nan, -math.nan, float("-inf"), -1],
                         ids=["nan", "minus-nan", "minus-inf", "minus-one"])
def test_prune_refuses_a_nan_older_than_and_removes_nothing(s3env: Any, tmp_path: Path,
                                                            older_than: float) -> None:
    env = s3env
    tier = RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=env.journal_dir)
    src = tmp_path / "record"
    src.write_bytes(b"r" * 100)
    tier.publish("kept", [("record", src)], {})
    # Another client's publish of "building", in flight: its attempt's objects, no pointer yet.
    for name in ("record", "e0"):
        env.client.put_object(Bucket=env.bucket, Key=f"cache/building/b-00000000000000aa/{name}",
                              Body=hashlib.sha256(name.encode()).digest() * 4)
    env.client.put_object(Bucket=env.bucket, Key="cache/old.lease", Body=b"{}")
    before = _objects(env)
    assert any(k.startswith("cache/building/b-") for k in before), before

    for dry_run in (False, True):
        refused = None
        try:
            got = tier.prune(older_than, dry_run=dry_run)
        except ValueError as exc:
            refused, got = exc, None
        assert _objects(env) == before, f"prune(older_than={older_than!r}, dry_run=" \
            f"{dry_run}) changed the bucket: it returned {got!r}"
        assert refused is not None, f"prune(older_than={older_than!r}) was not refused: {got!r}"
        assert "older_than" in str(refused) and "\n" not in str(refused), refused
    assert [e.key for e in tier.entries()] == ["kept"]
