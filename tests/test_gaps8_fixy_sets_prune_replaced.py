"""publish_set's prune (``_prune(`` in sets/publish.py) once a newer publish replaced the set.

Our commit is done; right before our prune, a rival publisher replaces the
set (a real second ``publish_set`` run at that exact step through a shim on
``_prune``). Our prune, with ``gc_grace=0``, must see that the set manifest is
not ours any more (its ETag is the rival's) and prune nothing: the newer
publish prunes. Pruned by our view, the rival's blobs (named by the set
readers now follow, uploaded before its commit, so "older" than it) would go.
The bucket's blobs are unchanged by our prune, ``report.pruned`` is empty and
the rival's set fetches whole.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

import trtet_store.sets.publish as publish_mod
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def test_no_prune_once_a_newer_publish_replaced_the_set(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    v1 = write(tmp_path / "v1" / "model.pte", 6000, 1)
    v2 = write(tmp_path / "v2" / "model.pte", 6001, 2)
    rival = write(tmp_path / "v3" / "model.pte", 6002, 3)
    publish_set({"a": [v1]}, url, endpoint_url=s3env.endpoint.url, config=cfg)

    real = publish_mod._prune
    seen: dict[str, Any] = {}

    def rival_first(*args: Any, **kwargs: Any) -> list[str]:
        if "rival" not in seen:  # our prune: the rival replaces the set right before it
            seen["rival"] = None  # the rival's own prune runs as it is
            seen["rival"] = publish_set({"a": [rival]}, url, endpoint_url=s3env.endpoint.url,
                                        config=cfg, if_exists="replace")
            seen["after"] = _state(s3env, "rel/")
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_mod, "_prune", rival_first)
    report = publish_set({"a": [v2]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=0)
    assert report.pruned == [], f"pruned {report.pruned} though the set was replaced"
    assert _state(s3env, "rel/") == seen["after"], "our prune changed the rival's bucket"
    monkeypatch.setattr(publish_mod, "_prune", real)
    out = tmp_path / "out"
    fetch_set(url, out, "a", endpoint_url=s3env.endpoint.url)
    assert (out / "model.pte").read_bytes() == rival.read_bytes()
