"""publish_set's conditional writes under a rival (sets/publish.py), against SeaweedFS.

- ``_put_small`` (a blob of one part renewed by PutObject, ``_renew`` when
  ``_layout_avoiding`` finds no other part count): the PutObject is If-Match the version it
  read. A rival's clean-up that removes the blob and its manifest at the ETag it listed,
  between our HEAD and our PutObject, fails that write; the renewal is tried again and the
  set commits, its blob and blob manifest naming one version.
- ``_send_blobs``: a blob the replaced version lists in ``removing`` is renewed with an
  ETag other than the one listed there, even when it is absent (``_present`` finds
  nothing): a clean-up's delete pinned to that ETag (a retried request landing late) is
  refused and the new set keeps its blob.
- ``_commit`` reads the set manifest back: a rival's put landing right after ours (a server
  that checks the condition apart from the write) is ConflictError ("another publisher"),
  theirs stays, and nothing of theirs is removed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import xxhash
from sets_helpers import write

from trtet_store.remote import ConflictError
from trtet_store.remote.s3 import S3, PreconditionFailed
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import SET_KEY, fetch_set, publish_set

SMALL = 4096 + 17  # a blob of one part
SET = f"rel/{SET_KEY}"


def _etag(s3env: Any, key: str) -> str:
    return s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"].strip('"')


def _get(s3env: Any, key: str) -> bytes:
    return s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read()


def _keys(s3env: Any) -> set[str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="rel/")
    return {o["Key"] for o in listed.get("Contents", [])}


def _fetched(s3env: Any, url: str, dest: Path, member: str = "a") -> dict[str, bytes]:
    fetch_set(url, dest, member, endpoint_url=s3env.endpoint.url)
    return {p.name: p.read_bytes() for p in dest.iterdir() if not p.name.startswith(".")}


def test_a_clean_up_between_our_head_and_our_put_small_fails_it_and_is_retried(
        s3env: Any, tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", SMALL, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    xkey = f"rel/blobs/{xxhash.xxh3_128(pte.read_bytes()).hexdigest()}"
    e0 = _etag(s3env, xkey)
    assert e0.endswith("-1"), e0  # a one-part upload: the renewal goes by PutObject
    # A killed publish's state: its blob there, no set manifest naming it.
    s3env.client.delete_object(Bucket=s3env.bucket, Key=SET)

    ours = S3(s3env.endpoint.url)
    puts: list[str] = []

    def before_put(params: dict, **_kw: Any) -> None:
        if params.get("Key") == xkey:
            puts.append(params.get("IfMatch") or params.get("IfNoneMatch") or "-")
            if len(puts) == 1:  # a rival's clean-up (it listed e0) lands right now
                for key in (xkey, f"{xkey}.trtet.json"):
                    s3env.client.delete_object(Bucket=s3env.bucket, Key=key)

    ours.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    report = publish_set({"a": [pte]}, url, client=ours, config=cfg)
    assert puts, "the renewal never reached _put_small's PutObject"
    now = _etag(s3env, xkey)
    doc = json.loads(_get(s3env, SET))
    blob_manifest = json.loads(_get(s3env, f"{xkey}.trtet.json"))
    assert blob_manifest["objects"][0]["etag"] == now == doc["blobs"][xkey[10:]]["etag"], \
        (puts, now, blob_manifest["objects"][0]["etag"])
    assert report.manifest_etag == _etag(s3env, SET)
    assert _fetched(s3env, url, tmp_path / "out") == {"model.pte": pte.read_bytes()}


def test_a_blob_listed_in_removing_is_renewed_even_when_absent(s3env: Any,
                                                               tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", SMALL, 1)
    x = write(tmp_path / "src" / "extra.ptd", SMALL + 9, 2)
    publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    xname = xxhash.xxh3_128(x.read_bytes()).hexdigest()
    xkey = f"rel/blobs/{xname}"
    e0 = _etag(s3env, xkey)
    # v2 drops X: its clean-up removed X (at e0), its manifest lists X in removing.
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                if_exists="replace")
    assert json.loads(_get(s3env, SET))["removing"] == {xname: e0}
    assert xkey not in _keys(s3env)

    # v3 names X again: sent anew, in a version whose ETag is not e0.
    publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                if_exists="replace")
    assert _etag(s3env, xkey) != e0, "X came back at the ETag v2's removing lists"
    # v2's clean-up delete, retried and landing late, is pinned to e0: refused.
    with pytest.raises(PreconditionFailed):
        S3(s3env.endpoint.url).delete(s3env.bucket, xkey, if_match=e0)
    assert _fetched(s3env, url, tmp_path / "out") == {"model.pte": pte.read_bytes(),
                                                     "extra.ptd": x.read_bytes()}


def test_a_rival_s_put_right_after_our_commit_is_a_conflict_theirs_stays(
        s3env: Any, tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    a = write(tmp_path / "src" / "a" / "model.pte", SMALL, 1)
    b = write(tmp_path / "src" / "b" / "model.pte", SMALL + 1, 2)
    publish_set({"a": [a], "b": [b]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    rival = _get(s3env, SET)  # the rival publisher's set manifest (it names a and b)
    before = {k: _get(s3env, k) for k in _keys(s3env)}

    ours = S3(s3env.endpoint.url)
    calls: list[str] = []

    def before_put(params: dict, **_kw: Any) -> None:
        calls.append(params.get("Key", ""))

    def after_put(**_kw: Any) -> None:
        if calls and calls[-1] == SET and "rival" not in calls:
            calls.append("rival")  # the rival's put lands right after ours
            s3env.client.put_object(Bucket=s3env.bucket, Key=SET, Body=rival)

    ours.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    ours.client.meta.events.register("after-call.s3.PutObject", after_put)
    c = write(tmp_path / "src" / "c" / "model.pte", SMALL + 2, 3)
    with pytest.raises(ConflictError, match="another publisher"):
        publish_set({"a": [c]}, url, client=ours, config=cfg, if_exists="replace")
    assert "rival" in calls, calls
    assert _get(s3env, SET) == rival, "the rival's set manifest was not what stays"
    after = {k: _get(s3env, k) for k in _keys(s3env)}
    assert {k: v for k, v in after.items() if k in before} == before, \
        "something of the rival's set changed or was removed"
    assert _fetched(s3env, url, tmp_path / "out", "b") == {"model.pte": b.read_bytes()}
