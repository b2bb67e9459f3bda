"""The two-level policy (``trtet_store.cache.tiered``: ``TieredCache.refusal``, ``take``,
``push``) remembers an entry its trusted keys refuse for replacement ONLY when this cache
signs: a cache without a signing key that would replace a refused entry (``If-Match`` it)
puts an unsigned entry in place of another signer's, which every machine trusting that
signer then loses (and which its own trusted keys would refuse as well).

Real SeaweedFS; the team's entry is signed by a real key; the reader trusts another key and
has no signing key. Its later ``push`` of its own build of the key leaves the team's pointer
and objects byte for byte (listing and ETags identical).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from keyed import with_keys

from trtet_store import EngineCache
from trtet_store.cache.tier import RemoteTier
from trtet_store.io.units import MiB


def _bucket(env: Any) -> dict[str, str]:
    out = {}
    for o in env.client.list_objects_v2(Bucket=env.bucket).get("Contents", []):
        body = env.client.get_object(Bucket=env.bucket, Key=o["Key"])["Body"].read()
        out[o["Key"]] = hashlib.sha256(body).hexdigest()
    return out


def _files(directory: Path, seed: int) -> tuple[list[tuple[str, Path]], dict[str, Any]]:
    """An entry's files (refused by its signature before any caller's check reads them)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "record").write_bytes(b"record %d" % seed)
    (directory / "e0").write_bytes(bytes([seed]) * 4096)
    return [("record", directory / "record"), ("e0", directory / "e0")], {"seed": seed}


def test_a_refused_entry_is_not_replaced_by_a_cache_that_cannot_sign(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = with_keys(s3env, tmp_path, monkeypatch)
    url = f"s3://{env.bucket}/t"
    files, meta = _files(tmp_path / "team-src", 7)
    key = "engine-cache-key-7"
    team = RemoteTier(url, endpoint_url=env.endpoint.url, origin="team",
                      journal_dir=tmp_path / "journal-team",
                      signing_key=env.keys / "team.key")
    assert team.publish(key, files, meta).published
    before = _bucket(env)
    # The reader trusts only "evil": the team's entry is refused; it cannot sign.
    reader = EngineCache(tmp_path / "reader", max_bytes=64 * MiB, min_free=0, remote=url,
                         endpoint_url=env.endpoint.url,
                         trusted_keys=[env.keys / "evil.key.pub"])
    tiered = reader.tiered
    assert tiered.tier.signing_key is None
    got = tiered.get(key)
    assert got.hit is None and got.download is None
    assert got.outcome.action == "miss" and got.outcome.reason.startswith("refused: "), got.outcome
    assert got.unpublishable is not None and "no signing key" in got.unpublishable
    # Its own build of the key, pushed (cache push): the team's entry stays.
    mine, meta2 = _files(tmp_path / "mine", 8)
    result = tiered.push(key, mine, meta2)
    assert _bucket(env) == before, result  # the team's signed pointer and objects, byte for byte
    assert not result.published, result
    assert key not in tiered.replace, tiered.replace
