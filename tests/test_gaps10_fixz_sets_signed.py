"""A signed set (sets/signed.py, sets/fetch.py): what a refused fetch_set leaves, which bytes
are vouched for.

- A fetch_set of member ``b`` into a directory that holds member ``a`` (fetched before, its
  record there) whose blob is refused by check_blobs (the forger holds the team key and
  signs a sha256 that is not the blob's: SetSignatureError after the download): ``a``'s
  files are byte-identical after. The previous member's files are removed
  (remove_unlisted) only once the new ones are checked and placed, never before.
- read_signed_set's manifest is the bytes whose signature verified_sha256s checked: a bucket
  writer who replaces ``trtet-set.json`` right after that GET (our own client's event hook,
  a boto3 put on SeaweedFS) does not get its member list used; the file placed is the
  signed one's bytes.
- A blob whose seal keeps a sha256 is believed by it only while the blob is the sealed file
  (``_sealed_sha256``): a blob rewritten in the store between the seal's first look and
  its read is read again, and refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from keyed import with_keys
from sets_helpers import write, xxh

from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.signed import SetSignatureError, sign_set

KiB = 1 << 10
SET_JSON = "rel/trtet-set.json"


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.url = f"s3://{s3env.bucket}/rel/"
    return s3env


def _publish(env: Any, root: Path) -> dict[str, Path]:
    src = root / "src"
    files = {"a": write(src / "a" / "a.pte", 70 * KiB + 3, 1),
             "b": write(src / "b" / "b.pte", 90 * KiB + 5, 2)}
    publish_set({m: [p] for m, p in files.items()}, env.url, endpoint_url=env.endpoint.url,
                config=PublishConfig(journal_dir=env.journal_dir),
                signing_key=env.keys / "team.key")
    return files


def _doc(env: Any) -> dict:
    return json.loads(env.client.get_object(Bucket=env.bucket, Key=SET_JSON)["Body"].read())


def _put(env: Any, doc: dict) -> None:
    """The bucket writer: the set manifest replaced with boto3, no condition."""
    env.client.put_object(Bucket=env.bucket, Key=SET_JSON,
                          Body=(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
                          .encode())


def _resigned(doc: dict, shas: dict, key_path: Path) -> dict:
    from trtet_store.cache.tier.signing import load_signing_key

    bare = {k: v for k, v in doc.items() if k not in ("sha256", "signatures")}
    return json.loads(sign_set(json.dumps(bare).encode(), shas, load_signing_key(key_path)))


def _tree(directory: Path) -> dict[str, tuple[str, int, int]]:
    out = {}
    for p in sorted(directory.iterdir()):
        st = os.lstat(p)
        out[p.name] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_ino)
    return out


def _fetch(env: Any, dest: Path, member: str, **kw: Any) -> Any:
    return fetch_set(env.url, dest, member, endpoint_url=env.endpoint.url,
                     trusted_keys=[env.keys / "team.key.pub"], **kw)


def test_a_refused_blob_leaves_the_previous_member_s_files(env: Any, tmp_path: Path) -> None:
    """fetch_set of b over a: check_blobs refuses b's blob; remove_unlisted has not run."""
    files = _publish(env, tmp_path)
    out = tmp_path / "out"
    _fetch(env, out, "a")
    assert (out / "a.pte").read_bytes() == files["a"].read_bytes()
    before = _tree(out)
    assert "a.pte" in before and len(before) >= 2, before  # a.pte and its record

    doc = _doc(env)
    b = xxh(files["b"])
    forged = dict(doc["sha256"], **{b: hashlib.sha256(b"what the signer meant").hexdigest()})
    _put(env, _resigned(doc, forged, env.keys / "team.key"))
    with pytest.raises(SetSignatureError, match=f"blob {b}: its sha256 is"):
        _fetch(env, out, "b")
    assert _tree(out) == before, "the previous member's files changed under a refused fetch"
    assert (out / "a.pte").read_bytes() == files["a"].read_bytes()
    assert not (out / "b.pte").exists()


