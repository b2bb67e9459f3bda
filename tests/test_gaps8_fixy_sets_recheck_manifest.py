"""publish_set's check after its commit (``_recheck`` in sets/publish.py): a blob found present
whose blob manifest is gone by then is sent again.

The second publish finds member a's blob present (``blobs_present``: named by
the version it replaces) and commits. Right before its check, another
publisher's clean-up (a bucket writer: boto3 on SeaweedFS) removes that blob's
manifest, the object itself left, same size and CRC64NVME. The check must not
take the blob as there on its HEAD alone: without its manifest no reader can
fetch it. After publish_set returns, the blob manifest is back and both
members fetch whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write, xxh

import trtet_store.sets.publish as publish_mod
from trtet_store.remote.manifest import manifest_key
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.manifest import blob_key


def test_a_present_blob_whose_manifest_went_before_the_recheck_is_sent_again(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    x = write(tmp_path / "a" / "model.pte", 7000, 1)
    y = write(tmp_path / "b" / "model.pte", 7001, 2)
    publish_set({"a": [x]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    mkey = manifest_key(blob_key("rel/", xxh(x)))
    assert s3env.client.head_object(Bucket=s3env.bucket, Key=mkey)

    real = publish_mod._recheck
    removed: list[str] = []

    def manifest_gone_first(*args: Any, **kwargs: Any) -> None:
        s3env.client.delete_object(Bucket=s3env.bucket, Key=mkey)  # a rival's clean-up
        removed.append(mkey)
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_mod, "_recheck", manifest_gone_first)
    report = publish_set({"a": [x], "b": [y]}, url, endpoint_url=s3env.endpoint.url,
                         config=cfg, if_exists="replace")
    assert removed == [mkey] and xxh(x) in report.blobs_present
    listed = {o["Key"] for o in s3env.client.list_objects_v2(
        Bucket=s3env.bucket, Prefix="rel/blobs/").get("Contents", [])}
    assert mkey in listed, "the blob found present was taken as there without its manifest"
    (tmp_path / "out").mkdir()
    for name, src in (("a", x), ("b", y)):
        out = tmp_path / "out" / name
        fetch_set(url, out, name, endpoint_url=s3env.endpoint.url)
        assert (out / "model.pte").read_bytes() == src.read_bytes()
