"""The shared tier's claim (``trtet_store.cache.tier.claim``: ``claim``, ``RemoteTier.claim``)
refuses a ``timeout`` that is not a number of seconds >= 0 before any request: NaN (and -NaN)
slip past a ``timeout < 0`` check, and a NaN deadline never passes (``_pause``'s
``left <= 0`` is false for NaN), so a wait on another machine's lease would never end.
Nothing is written to the bucket (no lease), on the real SeaweedFS fixture.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier


def _objects(env: Any) -> list[str]:
    got = env.client.list_objects_v2(Bucket=env.bucket)
    return sorted(o["Key"] for o in got.get("Contents", []))


@pytest.mark.parametrize("timeout", [math.nan, -math.nan, -1, -math.inf, True, "5"],
                         ids=["nan", "minus-nan", "minus-one", "minus-inf", "bool", "str"])
def test_claim_refuses_a_timeout_that_is_not_seconds_and_writes_no_lease(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: Any) -> None:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "TRTET_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    tier = RemoteTier(f"s3://{s3env.bucket}/cache", endpoint_url=s3env.endpoint.url,
                      origin="me", journal_dir=s3env.journal_dir, lease_ttl=60.0)
    before = _objects(s3env)
    got = None
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0") as refused:
        got = tier.claim("k" * 32, timeout=timeout)
    if got is not None and hasattr(got, "release"):
        got.release()
    assert "\n" not in str(refused.value)
    assert _objects(s3env) == before  # no lease, no probe object
