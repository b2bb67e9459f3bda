"""The two-level policy's claim (``trtet_store.cache.tiered``: ``TieredCache.claim``,
``_release``) holds the key's build lease for the whole build: it is released by the caller's
``stack`` when it closes (after the build's publish), never when ``claim`` returns, so another
machine's export of the key waits for the entry instead of building it again. Real SeaweedFS;
the lease object is read by another client while the build runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from trtet_store import EngineCache
from trtet_store.cache.tier import Lease
from trtet_store.io.units import MiB


def _keys(env: Any) -> list[str]:
    got = env.client.list_objects_v2(Bucket=env.bucket).get("Contents", [])
    return sorted(o["Key"] for o in got)


def test_the_build_lease_is_held_until_the_stack_closes(s3env: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", str(tmp_path / "no-config"))
    cache = EngineCache(tmp_path / "c", max_bytes=64 * MiB, min_free=0,
                        remote=f"s3://{s3env.bucket}/t", endpoint_url=s3env.endpoint.url)
    tiered = cache.tiered
    with contextlib.ExitStack() as stack:
        entry, why = tiered.claim("k", stack, timeout=5)
        assert (entry, why) == (None, None)
        assert "t/k.lease" in _keys(s3env)  # held while "the build" runs
        # Another machine's claim of the key sees a live lease: it times out, it does not
        # take the lease.
        other = EngineCache(tmp_path / "o", max_bytes=64 * MiB, min_free=0,
                            remote=f"s3://{s3env.bucket}/t", endpoint_url=s3env.endpoint.url)
        other.tiered.tier.poll = 0.05
        with contextlib.ExitStack() as theirs:
            assert other.tiered.claim("k", theirs, timeout=0.3) == (None, None)
        assert "t/k.lease" in _keys(s3env)
    assert "t/k.lease" not in _keys(s3env)  # released when the stack closed
    got = tiered.tier.claim("k", timeout=1)  # free again: the next build's
    assert isinstance(got, Lease)
    got.release()
