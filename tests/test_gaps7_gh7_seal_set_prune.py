"""publish_set's prune (trtet_store/sets/publish.py ``_prune`` and ``_blob_first``, through
trtet_store.remote.sweep's plan_sweep): what goes, judged on the server's clock.

- ages are the server's: LastModified against our committed set manifest's, so a
  machine whose clock runs two days ahead still keeps a blob another publisher
  uploaded a moment ago (gc_grace is an hour);
- a stray blob with no manifest of its own (a publisher killed before writing
  it) goes, and so does a blob manifest left without its object;
- an object under ``blobs/`` not named by a digest (``README``, ``notes.trtet.json``)
  is no blob, and stays;
- a stray blob whose manifest names another version of it (a renewal under way:
  ``_names`` is not the listed ETag) stays, object and manifest alike.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sets_helpers import write

from trtet_store.remote import sweep as sweep_module
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def _first_set(s3env: Any, tmp_path: Path) -> tuple[str, PublishConfig, list[Path], str]:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    kept = [write(tmp_path / "k" / "model.pte", 5000, 1)]
    publish_set({"k": kept}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    first = next(k for k in _state(s3env, "rel/blobs/") if not k.endswith(".json"))
    return url, cfg, kept, first


def test_prune_ages_are_the_servers_not_this_machines_clock(
        s3env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    url, cfg, kept, _ = _first_set(s3env, tmp_path)
    stray = f"rel/blobs/{'a' * 32}"  # another publisher's upload, a moment ago
    s3env.client.put_object(Bucket=s3env.bucket, Key=stray, Body=b"not committed yet")
    before = _state(s3env, "rel/blobs/")
    # This machine's clock, as the sweep would read it, two days ahead of the server's.
    real = time.time
    monkeypatch.setattr(sweep_module, "time", SimpleNamespace(time=lambda: real() + 2 * 86400))
    report = publish_set({"k": kept}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=3600)
    assert report.pruned == []
    assert {k: v for k, v in _state(s3env, "rel/blobs/").items() if k in before} == before


def test_a_stray_blob_without_its_manifest_and_a_manifest_without_its_blob_go(
        s3env: Any, tmp_path: Path) -> None:
    url, cfg, kept, first = _first_set(s3env, tmp_path)
    body = s3env.client.get_object(Bucket=s3env.bucket, Key=first)["Body"].read()
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=f"{first}.trtet.json")["Body"].read())
    lone, orphan_manifest, renewing = (f"rel/blobs/{d * 32}" for d in "bcd")
    s3env.client.put_object(Bucket=s3env.bucket, Key=lone, Body=body)  # no manifest
    doc_c = dict(doc, program="c" * 32)
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{orphan_manifest}.trtet.json",
                            Body=json.dumps(doc_c).encode())  # no object
    s3env.client.put_object(Bucket=s3env.bucket, Key=renewing, Body=body)
    doc_d = json.loads(json.dumps(doc))
    doc_d["program"] = "d" * 32
    doc_d["objects"][0].update(key=renewing, name="d" * 32, etag="0" * 32 + "-2")  # another
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{renewing}.trtet.json",
                            Body=json.dumps(doc_d).encode())
    foreign = ["rel/blobs/README", "rel/blobs/notes.trtet.json"]  # not named by a digest
    for k in foreign:
        s3env.client.put_object(Bucket=s3env.bucket, Key=k, Body=b"someone else's")
    before = _state(s3env, "rel/blobs/")
    time.sleep(2.1)  # all older than the grace, by the server's clock
    report = publish_set({"k": kept}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=1)
    after = _state(s3env, "rel/blobs/")
    assert report.pruned == ["b" * 32]
    assert lone not in after and f"{orphan_manifest}.trtet.json" not in after
    # The renewal under way: its manifest names a version other than the one listed.
    assert after[renewing] == before[renewing]
    assert after[f"{renewing}.trtet.json"] == before[f"{renewing}.trtet.json"]
    assert after[first] == before[first] and f"{first}.trtet.json" in after  # named
    assert {k: after[k] for k in foreign} == {k: before[k] for k in foreign}  # not blobs
    assert set(after) == {first, f"{first}.trtet.json", renewing, f"{renewing}.trtet.json",
                          *foreign}
