"""A shared tier uses the client it was given for every call, the upload's too (issue 45 item 14).

The client carries the test server's keys explicitly; boto3's default chain
(the environment) names keys the server refuses, so any call made through a
client of boto3's own finding is denied. Publish, lookup, download and list
must all succeed, and nothing is left open.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from trtet_store.cache.tier import RemoteTier
from trtet_store.io.units import MiB


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_every_call_of_a_tier_goes_through_its_client(s3: Any, monkeypatch: Any,
                                                      tmp_path: Path) -> None:
    # boto3's default chain: keys this server refuses (a config file cannot rescue them).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "WRONGKEYWRONGKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3.endpoint.region)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    # Multipart: the record is over the 8 MiB default part size, so parts and a Complete go up.
    src = tmp_path / "src"
    src.mkdir()
    files = []
    for name, size in (("record", 9 * MiB + 5), ("e0", 1000)):
        (src / name).write_bytes((hashlib.sha256(name.encode()).digest() * (size // 32 + 1))
                                 [:size])
        files.append((name, src / name))

    tier = RemoteTier(f"s3://{s3.bucket}/cache", client=s3.endpoint.client(), origin="a",
                      journal_dir=tmp_path / "journal")
    pub = tier.publish("k1", files, {"kind": "test"})
    assert (pub.published, pub.reason) == (True, None)
    assert pub.sent == sum(p.stat().st_size for _, p in files)

    other = RemoteTier(f"s3://{s3.bucket}/cache", client=s3.endpoint.client(), origin="b")
    entry = other.lookup("k1")
    assert entry is not None and entry.etag == pub.entry.etag
    got = other.download(entry, tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}
    assert [e.key for e in other.entries()] == ["k1"]
    assert s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []
