"""``publish_set`` at scale and under races (issue 47): requests per blob, the clean-up, the prune.

Against the real SeaweedFS server. Requests are counted by a recording
pass-through proxy (``tests/conditions_proxy.py`` with nothing ignored): what
the server was asked, never the client's own report. The races are set up
with hooks placed between two steps of one publisher, never left to timing.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import xxhash
from conditions_proxy import ConditionsProxy
from sets_helpers import write

from trtet_store.io.units import MiB
from trtet_store.remote import ConflictError
from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.remote.s3 import S3, PreconditionFailed
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import SET_KEY, fetch_set, publish_set, read_set

SMALL = 4096 + 17  # a blob of one part


def recording_proxy(s3) -> ConditionsProxy:
    e = s3.endpoint
    return ConditionsProxy(e.url, access_key=e.access_key, secret_key=e.secret_key,
                           region=e.region)


def reads(proxy: ConditionsProxy) -> Counter:
    """The proxy's GETs by kind: a listing (objects or uploads) or an object's GET."""
    kinds: Counter = Counter()
    for seen in proxy.seen():
        if seen.method != "GET":
            continue
        query = seen.target.partition("?")[2]
        listing = "list-type=" in query or "uploads" in query.split("&") or \
            not seen.target.partition("?")[0].strip("/").count("/")
        kinds["list" if listing else "get"] += 1
    return kinds


# --- 1. requests per blob --------------------------------------------------------------------


def _publish_n_blobs(s3env, root: Path, n: int) -> Counter:
    members = {f"m{i}": [write(root / f"m{i}" / "model.pte", SMALL, 100 * n + i)]
               for i in range(n)}
    with recording_proxy(s3env) as proxy:
        publish_set(members, f"s3://{s3env.bucket}/n{n}/", endpoint_url=proxy.url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
        return reads(proxy)


def test_a_set_publish_reads_a_constant_number_of_objects_per_blob(s3env, tmp_path):
    # The 12-blob set is published after the 3-blob one, under another prefix: each
    # blob's folder holds only its own set's blobs.
    few = _publish_n_blobs(s3env, tmp_path / "few", 3)
    many = _publish_n_blobs(s3env, tmp_path / "many", 12)
    # A constant per blob, plus the set's own: the per-blob figure cannot grow with the
    # count. A scan of blobs/ per blob (a LIST, then a GET of every blob manifest there)
    # is 3 + 3 GETs for 3 blobs and 12 + 66 for 12.
    for kind in ("list", "get"):
        assert many[kind] / 12 <= few[kind] / 3, (kind, few, many)
    assert many["get"] - few["get"] <= 9 * 2, (few, many)  # <= 2 GETs per added blob
    assert many["list"] - few["list"] <= 9 * 1, (few, many)  # <= 1 listing per added blob


# --- 2. a clean-up never removes a blob a committed manifest names --------------------------


def test_the_server_refuses_a_delete_at_another_etag(s3env):
    """What the clean-up's safety rests on: SeaweedFS honours If-Match on DeleteObject."""
    s3 = S3(s3env.endpoint.url)
    body = b"x" * 100
    etag = s3.put(s3env.bucket, "k", body, crc64nvme_b64(crc64nvme(body)))
    with pytest.raises(PreconditionFailed):
        s3.delete(s3env.bucket, "k", if_match="0" * 32)
    assert s3.head(s3env.bucket, "k").etag == etag
    s3.delete(s3env.bucket, "k", if_match=etag)
    assert s3.head(s3env.bucket, "k") is None


