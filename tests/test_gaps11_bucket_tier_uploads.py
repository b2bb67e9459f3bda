"""An attempt directory's removal (``trtet_store.cache.tier.bucket``: ``TierBucket.remove_attempt``,
called by ``RemoteTier.prune`` for an orphan attempt and by ``RemoteTier.delete``) aborts the
open multipart uploads under it too, not only its objects: a killed publisher's parts are
billed for good otherwise, while prune says the attempt was removed.

Real SeaweedFS; the killed publisher is another client (boto3) that started a multipart
upload in the attempt directory and sent a part, never completing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier


def _tier(env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RemoteTier:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", str(tmp_path / "no-config"))
    return RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=env.journal_dir)


def _open_upload(env: Any, key: str) -> None:
    """A killed publisher's upload of ``key``: started, one part sent, never completed."""
    up = env.client.create_multipart_upload(Bucket=env.bucket, Key=key)
    env.client.upload_part(Bucket=env.bucket, Key=key, UploadId=up["UploadId"], PartNumber=1,
                           Body=b"p" * (5 << 20))


def _state(env: Any, prefix: str) -> tuple[list[str], list[str]]:
    objects = env.client.list_objects_v2(Bucket=env.bucket, Prefix=prefix).get("Contents", [])
    uploads = env.client.list_multipart_uploads(Bucket=env.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in objects), sorted(u["Key"] for u in uploads.get("Uploads", []))


def test_prune_of_an_orphan_attempt_aborts_its_open_upload(s3env, tmp_path, monkeypatch):
    tier = _tier(s3env, tmp_path, monkeypatch)
    adir = "cache/lost/b-00000000000000aa/"
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{adir}record", Body=b"r" * 100)
    _open_upload(s3env, f"{adir}e0")
    assert _state(s3env, adir) == ([f"{adir}record"], [f"{adir}e0"])
    assert tier.prune(0, dry_run=True) == ["lost/b-00000000000000aa/"]
    assert _state(s3env, adir) == ([f"{adir}record"], [f"{adir}e0"])  # a dry run: nothing
    assert tier.prune(0) == ["lost/b-00000000000000aa/"]
    assert _state(s3env, adir) == ([], [])  # its object and its open upload


def test_delete_of_an_entry_aborts_an_open_upload_in_its_attempt(s3env, tmp_path, monkeypatch):
    tier = _tier(s3env, tmp_path, monkeypatch)
    (tmp_path / "record").write_bytes(b"r" * 300)
    entry = tier.publish("k", [("record", tmp_path / "record")], {}).entry
    adir = f"cache/{entry.attempt}"
    _open_upload(s3env, f"{adir}e9")
    tier.delete(entry)
    assert tier.lookup("k") is None
    assert _state(s3env, "cache/k") == ([], [])
