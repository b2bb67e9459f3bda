"""What a shared entry claims to be for (GPU, versions, kind): signed, and checked before its bytes.

A bucket writer (the test, with boto3 on SeaweedFS) edits a signed entry's
``metadata`` so that an engine built for another GPU, or with other
versions, or of another kind, claims to be one this machine takes: the
signature must refuse it (the metadata is part of what is signed). And an
entry this machine will not accept (another GPU, other versions) costs the
pointer, never its files: the bytes through a counting proxy say so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import trtet_store
from trtet_store.io.units import MiB

PREFIX = "engines"
KEY = "trt-00000000000000000000000000000001-no-gpu"


def entry_files(directory: Path, *, capability: str, versions: Any = None,
                size: int = 8 * MiB) -> tuple[list[tuple[str, Path]], dict]:
    """An engine-cache entry's files (``record``, ``e0``) and metadata, as a build's."""
    from trtet_store.export import engine_reuse
    from trtet_store.export.engine_key import ENGINE_KIND, RECORD_KIND

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "e0").write_bytes(os.urandom(size))
    (directory / "record").write_bytes(b"record " + os.urandom(64))
    if versions is None:
        versions = [list(v) for v in engine_reuse.build_versions()]
    record = {"kind": RECORD_KIND, "fingerprint": "f1", "compute_capability": capability,
              "versions": versions, "engines": [{"engine_id": "id1"}]}
    engines = [{"kind": ENGINE_KIND, "engine_id": "id1", "compute_capability": capability}]
    return ([("record", directory / "record"), ("e0", directory / "e0")],
            {"record": record, "engines": engines})


def publish(s3: Any, files: list, metadata: dict, *, signing_key: Any = None) -> None:
    from trtet_store.cache.tier import RemoteTier

    tier = RemoteTier(f"s3://{s3.bucket}/{PREFIX}", endpoint_url=s3.endpoint.url,
                      signing_key=signing_key)
    assert tier.publish(KEY, files, metadata).published


def pointer(s3: Any) -> dict:
    return json.loads(s3.client.get_object(Bucket=s3.bucket,
                                           Key=f"{PREFIX}/{KEY}.json")["Body"].read())


def put_pointer(s3: Any, doc: dict) -> None:
    s3.client.put_object(Bucket=s3.bucket, Key=f"{PREFIX}/{KEY}.json",
                         Body=json.dumps(doc).encode())


@pytest.fixture
def keys(here_fs: Path) -> dict:
    from trtet_store.cache.tier import keygen

    d = here_fs / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    return {"key": d / "team.key", "pub": d / "team.key.pub"}


def _this_machine() -> tuple[str, list]:
    from trtet_store.export import engine_reuse
    from trtet_store.export.engine_cache import compute_capability

    return compute_capability(), [list(v) for v in engine_reuse.build_versions()]


EDITS = {
    # (what the signer built it as, what the bucket writer makes it claim)
    "gpu": (lambda m: m["record"].update(compute_capability="sm_80"),
            lambda m, cap, _v: (m["record"].update(compute_capability=cap),
                                [e.update(compute_capability=cap) for e in m["engines"]])),
    "versions": (lambda m: m["record"].update(versions=[["tensorrt", "1.0"]]),
                 lambda m, _c, versions: m["record"].update(versions=versions)),
    "kind": (lambda m: m["record"].update(kind="trtet_store.tensorrt.structure"),
             lambda m, _c, _v: m["record"].update(kind="trtet_store.tensorrt.build")),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_signed_entry_whose_metadata_a_bucket_writer_changed_is_refused(
        edit, here_fs, s3env, keys):
    from trtet_store.cache.tier import TierSignatureError

    built_as, claim = EDITS[edit]
    capability, versions = _this_machine()
    files, metadata = entry_files(here_fs / "src", capability=capability, size=MiB)
    built_as(metadata)
    publish(s3env, files, metadata, signing_key=keys["key"])
    reader = trtet_store.EngineCache(here_fs / "reader", max_bytes=1 << 30, min_free=0,
                                     remote=f"s3://{s3env.bucket}/{PREFIX}",
                                     endpoint_url=s3env.endpoint.url,
                                     trusted_keys=[keys["pub"]])
    # As signed, this machine does not take it (what it was built as is not ours) ...
    with pytest.raises(ValueError, match="cannot be used here"):
        reader.pull([KEY])
    # ... and once the bucket writer makes it claim to be ours, the signature refuses it.
    doc = pointer(s3env)
    claim(doc["metadata"], capability, versions)
    put_pointer(s3env, doc)
    assert reader._accept(reader.tiered.lookup(KEY)) is None  # the claim alone would pass
    with pytest.raises(TierSignatureError, match="does not verify"):
        reader.pull([KEY])
    got = reader.tiered.get(KEY)
    assert got.hit is None and got.download is None
    assert got.outcome.reason.startswith("refused: ") and "does not verify" in \
        got.outcome.reason, got.outcome
    assert reader.entries() == []  # nothing of it entered the cache


@pytest.mark.parametrize("edit", ["gpu", "versions"])
def test_an_entry_not_accepted_here_costs_its_pointer_not_its_files(edit, here_fs, s3env,
                                                                    proxy):
    capability, _ = _this_machine()
    size = 8 * MiB
    files, metadata = entry_files(here_fs / "src", capability=capability, size=size)
    EDITS[edit][0](metadata)
    publish(s3env, files, metadata)
    cache = trtet_store.EngineCache(here_fs / "reader", max_bytes=1 << 30, min_free=0,
                                    remote=f"s3://{s3env.bucket}/{PREFIX}",
                                    endpoint_url=proxy.endpoint_url)
    proxy.reset()
    got = cache.tiered.get(KEY)
    assert got.hit is None and got.download is None and got.outcome.action == "miss"
    assert got.outcome.reason is not None and got.outcome.reason != "not in the shared cache"
    received = proxy.downstream
    assert received < 64 * 1024, f"{received} bytes received for a refused entry of {size}"
    with pytest.raises(ValueError, match="cannot be used here"):
        cache.pull([KEY])
    assert proxy.downstream - received < 64 * 1024
    assert not (cache.directory / "downloads" / KEY).exists() or \
        not any((cache.directory / "downloads" / KEY).iterdir())
    assert cache.entries() == []
