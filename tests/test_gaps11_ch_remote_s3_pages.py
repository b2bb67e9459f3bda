"""remote/s3.py: list_keys, list_dated, list_etags and list_parts read every page.

Every caller that deletes by a listing depends on it being whole: owners_of (a publish's
"another program's manifest names it": a manifest on page 2 missed is an object of
another program removed), the sweeps and prunes (list_etags / list_dated), a resumed
upload's parts (list_parts). SeaweedFS pages at 1000 keys; here the page is made small
on the real server by the client's own parameter hook (MaxKeys / MaxParts = 2), so a
listing of 5 keys (or 3 parts) takes several pages, and each function must return them
all, asking page after page (ContinuationToken / PartNumberMarker).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_fetch_support import b64crc

from trtet_store.remote.s3 import S3

MiB = 1 << 20


def _small_pages(client: Any) -> list[dict]:
    """Every ListObjectsV2/ListParts sent, with its page size forced to 2."""
    sent: list[dict] = []

    def shrink(params: dict, model: Any, **_: Any) -> None:
        if model.name == "ListObjectsV2":
            params["MaxKeys"] = 2
        elif model.name == "ListParts":
            params["MaxParts"] = 2
        else:
            return
        sent.append(dict(params))

    client.meta.events.register("before-parameter-build.s3.*", shrink)
    return sent


@pytest.fixture
def five(s3: Any) -> tuple[Any, S3, list[dict], list[str]]:
    keys = [f"p/k{i}.bin" for i in range(5)]
    for k in keys:
        s3.client.put_object(Bucket=s3.bucket, Key=k, Body=k.encode())
    s3.client.put_object(Bucket=s3.bucket, Key="p/deeper/x.bin", Body=b"x")
    sent = _small_pages(s3.client)
    return s3, S3(client=s3.client), sent, keys


def test_s3_list_keys_reads_every_page(five) -> None:
    s3, client, sent, keys = five
    assert sorted(client.list_keys(s3.bucket, "p/")) == keys  # not below the delimiter
    assert len(sent) >= 3 and any("ContinuationToken" in p for p in sent)


def test_s3_list_dated_reads_every_page(five) -> None:
    s3, client, sent, keys = five
    got = client.list_dated(s3.bucket, "p/")
    assert sorted(k for k, _, _ in got) == sorted([*keys, "p/deeper/x.bin"])
    assert {k: size for k, size, _ in got}["p/k3.bin"] == len(b"p/k3.bin")
    assert len(sent) >= 3


def test_s3_list_etags_reads_every_page(five) -> None:
    s3, client, sent, keys = five
    got = client.list_etags(s3.bucket, "p/")
    assert sorted(k for k, _, _ in got) == sorted([*keys, "p/deeper/x.bin"])
    for k, _, etag in got:
        assert etag == s3.client.head_object(Bucket=s3.bucket, Key=k)["ETag"].strip('"')
    assert len(sent) >= 3


def test_s3_list_parts_reads_every_page(s3: Any) -> None:
    client = S3(client=s3.client)
    upload = client.create(s3.bucket, "mp/big.bin")
    try:
        sent = _small_pages(s3.client)
        sizes = {1: 5 * MiB, 2: 5 * MiB, 3: 5 * MiB, 4: 1}
        etags = {n: client.upload_part(s3.bucket, "mp/big.bin", upload, n, bytes([n]) * size,
                                       b64crc(bytes([n]) * size)) for n, size in sizes.items()}
        got = client.list_parts(s3.bucket, "mp/big.bin", upload)
        assert got == {n: (etags[n], sizes[n]) for n in sizes}
        assert len(sent) >= 2
    finally:
        s3.client.abort_multipart_upload(Bucket=s3.bucket, Key="mp/big.bin", UploadId=upload)
