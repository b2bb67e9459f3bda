"""Sets on SeaweedFS, each check given its state: a member naming one blob twice on ext4, a
set manifest a bucket writer spoiled before a replace, one over the cap on the signed path,
a member the set does not have.

- On ext4 (no reflinks) a new blob is moved into place, not copied; a
  member naming the same bytes under two names (two identical ``.ptd``
  files) cannot move one blob to two names: both are placed with the right
  bytes and the store keeps the blob.
- ``publish_set(if_exists="replace")`` over a set manifest that is not one
  (a bucket writer's garbage) publishes the new version and removes no
  blob on its word.
- ``fetch_set(trusted_keys=...)`` refuses a set manifest one byte over the
  cap before reading its body, as the unsigned path does.
- ``member=`` a name the set lacks: the members are listed, nothing created.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write, xxh

from trtet_store.remote.errors import ManifestError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.manifest import SetManifest

MiB = 1 << 20
SET = "llm/v3/trtet-set.json"
CAP = 16 * 1024 * 1024  # the set manifest's documented cap


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    s3env.url = f"s3://{s3env.bucket}/llm/v3/"
    return s3env


def _publish(env: Any, members: dict, **kw: Any) -> Any:
    return publish_set(members, env.url, endpoint_url=env.endpoint.url,
                       config=PublishConfig(journal_dir=env.journal_dir), **kw)


def _keys(env: Any) -> list[str]:
    got = env.client.list_objects_v2(Bucket=env.bucket, Prefix="llm/v3/")
    return sorted(o["Key"] for o in got.get("Contents", []))


def test_a_member_naming_one_blob_twice_on_ext4_places_both_and_the_store_keeps_it(
        env: Any, tmp_path: Path, make_fs: Any) -> None:
    src = tmp_path / "src"
    pte = write(src / "model.pte", MiB + 5, 1)
    a = write(src / "a.ptd", 2 * MiB + 11, 7)
    b = src / "b.ptd"
    b.write_bytes(a.read_bytes())
    _publish(env, {"m": [pte, a, b]})
    mnt = make_fs("ext4", 64)
    dest = mnt / "out"
    rep = fetch_set(env.url, dest, "m", endpoint_url=env.endpoint.url)
    for p in (pte, a, b):
        assert (dest / p.name).read_bytes() == p.read_bytes(), p.name
    assert os.stat(dest / "a.ptd").st_ino != os.stat(dest / "b.ptd").st_ino
    store = mnt / ".trtet-blobs"
    assert (store / xxh(a)).read_bytes() == a.read_bytes()  # kept: two names need it
    assert rep.placed.get("move") == pte.stat().st_size, rep.placed
    # The store's blob was not written by the placement: the next fetch trusts it.
    again = fetch_set(env.url, mnt / "out2", "m", endpoint_url=env.endpoint.url)
    assert again.bytes_downloaded == 0 or again.bytes_downloaded == pte.stat().st_size
    assert (mnt / "out2" / "b.ptd").read_bytes() == a.read_bytes()


def test_a_replace_over_a_spoiled_set_manifest_publishes_and_removes_nothing(
        env: Any, tmp_path: Path, caplog: Any) -> None:
    src = tmp_path / "src"
    old = write(src / "old" / "model.pte", MiB + 1, 3)
    _publish(env, {"a": [old]})
    blobs_before = [k for k in _keys(env) if "/blobs/" in k]
    env.client.put_object(Bucket=env.bucket, Key=SET, Body=b'{"format": "trtet-store-set"}')
    new = write(src / "new" / "model.pte", MiB + 2, 4)
    with caplog.at_level(logging.WARNING, logger="trtet_store"):
        _publish(env, {"a": [new]}, if_exists="replace")
    assert any("the set manifest there cannot be read" in r.getMessage()
               and "its blobs are not removed" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    m = SetManifest.from_json(env.client.get_object(Bucket=env.bucket, Key=SET)["Body"].read())
    assert [f.blob for f in m.members["a"].files] == [xxh(new)] and m.removing == {}
    assert set(blobs_before) <= set(_keys(env))  # the old blob: nobody said it is unnamed


def test_a_signed_fetch_refuses_a_set_manifest_over_the_cap_unread(env: Any,
                                                                   tmp_path: Path) -> None:
    from trtet_store.remote.keys import keygen

    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    body = b'{"format": "trtet-store-set"}'
    env.client.put_object(Bucket=env.bucket, Key=SET, Body=body + b" " * (CAP + 1 - len(body)))
    dest = tmp_path / "out"
    for trusted in ([d / "team.key.pub"], None):
        with pytest.raises(ManifestError) as caught:
            fetch_set(env.url, dest, "a", endpoint_url=env.endpoint.url, trusted_keys=trusted)
        assert f"{CAP + 1} bytes" in str(caught.value) and f"{CAP}" in str(caught.value), \
            caught.value
    assert not dest.exists() and not (tmp_path / ".trtet-blobs").exists()


def test_a_member_the_set_lacks_lists_its_members_and_creates_nothing(env: Any,
                                                                      tmp_path: Path) -> None:
    src = tmp_path / "src"
    _publish(env, {"sm89": [write(src / "a" / "model.pte", 100, 1)],
                   "sm90": [write(src / "b" / "model.pte", 100, 2)]})
    dest = tmp_path / "out"
    with pytest.raises(KeyError) as caught:
        fetch_set(env.url, dest, "sm80", endpoint_url=env.endpoint.url)
    assert caught.value.args[0] == (f"s3://{env.bucket}/llm/v3/ has no member 'sm80'; its "
                                    "members: ['sm89', 'sm90']")
    assert not dest.exists() and not (tmp_path / ".trtet-blobs").exists()
    doc = json.loads(env.client.get_object(Bucket=env.bucket, Key=SET)["Body"].read())
    assert sorted(doc["members"]) == ["sm89", "sm90"]
