"""publish_set's renewal of a one-part blob by PutObject (``_put_small`` from ``_renew(`` in
sets/publish.py) is read back: a rival's write landing right after ours is not taken as ours.

A blob the bucket holds but no set names (a killed publish's) is renewed
before the commit: written again by PutObject, so its ETag differs from the
one a stale clean-up or prune holds (the old one, ``...-1``), and their
delete pinned to it is refused. Right after our PutObject, another client (a
bucket writer: boto3 on SeaweedFS) uploads the same bytes again as one part,
the old layout: the blob is back at the old ETag. Taking our PutObject's
ETag as the blob's would commit a set naming a version that is not there,
while the stale delete pinned to the old ETag now succeeds. The read-back
sees the rival's write and the renewal is done again: after publish_set
returns, the set, the blob manifest and the object name one ETag (not the old
one), the stale delete is refused, and the member fetches whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import xxhash
from sets_helpers import write

from trtet_store.remote.s3 import S3, PreconditionFailed
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import SET_KEY, fetch_set, publish_set

SMALL = 4096 + 17  # a blob of one part: renewed by PutObject
SET = f"rel/{SET_KEY}"


def _etag(s3env: Any, key: str) -> str:
    return s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"].strip('"')


def _one_part_upload(s3env: Any, key: str, body: bytes) -> str:
    """``body`` at ``key`` as a multipart upload of one part (another client); its ETag."""
    c, b = s3env.client, s3env.bucket
    up = c.create_multipart_upload(Bucket=b, Key=key)["UploadId"]
    etag = c.upload_part(Bucket=b, Key=key, UploadId=up, PartNumber=1, Body=body)["ETag"]
    done = c.complete_multipart_upload(Bucket=b, Key=key, UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": etag}]})
    return done["ETag"].strip('"')


def test_a_rival_write_right_after_our_renewal_is_not_taken_as_ours(s3env: Any,
                                                                    tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", SMALL, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    digest = xxhash.xxh3_128(pte.read_bytes()).hexdigest()
    xkey = f"rel/blobs/{digest}"
    e0 = _etag(s3env, xkey)
    assert e0.endswith("-1"), e0  # one part: the renewal goes by PutObject
    # A killed publish's state: its blob there, no set manifest naming it (renewed next).
    s3env.client.delete_object(Bucket=s3env.bucket, Key=SET)

    ours = S3(s3env.endpoint.url)
    keys: list[str] = []
    rival: list[str] = []

    def before_put(params: dict, **_kw: Any) -> None:
        keys.append(params.get("Key", ""))

    def after_put(**_kw: Any) -> None:
        if keys and keys[-1] == xkey and not rival:  # our renewal's PutObject just landed
            rival.append(_one_part_upload(s3env, xkey, pte.read_bytes()))

    ours.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    ours.client.meta.events.register("after-call.s3.PutObject", after_put)
    report = publish_set({"a": [pte]}, url, client=ours, config=cfg)
    assert rival == [e0], f"the rival's write did not bring the old ETag back: {rival}, {e0}"
    now = _etag(s3env, xkey)
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=SET)["Body"].read())
    named = doc["blobs"][digest]["etag"]
    assert named == now, \
        f"the set names ETag {named} but the blob is {now}: a rival's write taken as ours"
    assert now != e0
    manifest = json.loads(s3env.client.get_object(
        Bucket=s3env.bucket, Key=f"{xkey}.trtet.json")["Body"].read())
    assert manifest["objects"][0]["etag"] == now
    assert report.manifest_etag == _etag(s3env, SET)
    # The stale clean-up's delete, pinned to the old ETag: refused, the blob stays.
    with pytest.raises(PreconditionFailed):
        S3(s3env.endpoint.url).delete(s3env.bucket, xkey, if_match=e0)
    out = tmp_path / "out"
    fetch_set(url, out, "a", endpoint_url=s3env.endpoint.url)
    assert (out / "model.pte").read_bytes() == pte.read_bytes()
