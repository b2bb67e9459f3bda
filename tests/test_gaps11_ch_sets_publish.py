"""publish_set (sets/publish.py): promises of the digest pass and the commit no other test sets up.

- ``_put_small``: a one-part blob renewed by PutObject is read again; bytes other than
  the digest pass's are ``SourceChangedError`` naming the file (it was a TypeError: the
  error was built without its ``what``), nothing put.
- ``_read``: each local file piece is planned again with the chunk digests taken in the
  digest pass, so a file rewritten between that pass and its upload (same size, its mtime
  put back) is refused by the upload (``SourceChangedError``): never published under a blob
  name that is not its digest, and no set manifest committed.

Real SeaweedFS; the rewrite happens at the seam between the two steps (``_send_blobs``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write, xxh

import trtet_store.sets.publish as publish_mod
from trtet_store.io import SourceChangedError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def _keys(s3: Any) -> list[str]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket)
    return sorted(o["Key"] for o in got.get("Contents", []))


@pytest.mark.parametrize("size", [70_000, 6 * 1024 * 1024 + 5])
def test_publish_set_refuses_a_file_rewritten_after_its_digest_pass(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    pte = write(tmp_path / "src" / "model.pte", size, 1)
    digest = xxh(pte)
    st = os.stat(pte)
    real = publish_mod._send_blobs

    def rewrite_then_send(*args: Any, **kwargs: Any) -> Any:
        # Same size, other bytes in the last chunk, the mtime put back: a rewrite the
        # digest pass cannot have seen.
        with open(pte, "r+b") as f:
            f.seek(size - 3)
            f.write(b"XYZ")
        os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_mod, "_send_blobs", rewrite_then_send)
    url = f"s3://{s3env.bucket}/rel/"
    with pytest.raises(SourceChangedError):
        publish_set({"m": [pte]}, url, endpoint_url=s3env.endpoint.url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
    keys = _keys(s3env)
    assert "rel/trtet-set.json" not in keys, keys
    assert f"rel/blobs/{digest}" not in keys, \
        f"the rewritten bytes were published under the digest of the old ones: {keys}"


def test_publish_set_gc_grace_as_a_timedelta_counts_its_days(s3env: Any, tmp_path: Path) -> None:
    """``_grace_of``: a timedelta grace is its total seconds. ``timedelta(days=1)`` keeps a
    blob no manifest names that was uploaded a moment ago (a concurrent publisher's, not
    committed yet); ``timedelta(0)`` prunes it (the blob is prunable: only the grace keeps
    it). A grace that dropped the days (``.seconds`` is 0 for a whole day) would prune it."""
    from datetime import timedelta

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "a" / "model.pte", 5000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    stray = write(tmp_path / "stray.bin", 4000, 9)
    key = f"rel/blobs/{xxh(stray)}"
    s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=stray.read_bytes())
    etag = s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"]

    report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=timedelta(days=1))
    assert report.pruned == [], "a blob seconds old was pruned under a grace of one day"
    assert s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"] == etag

    report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=timedelta(0))
    assert report.pruned == [xxh(stray)]
    assert key not in _keys(s3env)


def test_put_small_refuses_a_file_rewritten_before_the_renewal_reads_it(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_put_small`` (``_renew`` of a one-part blob by PutObject) reads the file again: a
    rewrite since the digest pass (same size, its mtime put back, so only the bytes tell)
    is SourceChangedError, not a PutObject of other bytes under the old blob's name. The
    blob a killed publish left (no set manifest names it) keeps its bytes and ETag, its
    manifest too, and no set manifest is committed."""
    import xxhash

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    size = 4096 + 17  # one part: renewed by _put_small
    pte = write(tmp_path / "src" / "model.pte", size, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    xkey = f"rel/blobs/{xxhash.xxh3_128(pte.read_bytes()).hexdigest()}"
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)
    assert head["ETag"].strip('"').endswith("-1"), head["ETag"]  # renewal: by PutObject
    s3env.client.delete_object(Bucket=s3env.bucket, Key="rel/trtet-set.json")  # killed
    before = {k: s3env.client.get_object(Bucket=s3env.bucket, Key=k)["Body"].read()
              for k in (xkey, f"{xkey}.trtet.json")}
    etags = {k: s3env.client.head_object(Bucket=s3env.bucket, Key=k)["ETag"] for k in before}
    st = os.stat(pte)
    real = publish_mod._put_small
    calls = []

    def rewrite_then_put(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])
        with open(pte, "r+b") as f:
            f.seek(100)
            f.write(b"not the bytes digested")
        os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_mod, "_put_small", rewrite_then_put)
    with pytest.raises(SourceChangedError) as caught:
        publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    assert str(pte) in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert calls == [xkey], calls
    assert {k: s3env.client.get_object(Bucket=s3env.bucket, Key=k)["Body"].read()
            for k in before} == before
    assert {k: s3env.client.head_object(Bucket=s3env.bucket, Key=k)["ETag"]
            for k in before} == etags
    assert "rel/trtet-set.json" not in _keys(s3env)


