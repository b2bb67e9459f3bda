"""A sweep deletes a blob's manifest before the blob (trtet_store/remote/sweep.py).

A set publish's clean-up removes an unnamed blob and its manifest with two
conditional deletes. A clean-up killed between the two must leave at worst a
blob with no manifest (the next prune removes it), never a manifest naming a
blob that is gone (a reader would trust it). The kill is a client whose
deletes fail after its first one, on the real SeaweedFS server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from trtet_store.remote.errors import RemoteError
from trtet_store.remote.s3 import S3
from trtet_store.remote.sweep import Listed, plan_sweep


class DiesAfterOneDelete(S3):
    """A client whose first delete goes through and every later one fails: a kill."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.deleted: list[str] = []

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        if self.deleted:
            raise RemoteError(f"killed before deleting {key}")
        super().delete(bucket, key, if_match)
        self.deleted.append(key)


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def test_a_sweep_killed_between_its_two_deletes_leaves_no_manifest_without_its_blob(
        s3env: Any, tmp_path: Path) -> None:
    from sets_helpers import write

    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.sets import publish_set
    from trtet_store.sets.publish import _blob_first

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    publish_set({"k": [write(tmp_path / "k" / "model.pte", 3000, 1)]}, url,
                endpoint_url=s3env.endpoint.url, config=cfg)
    first = next(k for k in _state(s3env, "rel/blobs/") if not k.endswith(".json"))
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=first)["Body"].read()
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=f"{first}.trtet.json")["Body"].read())
    stray = f"rel/blobs/{'a' * 32}"  # a blob no set names, with its own manifest
    s3env.client.put_object(Bucket=s3env.bucket, Key=stray, Body=body)
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=stray)
    doc["program"] = "a" * 32
    doc["objects"][0].update(key=stray, name=doc["program"], etag=head["ETag"].strip('"'))
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{stray}.trtet.json",
                            Body=json.dumps(doc).encode())
    before = _state(s3env, "rel/")

    listing = [Listed(k, etag, modified) for k, modified, etag in
               S3(client=s3env.client).list_etags(s3env.bucket, f"{stray}")]
    plan = plan_sweep(listing, [], 0, now=max(i.modified for i in listing) + 10)
    assert [i.key for i in plan.doomed] == [stray, f"{stray}.trtet.json"]
    client = DiesAfterOneDelete(s3env.endpoint.url)
    removed = plan.execute(client, s3env.bucket, first=_blob_first(client, s3env.bucket))

    assert removed == []  # the kill came before either item was wholly removed
    after = _state(s3env, "rel/")
    manifests = [k for k in after if k.startswith("rel/blobs/") and k.endswith(".trtet.json")]
    assert [k for k in manifests if k.removesuffix(".trtet.json") not in after] == []
    assert client.deleted == [f"{stray}.trtet.json"]  # the manifest went first
    assert after == {k: v for k, v in before.items() if k != f"{stray}.trtet.json"}
    assert sorted(plan.kept) == [stray, f"{stray}.trtet.json"]
