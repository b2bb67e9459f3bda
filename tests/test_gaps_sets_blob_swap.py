"""A bucket writer replaces a blob with other bytes of its own, consistent everywhere but its name.

The set names each blob by the xxh3-128 of its bytes. A bucket writer (with
the library, on SeaweedFS) publishes other bytes of the same size at
``blobs/<the blob's hex>``, with a blob manifest that matches them (parts,
CRC64NVME, chunk digests), and rewrites the unsigned set manifest's ETag,
CRC64NVME and chunk digests for it. Every check on the way (HEAD's size and
CRC, each range's chunk digests, the whole CRC) passes; only the last one,
the downloaded bytes' xxh3-128 against the name, can refuse them. Nothing
is placed or kept: the destination untouched, the store without the blob.
Also a set manifest that is not JSON and a set that is not there, on the
signed path (``trusted_keys``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from attacker import tree
from sets_helpers import write, xxh

from trtet_store.io import digest_file
from trtet_store.remote.errors import FetchVerificationError, ManifestError, ObjectNotFoundError
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.remote.upload.send import publish_blob
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.url import RemoteURL
from trtet_store.sets import fetch_set, publish_set

MiB = 1 << 20
SET = "llm/v3/trtet-set.json"


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    s3env.url = f"s3://{s3env.bucket}/llm/v3/"
    return s3env


def _doc(env: Any) -> dict:
    return json.loads(env.client.get_object(Bucket=env.bucket, Key=SET)["Body"].read())


def test_a_blob_replaced_by_consistent_other_bytes_is_refused_by_its_name(
        env: Any, tmp_path: Path) -> None:
    pte = write(tmp_path / "src" / "model.pte", MiB + 5, 1)
    ptd = write(tmp_path / "src" / "foundation.ptd", 2 * MiB + 11, 7)
    publish_set({"a": [pte, ptd]}, env.url, endpoint_url=env.endpoint.url,
                config=PublishConfig(journal_dir=env.journal_dir))
    hexd = xxh(ptd)
    evil = write(tmp_path / "evil.ptd", ptd.stat().st_size, 666).read_bytes()
    # The bucket writer: its bytes at the blob's key, with a blob manifest of their own.
    rep = publish_blob(ObjectSource(hexd, [evil]), RemoteURL(env.bucket, f"llm/v3/blobs/{hexd}"),
                       config=PublishConfig(journal_dir=tmp_path / "j2"), resume=False,
                       client=S3(env.endpoint.url), renew=True)
    blob_manifest = json.loads(env.client.get_object(
        Bucket=env.bucket, Key=f"llm/v3/blobs/{hexd}.trtet.json")["Body"].read())
    obj = blob_manifest["objects"][0]
    doc = _doc(env)
    doc["blobs"][hexd].update(etag=obj["etag"], crc64nvme=rep.checksum)
    for f in doc["members"]["a"]["files"]:
        if f["blob"] == hexd:
            f.update(crc64nvme=rep.checksum, chunks=list(digest_file(
                tmp_path / "evil.ptd", doc["chunk_size"], False)[1]))
    env.client.put_object(Bucket=env.bucket, Key=SET, Body=json.dumps(doc).encode())

    dest = tmp_path / "out" / "m"
    dest.parent.mkdir()
    before = tree(tmp_path / "out")
    with pytest.raises(FetchVerificationError) as caught:
        fetch_set(env.url, dest, "a", endpoint_url=env.endpoint.url,
                  store=tmp_path / "store")
    said = str(caught.value)
    assert said.endswith(f"its bytes' xxh3-128 is {xxh(tmp_path / 'evil.ptd')}, not the "
                         f"{hexd} the set names; refused, nothing kept"), said
    assert not (tmp_path / "store" / hexd).exists()
    assert not (tmp_path / "store" / ".trtet-seals" / hexd).exists()
    assert not any((dest / n).exists() for n in ("model.pte", "foundation.ptd")), \
        sorted(os.listdir(dest)) if dest.exists() else None
    after = tree(tmp_path / "out")
    assert {k: v for k, v in after.items() if "foundation" in k or "model" in k} == \
        {k: v for k, v in before.items() if "foundation" in k or "model" in k}


def test_a_signed_fetch_of_no_set_or_of_a_set_that_is_not_json(env: Any, tmp_path: Path) -> None:
    from trtet_store.remote.keys import keygen

    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    dest = tmp_path / "out"
    with pytest.raises(ObjectNotFoundError) as caught:
        fetch_set(env.url, dest, "a", endpoint_url=env.endpoint.url,
                  trusted_keys=[d / "team.key.pub"])
    # The whole message is the one line (not an errno tuple: "[Errno no set at ...] key").
    assert str(caught.value).startswith(f"no set at s3://{env.bucket}/llm/v3/ (no trtet-set.json)")
    env.client.put_object(Bucket=env.bucket, Key=SET, Body=b'{"format": "trtet-store-set", ')
    with pytest.raises(ManifestError, match="set manifest is not JSON"):
        fetch_set(env.url, dest, "a", endpoint_url=env.endpoint.url,
                  trusted_keys=[d / "team.key.pub"])
    assert not dest.exists() and not (tmp_path / ".trtet-blobs").exists()