def test_to_remove_leaves_out_a_blob_renewed_since_a_killed_clean_up_listed_it(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_to_remove``: a blob the replaced version lists in ``removing`` (its publish was
    killed before its clean-up) is carried into the new version's ``removing`` only while
    it is still the version listed there. One another publisher renewed since (a new
    ETag, its manifest naming it: to be named by their commit) is theirs: the new
    manifest does not list it, and the blob and its manifest stay as they are."""
    import json

    import xxhash

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    extra = write(tmp_path / "src" / "extra.ptd", 6000, 2)
    publish_set({"a": [pte, extra]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    x = xxhash.xxh3_128(extra.read_bytes()).hexdigest()
    xkey = f"rel/blobs/{x}"
    e0 = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')
    # v1 drops extra.ptd; its publish is killed between its commit and its clean-up.
    with monkeypatch.context() as m:
        m.setattr(publish_mod, "_remove_unnamed", lambda *a, **k: [])
        publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                    if_exists="replace")
    set_doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                                 Key="rel/trtet-set.json")["Body"].read())
    assert set_doc["removing"] == {x: e0}
    # Another publisher renews the blob (PutObject: an ETag without "-1"), then its manifest.
    put = s3env.client.put_object(Bucket=s3env.bucket, Key=xkey, Body=extra.read_bytes())
    e1 = put["ETag"].strip('"')
    assert e1 != e0
    mdoc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                              Key=f"{xkey}.trtet.json")["Body"].read())
    mdoc["objects"][0]["etag"] = e1
    mdoc["objects"][0]["parts"][0]["etag"] = e1
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{xkey}.trtet.json",
                            Body=json.dumps(mdoc).encode())
    before = {k: (s3env.client.get_object(Bucket=s3env.bucket, Key=k)["Body"].read(),
                  s3env.client.head_object(Bucket=s3env.bucket, Key=k)["ETag"])
              for k in (xkey, f"{xkey}.trtet.json")}

    report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace")
    set_doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                                 Key="rel/trtet-set.json")["Body"].read())
    assert set_doc["removing"] == {}, \
        f"the new set lists a blob renewed since (ETag {e1}) to remove at {e0}: {set_doc}"
    assert x not in report.removed
    assert {k: (s3env.client.get_object(Bucket=s3env.bucket, Key=k)["Body"].read(),
                s3env.client.head_object(Bucket=s3env.bucket, Key=k)["ETag"])
            for k in before} == before


def test_prune_keeps_out_of_its_report_a_blob_another_clean_up_removed_meanwhile(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_prune`` through ``_blob_first``: a stray blob listed by the prune, then removed with
    its manifest by another publisher's clean-up before ours reaches it, is not ours to
    delete (nothing is asked of the server for it) and not reported as pruned; the
    prune goes on with the next."""
    import xxhash

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    strays = [write(tmp_path / f"stray{i}.bin", 3000 + i, 10 + i) for i in range(2)]
    keys = [f"rel/blobs/{xxhash.xxh3_128(p.read_bytes()).hexdigest()}" for p in strays]
    for p, k in zip(strays, keys, strict=True):
        s3env.client.put_object(Bucket=s3env.bucket, Key=k, Body=p.read_bytes())
    gone, other = sorted(keys)
    real = publish_mod._blob_first
    deletes: list[str] = []

    def first_after_a_rival(s3: Any, bucket: str) -> Any:
        inner = real(s3, bucket)
        s3.client.meta.events.register(
            "before-parameter-build.s3.DeleteObject",
            lambda params, **_: deletes.append(params["Key"]))

        def first(item: Any) -> Any:
            if item.key == gone:  # another publisher's clean-up removed it just now
                s3env.client.delete_object(Bucket=s3env.bucket, Key=gone)
            return inner(item)
        return first

    monkeypatch.setattr(publish_mod, "_blob_first", first_after_a_rival)
    report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=0)
    assert report.pruned == [other.rpartition("/")[2]], report.pruned
    assert gone not in deletes, deletes
    assert other in deletes and other not in _keys(s3env)


def test_present_takes_a_blob_only_at_the_version_its_manifest_names(
        s3env: Any, tmp_path: Path) -> None:
    """``_present``: a blob is taken as there only when the object's ETag is the one its blob
    manifest names. Another client rewrote the object (the same bytes, so the same size
    and CRC64NVME, by PutObject: another ETag) and not its manifest (a renewal half done):
    the replacing publish does not name the stale version, the committed set names the
    object that is there, and a fetch of it gets the member's bytes."""
    import json

    import xxhash

    from trtet_store.sets import fetch_set

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    x = xxhash.xxh3_128(pte.read_bytes()).hexdigest()
    xkey = f"rel/blobs/{x}"
    e0 = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')
    e1 = s3env.client.put_object(Bucket=s3env.bucket, Key=xkey,
                                 Body=pte.read_bytes())["ETag"].strip('"')
    assert e1 != e0

    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                if_exists="replace")
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key="rel/trtet-set.json")["Body"].read())
    now = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')
    assert doc["blobs"][x]["etag"] == now, (doc["blobs"][x], e0, e1, now)
    fetch_set(url, tmp_path / "out", "a", endpoint_url=s3env.endpoint.url)
    assert (tmp_path / "out" / "model.pte").read_bytes() == pte.read_bytes()


