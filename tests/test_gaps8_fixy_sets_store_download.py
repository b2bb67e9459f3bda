"""ContentStore.download (sets/store.py) against a blob that is not the set's (issue 55).

- A bucket writer (another boto3 client on SeaweedFS) rewrites a set's blob
  with other bytes of the SAME size: the HEAD's CRC64NVME is not the set
  manifest's, so the download is refused before a byte is asked for ("the
  server holds ..."): no GetObject is sent (counted by the client's own event
  hooks), nothing kept in the store.
- A resumed download (a first one interrupted after one range was staged and
  journaled) is still checked whole against the xxh3-128 the set names: a set
  naming another digest for the blob gets FetchVerificationError, "nothing
  kept", and no file at the store's name, though every range checked against
  the blob manifest's chunk digests and the CRC64NVME matched.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

import trtet_store
import trtet_store.remote.download.staging as staging
from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.download.options import FetchConfig
from trtet_store.remote.errors import FetchVerificationError
from trtet_store.remote.manifest import crc64nvme_b64, manifest_key
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set
from trtet_store.sets.fetch import read_set
from trtet_store.sets.manifest import blob_key
from trtet_store.sets.store import ContentStore

CFG = FetchConfig(concurrency=1, range_size=1 << 20)


def published(s3env: Any, tmp_path: Path, size: int) -> tuple[S3, str, Any, Path]:
    src = write(tmp_path / "src" / "a" / "model.pte", size, 21)
    publish_set({"a": [src]}, f"s3://{s3env.bucket}/rel/", endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    s3 = S3(client=s3env.client)
    manifest, _ = read_set(s3, s3env.bucket, "rel/")
    [(digest, blob)] = manifest.blobs.items()
    return s3, digest, blob, src


def test_a_same_size_rewritten_blob_is_refused_by_its_head_before_a_byte(
        s3env: Any, tmp_path: Path) -> None:
    """The server holds other bytes of the same size: refused on HEAD, no GET at all."""
    s3, digest, blob, _src = published(s3env, tmp_path, 300_000)
    key = blob_key("rel/", digest)
    # A bucket writer publishes other bytes of the same size at the blob's key, with their own
    # (consistent) blob manifest: only the HEAD's CRC64NVME tells them from the set's.
    other = tmp_path / "other" / digest
    other.parent.mkdir()
    other.write_bytes(random.Random(99).randbytes(blob.size))
    trtet_store.publish([os.fspath(other)], f"s3://{s3env.bucket}/{key}",
                        endpoint_url=s3env.endpoint.url, journal_dir=tmp_path / "j2",
                        if_exists="replace", resume=False)
    head = s3.head(s3env.bucket, key)
    assert head is not None and head.size == blob.size
    assert head.crc64nvme is not None and head.crc64nvme != blob.crc64nvme

    gets: list[str] = []
    s3env.client.meta.events.register(
        "before-parameter-build.s3.GetObject",
        lambda params, **_kw: gets.append(f"{params['Key']} {params.get('Range', 'whole')}"))
    cas = ContentStore(tmp_path / "store")
    with pytest.raises(FetchVerificationError) as err:
        cas.download(s3, s3env.bucket, key, digest, blob.size, blob.crc64nvme, config=CFG)
    assert gets == [], f"the same-size rewritten blob was asked for: {gets}"
    assert "the server holds" in str(err.value), err.value
    assert not cas.path(digest).exists() and not cas.holds(digest, blob.size)
    assert [n for n in os.listdir(cas.root) if not n.startswith(".")] == []


def forge(s3env: Any, digest: str, named: str, data: bytes) -> str:
    """A bucket writer's consistent forgery: the blob's bytes at blob ``named``'s key, with a
    blob manifest naming them ``named`` (every chunk digest, size and CRC64NVME the real ones)."""
    key = blob_key("rel/", named)
    c = s3env.client
    put = c.put_object(Bucket=s3env.bucket, Key=key, Body=data,
                       ChecksumCRC64NVME=crc64nvme_b64(crc64nvme(data)))
    etag = put["ETag"].strip('"')
    doc = json.loads(c.get_object(Bucket=s3env.bucket,
                                  Key=manifest_key(blob_key("rel/", digest)))["Body"].read())
    doc["program"] = named
    [obj] = doc["objects"]
    obj.update(key=key, name=named, etag=etag)
    for part in obj["parts"]:
        part["etag"] = etag
    for piece in obj["pieces"]:
        piece["xxh3"] = named
    c.put_object(Bucket=s3env.bucket, Key=manifest_key(key), Body=json.dumps(doc).encode())
    return key


class Interrupt(BaseException):
    """Raised in the first download once one range was staged and journaled."""


def test_a_resumed_download_is_checked_whole_against_the_set_s_xxh3(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set naming another xxh3-128 for a blob: a resumed download is refused, nothing kept."""
    s3, digest, blob, src = published(s3env, tmp_path, 3 * (1 << 20) + 7)
    named = "0" * 32 if digest != "0" * 32 else "1" * 32  # what the (wrong) set names
    key = forge(s3env, digest, named, src.read_bytes())
    cas = ContentStore(tmp_path / "store")

    record = staging.Staging.record
    seen: list[Any] = []

    def interrupting(self: Any, rng: Any, crc: int) -> None:
        record(self, rng, crc)
        seen.append(rng)
        raise Interrupt

    monkeypatch.setattr(staging.Staging, "record", interrupting)
    with pytest.raises(BaseException) as first:  # noqa: PT011
        cas.download(s3, s3env.bucket, key, named, blob.size, blob.crc64nvme, config=CFG)
    assert seen, f"no range was staged before the interruption: {first.value!r}"
    monkeypatch.setattr(staging.Staging, "record", record)

    with pytest.raises(FetchVerificationError) as err:
        cas.download(s3, s3env.bucket, key, named, blob.size, blob.crc64nvme, config=CFG)
    assert "nothing kept" in str(err.value) and digest in str(err.value), err.value
    assert not cas.path(named).exists(), "a blob not the set's digest was kept under its name"
    assert not cas.sealed(named) and not cas.holds(named, blob.size)
