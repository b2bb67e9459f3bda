"""A pointer (``trtet_store.cache.tier.entry``: ``RemoteEntry.from_json``, read by
``RemoteTier.read_pointer``/``lookup``) names an attempt directory under ITS OWN key only:
``'<key>/<attempt>/'``. A pointer a bucket writer made for key ``k1`` naming ``k2``'s attempt
directory would hand ``k2``'s files out as ``k1``'s, and worse: pruning or deleting ``k1``
removes the attempt it names, ``k2``'s, breaking ``k2``'s entry. It must be a damaged pointer
(never an entry), and a prune that removes old entries leaves ``k2``'s objects byte for byte.
Real SeaweedFS; the bucket writer is another client (boto3).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteEntry, RemoteTier


def _objects(env: Any, prefix: str) -> dict[str, str]:
    out = {}
    for o in env.client.list_objects_v2(Bucket=env.bucket, Prefix=prefix).get("Contents", []):
        body = env.client.get_object(Bucket=env.bucket, Key=o["Key"])["Body"].read()
        out[o["Key"]] = hashlib.sha256(body).hexdigest()
    return out


def test_a_pointer_naming_another_keys_attempt_is_damaged_and_prune_leaves_that_attempt(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = s3env
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", str(tmp_path / "no-config"))
    tier = RemoteTier(f"s3://{env.bucket}/c", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=env.journal_dir)
    (tmp_path / "record").write_bytes(b"k2 record " * 100)
    k1, k2 = "1" * 32, "2" * 32
    theirs = tier.publish(k2, [("record", tmp_path / "record")], {"n": 2}).entry
    # The bucket writer's pointer for k1: k2's files, k2's attempt, created long ago.
    doc = json.loads(env.client.get_object(Bucket=env.bucket, Key=f"c/{k2}.json")["Body"].read())
    doc.update(key=k1, created=1000.0)
    assert doc["attempt"] == theirs.attempt and theirs.attempt.startswith(f"{k2}/")
    env.client.put_object(Bucket=env.bucket, Key=f"c/{k1}.json",
                          Body=json.dumps(doc).encode())
    got = tier.read_pointer(k1)
    assert not isinstance(got, RemoteEntry), got
    assert "attempt" in got.reason, got.reason
    assert tier.lookup(k1) is None
    before = _objects(env, f"c/{k2}")
    removed = tier.prune(3600)  # k1 "created" in 1970: old, were it an entry
    assert _objects(env, f"c/{k2}") == before, removed  # k2's pointer and attempt, as they were
    entry = tier.lookup(k2)
    assert entry is not None
    dl = tier.download(entry, tmp_path / "dl")
    assert dl.paths["record"].read_bytes() == (tmp_path / "record").read_bytes()