class PausedDeletes(S3):
    """A client whose first DeleteObject waits until the test lets it go."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reached, self.go = threading.Event(), threading.Event()

    def delete(self, bucket, key, if_match=None):
        if not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(120), "the test never let the delete go"
        return super().delete(bucket, key, if_match)


@pytest.mark.parametrize("size", [SMALL, 6 * MiB + 5], ids=["one-part", "two-parts"])
def test_a_blob_retaken_while_its_removal_is_under_way_is_never_deleted(s3env, tmp_path,
                                                                        size):
    """P1 commits v2 without X (``removing`` X) and stops right before its first delete,
    its checks done; P2 reads v2, finds X there, commits v3 naming X; P1 deletes. v3 stays
    whole: P2 renewed X (another ETag), so P1's conditional deletes are refused."""
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "model.pte", SMALL, 1)
    x = write(tmp_path / "src" / "extra.ptd", size, 2)
    publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    xkey = f"rel/blobs/{xxhash.xxh3_128(x.read_bytes()).hexdigest()}"
    v1_etag = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')

    p1_client = PausedDeletes(s3env.endpoint.url)
    p1: dict = {}

    def p1_publishes_v2() -> None:
        try:
            p1["report"] = publish_set({"a": [pte]}, url, client=p1_client, config=cfg,
                                       if_exists="replace")
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            p1["error"] = exc
        finally:
            p1_client.reached.set()

    thread = threading.Thread(target=p1_publishes_v2)
    thread.start()
    try:
        assert p1_client.reached.wait(120)
        assert "error" not in p1, p1.get("error")
        v2 = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                                Key=f"rel/{SET_KEY}")["Body"].read())
        assert v2["removing"] == {xkey.rpartition("/")[2]: v1_etag}  # P1 committed, paused
        v3 = publish_set({"a": [pte, x]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace")
    finally:
        p1_client.go.set()
        thread.join(120)
    assert "error" not in p1, p1.get("error")
    dest = tmp_path / "reader"
    dest.mkdir()
    fetch_set(url, dest / "a", "a", endpoint_url=s3env.endpoint.url)
    assert (dest / "a" / "extra.ptd").read_bytes() == x.read_bytes()
    assert (dest / "a" / "model.pte").read_bytes() == pte.read_bytes()
    # ... and so is the blob's own manifest, naming the version there (a later publish
    # takes X as present through it).
    blob_manifest = json.loads(s3env.client.get_object(
        Bucket=s3env.bucket, Key=f"{xkey}.trtet.json")["Body"].read())
    now = s3env.client.head_object(Bucket=s3env.bucket, Key=xkey)["ETag"].strip('"')
    assert blob_manifest["objects"][0]["etag"] == now != v1_etag
    assert p1["report"].removed == []  # its deletes were refused
    xname = xkey.rpartition("/")[2]
    assert xname not in v3.blobs_present and xname in v3.blobs_uploaded  # renewed


# --- 3. blobs no manifest names are pruned after a grace period ------------------------------


def blob_keys(s3env, prefix: str = "rel/blobs/") -> set[str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"] for o in listed.get("Contents", [])}


def _a_loser(s3env, tmp_path, monkeypatch, url, cfg) -> tuple[dict, str]:
    """A real loser: L sends a new engine, W commits first, L's commit is refused.

    Returns W's members and the digest of L's blob, which no manifest names.
    """
    import trtet_store.sets.publish as room

    pte = write(tmp_path / "src" / "a" / "model.pte", SMALL, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    winner = {"a": [pte], "b": [write(tmp_path / "src" / "b" / "model.pte", SMALL, 2)]}
    lost = write(tmp_path / "loser" / "a" / "model.pte", SMALL, 3)
    real = room._send_blobs

    def rival_commits_first(*args, **kwargs):
        blobs = real(*args, **kwargs)
        monkeypatch.setattr(room, "_send_blobs", real)
        publish_set(winner, url, endpoint_url=s3env.endpoint.url, config=cfg,
                    if_exists="replace")
        return blobs

    monkeypatch.setattr(room, "_send_blobs", rival_commits_first)
    with pytest.raises(ConflictError, match="another publisher"):
        publish_set({"a": [lost]}, url, endpoint_url=s3env.endpoint.url, config=cfg,
                    if_exists="replace")
    digest = xxhash.xxh3_128(lost.read_bytes()).hexdigest()
    assert {f"rel/blobs/{digest}", f"rel/blobs/{digest}.trtet.json"} <= blob_keys(s3env)
    return winner, digest


def test_a_loser_s_blob_is_pruned_once_older_than_the_grace_and_kept_before(
        s3env, tmp_path, monkeypatch):
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    winner, lost = _a_loser(s3env, tmp_path, monkeypatch, url, cfg)
    # The default grace (24 h): the loser's blob may be a publish under way; it stays.
    kept = publish_set(winner, url, endpoint_url=s3env.endpoint.url, config=cfg,
                       if_exists="replace")
    assert kept.pruned == [] and f"rel/blobs/{lost}" in blob_keys(s3env)
    # No grace: it is older than 0 s, no manifest names it; it goes, with its manifest.
    pruned = publish_set(winner, url, endpoint_url=s3env.endpoint.url, config=cfg,
                         if_exists="replace", gc_grace=0)
    assert pruned.pruned == [lost]
    assert not [k for k in blob_keys(s3env) if lost in k]
    named = {f.blob for m in read_set(S3(s3env.endpoint.url), s3env.bucket,
                                      "rel/")[0].members.values() for f in m.files}
    assert blob_keys(s3env) == {f"rel/blobs/{d}{s}" for d in named for s in ("", ".trtet.json")}
    dest = tmp_path / "reader"
    dest.mkdir()
    fetch_set(url, dest / "b", "b", endpoint_url=s3env.endpoint.url)
    assert (dest / "b" / "model.pte").read_bytes() == winner["b"][0].read_bytes()


def test_a_blob_a_concurrent_publisher_is_about_to_commit_survives_a_prune(
        s3env, tmp_path, monkeypatch):
    """C has uploaded its new blob Z and is about to commit; G publishes and prunes (the
    default grace) in between. Z, no manifest naming it yet, is young: it stays."""
    import trtet_store.sets.publish as room

    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    pte = write(tmp_path / "src" / "a" / "model.pte", SMALL, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url, config=cfg)
    z = write(tmp_path / "c" / "c" / "model.pte", SMALL, 4)
    zdigest = xxhash.xxh3_128(z.read_bytes()).hexdigest()
    real = room._commit
    g: dict = {}

    def g_publishes_before_c_commits(*args, **kwargs):
        monkeypatch.setattr(room, "_commit", real)
        assert f"rel/blobs/{zdigest}" in blob_keys(s3env)  # C's blob is up, unnamed
        g["report"] = publish_set({"a": [pte], "g": [pte]}, url,
                                  endpoint_url=s3env.endpoint.url, config=cfg,
                                  if_exists="replace")
        return real(*args, **kwargs)

    monkeypatch.setattr(room, "_commit", g_publishes_before_c_commits)
    with pytest.raises(ConflictError):  # G committed after C read the set
        publish_set({"a": [pte], "c": [z]}, url, endpoint_url=s3env.endpoint.url,
                    config=cfg, if_exists="replace")
    assert g["report"].pruned == []
    assert {f"rel/blobs/{zdigest}", f"rel/blobs/{zdigest}.trtet.json"} <= blob_keys(s3env)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (float("nan"), ValueError),
                                        (True, TypeError), ("1d", TypeError)])
def test_a_bad_gc_grace_is_refused_before_anything_is_sent(s3env, tmp_path, bad, error):
    pte = write(tmp_path / "model.pte", SMALL, 1)
    with pytest.raises(error, match="gc_grace"):
        publish_set({"a": [pte]}, f"s3://{s3env.bucket}/rel/",
                    endpoint_url=s3env.endpoint.url, gc_grace=bad,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
    assert blob_keys(s3env, "") == set()


def test_gc_grace_takes_a_timedelta(s3env, tmp_path):
    pte = write(tmp_path / "model.pte", SMALL, 1)
    report = publish_set({"a": [pte]}, f"s3://{s3env.bucket}/rel/",
                         endpoint_url=s3env.endpoint.url, gc_grace=timedelta(hours=1),
                         config=PublishConfig(journal_dir=s3env.journal_dir))
    assert report.pruned == []


def test_the_cli_prunes_with_gc_grace_in_hours_and_says_so(s3env, tmp_path, capsys):
    from trtet_store.cli import main

    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "a" / "model.pte", SMALL, 1)
    # What a killed publish leaves: a blob no manifest names.
    left = write(tmp_path / "left.bin", SMALL, 9)
    digest = xxhash.xxh3_128(left.read_bytes()).hexdigest()
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"rel/blobs/{digest}",
                            Body=left.read_bytes())
    argv = ["publish-set", url, "--member", "a", str(pte), "--endpoint-url",
            s3env.endpoint.url, "--journal-dir", str(s3env.journal_dir)]
    assert main([*argv, "--gc-grace", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--gc-grace must be a number of hours >= 0" in err and len(err.splitlines()) == 1
    assert main(argv) == 0  # the default, 24 hours: it stays
    assert "pruned" not in capsys.readouterr().out
    assert f"rel/blobs/{digest}" in blob_keys(s3env)
    assert main([*argv, "--replace", "--gc-grace", "0"]) == 0
    assert f"blobs/{digest}: pruned" in capsys.readouterr().out
    assert f"rel/blobs/{digest}" not in blob_keys(s3env)
