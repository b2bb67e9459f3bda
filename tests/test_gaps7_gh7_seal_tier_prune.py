"""cache/tier/prune.py (RemoteTier.prune): an orphan attempt (objects no pointer names) is
judged by its newest activity, an open multipart upload into it included: one whose upload
started just now is another publisher's attempt in progress and stays, objects and upload;
an old one with nothing open goes."""

from __future__ import annotations

import time
from typing import Any

from test_sweep import FixedClock

from trtet_store.cache.tier import RemoteTier
from trtet_store.remote.s3 import S3


def test_prune_keeps_an_old_attempt_with_a_young_open_upload(s3env: Any) -> None:
    c, bucket = s3env.client, s3env.bucket
    busy, idle = "cache/lost/b-00000000000000aa/", "cache/gone/c-00000000000000bb/"
    for adir in (busy, idle):
        c.put_object(Bucket=bucket, Key=f"{adir}record", Body=b"an old attempt's object")
    time.sleep(2.1)  # both attempts' objects older than the 2 s asked for
    up = c.create_multipart_upload(Bucket=bucket, Key=f"{busy}engine")["UploadId"]
    try:
        tier = RemoteTier(f"s3://{bucket}/cache", endpoint_url=s3env.endpoint.url, origin="a",
                          journal_dir=s3env.journal_dir)
        # "Now" is one second after the upload started, however long a loaded machine
        # takes to get here: the objects are over 3 s old then, the open upload 1 s.
        (started,) = [u.initiated.timestamp() for u in S3(client=c).list_uploads(bucket, "cache/")]
        tier.clock = FixedClock(started + 1.0)
        assert tier.prune(2.0) == ["gone/c-00000000000000bb/"]
        keys = [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert keys == [f"{busy}record"]
        assert [u.key for u in S3(client=c).list_uploads(bucket, "cache/")] == [f"{busy}engine"]
    finally:
        c.abort_multipart_upload(Bucket=bucket, Key=f"{busy}engine", UploadId=up)