def test_renew_never_commits_a_blob_at_an_etag_it_had_to_avoid(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_renew``: the version written must have an ETag none of ``avoid`` has. A blob of one
    part that the replaced set lists in ``removing`` at its multipart ETag (``...-1``)
    and that a losing publisher renewed by PutObject (the bytes' MD5: a prune may have
    listed it so) has no layout left: its renewal by PutObject comes back to that MD5
    ETag. The publish is refused (ConflictError, the set as it was), never committed
    naming a version a pending delete is pinned to."""
    import hashlib
    import json

    from trtet_store.remote import ConflictError

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    x = write(tmp_path / "src" / "extra.ptd", 6000, 2)
    xkey = f"rel/blobs/{xxh(x)}"
    publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    e0 = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')
    assert e0.endswith("-1"), e0
    with monkeypatch.context() as m:  # v2 drops extra.ptd; killed before its clean-up
        m.setattr(publish_mod, "_remove_unnamed", lambda *a, **k: [])
        publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                    if_exists="replace")

    def loses(*a: Any, **k: Any) -> str:
        raise ConflictError("another publisher committed first", "rel/trtet-set.json")

    with monkeypatch.context() as m:  # a loser renews extra.ptd (PutObject), then loses
        m.setattr(publish_mod, "_commit", loses)
        with pytest.raises(ConflictError):
            publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                        if_exists="replace")
    md5 = hashlib.md5(x.read_bytes()).hexdigest()
    assert s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"') == md5
    set_before = s3env.client.get_object(Bucket=s3env.bucket, Key="rel/trtet-set.json")
    body = set_before["Body"].read()
    assert json.loads(body)["removing"] == {xxh(x): e0}

    with pytest.raises(ConflictError, match="being removed by another publisher's clean-up"):
        publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                    if_exists="replace")
    now = s3env.client.get_object(Bucket=s3env.bucket, Key="rel/trtet-set.json")
    assert now["Body"].read() == body and now["ETag"] == set_before["ETag"]


def test_publish_set_default_gc_grace_is_24_hours(s3env: Any, tmp_path: Path) -> None:
    """``publish_set``'s default ``gc_grace`` (``DEFAULT_GC_GRACE``) is 24 hours in seconds:
    the dry run's plan (``dry_run=True``, nothing written) keeps a stray blob uploaded a
    moment ago "younger than 86400 s", and the bucket is unchanged."""
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    stray = write(tmp_path / "stray.bin", 4000, 9)
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"rel/blobs/{xxh(stray)}",
                            Body=stray.read_bytes())
    before = _keys(s3env)
    report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", dry_run=True)
    assert report.kept.get(xxh(stray)) == "younger than 86400 s", report.kept
    assert report.pruned == [] and _keys(s3env) == before


def test_present_does_not_take_a_blob_whose_manifest_names_another_crc(
        s3env: Any, tmp_path: Path) -> None:
    """``_present``: a blob is taken as there only when its blob manifest names the file's
    size and CRC64NVME. A bucket writer changed the manifest's CRC64NVME (the object
    untouched): the replacing publish does not take it as present. (On main the upload
    that follows then stops: the blob's publish trusts the manifest there and reports its
    CRC64NVME, which is not the file's: RemoteError naming both, and nothing is committed;
    the set stays as it was, byte for byte. A publish that repairs the blob passes too: it
    sends it again and the manifest names the file's CRC64NVME.)"""
    import json

    from trtet_store.remote import RemoteError

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", 5000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    mkey = f"rel/blobs/{xxh(pte)}.trtet.json"
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=mkey)["Body"].read())
    doc["objects"][0]["crc64nvme"] = "AAAAAAAAAAA="
    s3env.client.put_object(Bucket=s3env.bucket, Key=mkey, Body=json.dumps(doc).encode())
    before = s3env.client.get_object(Bucket=s3env.bucket, Key="rel/trtet-set.json")
    body = before["Body"].read()

    try:
        report = publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                             if_exists="replace")
    except RemoteError as exc:  # main: refused, nothing committed
        assert "published with CRC64NVME AAAAAAAAAAA=, its bytes read " in str(exc), exc
        now = s3env.client.get_object(Bucket=s3env.bucket, Key="rel/trtet-set.json")
        assert now["Body"].read() == body and now["ETag"] == before["ETag"]
    else:  # a publish that repairs the blob: sent again, never taken as present
        assert xxh(pte) not in report.blobs_present, report
        doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=mkey)["Body"].read())
        assert doc["objects"][0]["crc64nvme"] != "AAAAAAAAAAA=", doc