def test_the_manifest_used_is_the_one_whose_signature_was_checked(env: Any,
                                                                  tmp_path: Path) -> None:
    """read_signed_set: no second GET of trtet-set.json; a writer's swap right after the
    verified GET is not what verified_sha256s vouched for, and is not used."""
    files = _publish(env, tmp_path)
    doc = _doc(env)
    swapped = json.loads(json.dumps(doc))
    # The writer's list: the members' blobs swapped (both signed, so both sha256s listed):
    # member a's a.pte is b's bytes.
    fa, fb = doc["members"]["a"]["files"][0], doc["members"]["b"]["files"][0]
    swapped["members"]["a"]["files"] = [dict(fb, name="a.pte")]
    swapped["members"]["b"]["files"] = [dict(fa, name="b.pte")]
    client = S3(env.endpoint.url)
    gets: list[str] = []

    def before_get(params: dict, **_kw: Any) -> None:
        if params.get("Key") == SET_JSON:
            gets.append(params.get("Range", "whole"))
            if len(gets) == 1:  # the verified GET is asked for; the swap lands right after
                env.swap_due = True
            elif getattr(env, "swap_due", False):
                env.swap_due = False
                _put(env, swapped)

    def after_get(**_kw: Any) -> None:  # any GET's answer; the set's first one swaps
        if getattr(env, "swap_due", False):
            env.swap_due = False
            _put(env, swapped)

    client.client.meta.events.register("before-parameter-build.s3.GetObject", before_get)
    client.client.meta.events.register("after-call.s3.GetObject", after_get)
    out = tmp_path / "out"
    _fetch(env, out, "a", client=client)
    assert (out / "a.pte").read_bytes() == files["a"].read_bytes(), \
        "placed the writer's member list, not the signed one"
    assert gets == ["whole"], f"the set manifest was read {len(gets)} times: {gets}"
    assert _doc(env) == swapped  # the writer's put landed (right after the verified GET)


def test_a_blob_changed_after_its_seal_was_looked_at_is_read_again(
        env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_blobs: the sha256 a seal keeps (``_sealed_sha256``) is believed only while the
    blob is still the sealed file; another process of ours replacing the blob (same size)
    between the seal's first look and its read: read again, refused (SetSignatureError),
    removed from the store, nothing placed."""
    from trtet_store.sets.store import ContentStore

    files = _publish(env, tmp_path)
    store = tmp_path / "store"
    _fetch(env, tmp_path / "first", "a", store=store, placements=["copy"])  # store keeps it
    a = xxh(files["a"])
    assert ContentStore(store).sealed(a)
    assert ContentStore(store).kept(a, "sha256")[1] == \
        hashlib.sha256(files["a"].read_bytes()).hexdigest()
    real_kept = ContentStore.kept
    swapped: list[str] = []

    def kept_then_swapped(self: Any, name: str, field: str, limit: Any = None) -> Any:
        got = real_kept(self, name, field, limit)
        if field == "sha256" and name == a and not swapped:
            swapped.append(name)  # the blob replaced right after its seal was read
            tmp = self.root / ".swap.tmp"
            tmp.write_bytes(os.urandom(files["a"].stat().st_size))
            os.chmod(tmp, 0o444)
            os.replace(tmp, self.path(name))
        return got

    monkeypatch.setattr(ContentStore, "kept", kept_then_swapped)
    out = tmp_path / "out"
    with pytest.raises(SetSignatureError, match=f"blob {a}: its sha256 is None"):
        _fetch(env, out, "a", store=store, placements=["copy"])
    assert swapped == [a]
    assert not (out / "a.pte").exists(), "placed from a blob that was not the signed bytes"
    assert not ContentStore(store).path(a).exists(), "the changed blob kept in the store"
