"""An attempt's removal (``TierBucket.remove_attempt``, trtet_store.cache.tier.bucket) leaves
nothing of it: its objects and its incomplete multipart uploads, which are billed too.

A killed publish leaves an upload begun and never completed under its attempt directory;
no listing of objects shows it. The bucket writer (boto3 on SeaweedFS) begins one there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier.bucket import POINTER_SUFFIX, TierBucket

KEY = "b" * 32


def test_remove_attempt_aborts_the_attempts_incomplete_uploads(s3env: Any,
                                                                tmp_path: Path) -> None:
    tier = RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "j")
    src = tmp_path / "e0"
    src.write_bytes(b"engine" * 5000)
    assert tier.publish(KEY, [("e0", src)], {"gpu": "sm_90"}).published
    entry = tier.lookup(KEY)
    assert entry is not None
    where = tier.where
    assert isinstance(where, TierBucket)
    assert where.pointer_key(KEY) == f"{tier.prefix}{KEY}{POINTER_SUFFIX}"
    adir = f"{tier.prefix}{entry.attempt}"
    c, b = s3env.client, s3env.bucket
    # A killed publish's upload, begun under the attempt and never completed; and one of
    # another attempt, which is not this removal's.
    mine = c.create_multipart_upload(Bucket=b, Key=f"{adir}/late.bin")["UploadId"]
    c.upload_part(Bucket=b, Key=f"{adir}/late.bin", UploadId=mine, PartNumber=1, Body=b"x" * 1000)
    other_dir = f"{tier.prefix}{KEY}/other-attempt"
    other = c.create_multipart_upload(Bucket=b, Key=f"{other_dir}/x.bin")["UploadId"]

    where.remove_attempt(adir)

    left = c.list_objects_v2(Bucket=b, Prefix=adir).get("Contents", [])
    assert left == [], [o["Key"] for o in left]
    uploads = c.list_multipart_uploads(Bucket=b, Prefix=adir).get("Uploads", [])
    assert uploads == [], [(u["Key"], u["UploadId"]) for u in uploads]
    theirs = c.list_multipart_uploads(Bucket=b, Prefix=other_dir).get("Uploads", [])
    assert [u["UploadId"] for u in theirs] == [other]
