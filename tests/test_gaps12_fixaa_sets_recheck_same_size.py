"""publish_set's check after its commit (``_recheck`` in sets/publish.py): a blob rewritten
with other bytes of the same size is sent again, not taken as there by its size.

Right after the set manifest's PutObject is applied (the commit), another
client (a bucket writer: boto3 on SeaweedFS) rewrites one of the blobs the
set names with other bytes of exactly its size (its own CRC64NVME sent with
them, as any current client does), its blob manifest left as it was. The
check must compare the CRC64NVME HeadObject returns, not the size alone: the
blob is sent again, and after publish_set returns every member fetches whole
(a set naming the rewritten bytes would fail every fetch's verification).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import xxhash
from sets_helpers import write

from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import SET_KEY, fetch_set, publish_set

SET = f"rel/{SET_KEY}"


def test_a_same_size_rewritten_blob_after_the_commit_is_sent_again(s3env: Any,
                                                                  tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    a = write(tmp_path / "src" / "a" / "model.pte", 70_000, 1)
    b = write(tmp_path / "src" / "b" / "model.pte", 70_001, 2)
    akey = f"rel/blobs/{xxhash.xxh3_128(a.read_bytes()).hexdigest()}"
    other = random.Random(9).randbytes(a.stat().st_size)  # same size, other bytes
    crc = crc64nvme_b64(crc64nvme(other))

    ours = S3(s3env.endpoint.url)
    keys: list[str] = []
    rewritten: list[str] = []

    def before_put(params: dict, **_kw: Any) -> None:
        keys.append(params.get("Key", ""))

    def after_put(**_kw: Any) -> None:
        if keys and keys[-1] == SET and not rewritten:  # our commit was just applied
            s3env.client.put_object(Bucket=s3env.bucket, Key=akey, Body=other,
                                    ChecksumCRC64NVME=crc)
            rewritten.append(akey)

    ours.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    ours.client.meta.events.register("after-call.s3.PutObject", after_put)
    publish_set({"a": [a], "b": [b]}, url, client=ours, config=cfg)
    assert rewritten == [akey], keys
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=akey)["Body"].read()
    assert body == a.read_bytes(), \
        "a blob rewritten with other bytes of its size was taken as there (not sent again)"
    for name, src in (("a", a), ("b", b)):
        out = tmp_path / "out" / name
        out.parent.mkdir(exist_ok=True)
        fetch_set(url, out, name, endpoint_url=s3env.endpoint.url)
        assert (out / "model.pte").read_bytes() == src.read_bytes()
