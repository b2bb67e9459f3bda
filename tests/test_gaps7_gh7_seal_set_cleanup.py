"""publish_set's clean-up (``_remove_unnamed``: the blobs its manifest lists in ``removing``)
runs only while the set manifest is still the one it committed.

Here a bucket writer puts the previous set manifest back (a roll-back, naming the
blob our replace dropped, at its very ETag) right after our commit, before our
clean-up looks: the clean-up must leave that blob and its manifest alone, so the
set now in the bucket names only objects that are there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sets_helpers import write

from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set

SKEY = "rel/trtet-set.json"


class RollsBackAfterOurCommit(S3):
    """A client after whose commit of the set manifest a bucket writer puts ``body`` there,
    just before the next look at it (the clean-up's HEAD)."""

    def __init__(self, url: str, writer: Any, bucket: str, body: bytes) -> None:
        super().__init__(url)
        self.writer, self.bucket, self.body = writer, bucket, body
        self.committed = self.fired = False

    def put(self, bucket: str, key: str, body: bytes, *args: Any, **kw: Any) -> str:
        etag = super().put(bucket, key, body, *args, **kw)
        self.committed = self.committed or key == SKEY
        return etag

    def head(self, bucket: str, key: str, *args: Any, **kw: Any) -> Any:
        if key == SKEY and self.committed and not self.fired:
            self.fired = True
            self.writer.put_object(Bucket=self.bucket, Key=SKEY, Body=self.body)
        return super().head(bucket, key, *args, **kw)


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def test_the_clean_up_leaves_the_removing_blobs_once_the_set_manifest_changed(
        s3env: Any, tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    a = [write(tmp_path / "a" / "model.pte", 5000, 1)]
    b = [write(tmp_path / "b" / "model.pte", 6000, 2)]
    publish_set({"a": a, "b": b}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    v1 = s3env.client.get_object(Bucket=s3env.bucket, Key=SKEY)["Body"].read()
    before = _state(s3env, "rel/blobs/")
    client = RollsBackAfterOurCommit(s3env.endpoint.url, s3env.client, s3env.bucket, v1)
    report = publish_set({"a": a}, url, client=client, config=cfg, if_exists="replace",
                         gc_grace=0)
    assert client.fired
    manifest = json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=SKEY)["Body"].read())
    assert sorted(manifest["members"]) == ["a", "b"]  # the roll-back stands
    assert report.removed == [] and report.pruned == []
    assert _state(s3env, "rel/blobs/") == before  # every blob v1 names, byte for byte
    for digest, blob in manifest["blobs"].items():
        head = s3env.client.head_object(Bucket=s3env.bucket, Key=f"rel/blobs/{digest}")
        assert head["ContentLength"] == blob["size"]
