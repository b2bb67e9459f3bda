"""A set manifest as a signed root: blobs named by sha256 too, checked with trusted keys.

``publish_set(signing_key=...)`` adds each blob's sha256 (taken in the pass
that reads the file) and an ed25519 signature to ``trtet-set.json``;
``fetch_set(trusted_keys=...)`` refuses a set no trusted key vouches for
before a byte of a blob is downloaded or anything is created, and refuses
to place a blob whose sha256 is not the signed one. The bucket writer is
boto3 on SeaweedFS; the "second preimage" forger holds the team key and
signs a sha256 that is not the blob's (nobody can find an xxh3 collision
for a test; a reader that checked only xxh3 would take such a blob).
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

from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.signed import SetSignatureError, sign_set

MiB = 1 << 20


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.url = f"s3://{s3env.bucket}/llm/v3/"
    return s3env


def _publish(env: Any, root: Path, **kw: Any) -> dict[str, list[Path]]:
    shared = write(root / "src" / "foundation.ptd", 2 * MiB + 11, 7)
    members = {"a": [write(root / "src" / "a" / "model.pte", MiB + 5, 1), shared]}
    publish_set(members, env.url, endpoint_url=env.endpoint.url,
                config=PublishConfig(journal_dir=env.journal_dir), **kw)
    return members


def _doc(env: Any) -> dict:
    got = env.client.get_object(Bucket=env.bucket, Key="llm/v3/trtet-set.json")
    return json.loads(got["Body"].read())


def _put(env: Any, doc: dict) -> None:
    """The bucket writer: the set manifest replaced with boto3, no condition."""
    env.client.put_object(Bucket=env.bucket, Key="llm/v3/trtet-set.json",
                          Body=(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
                          .encode())


def _resigned(doc: dict, shas: dict, key_path: Path) -> dict:
    from trtet_store.cache.tier.signing import load_signing_key

    bare = {k: v for k, v in doc.items() if k not in ("sha256", "signatures")}
    return json.loads(sign_set(json.dumps(bare).encode(), shas, load_signing_key(key_path)))


def _fetch(env: Any, dest: Path, **kw: Any) -> Any:
    return fetch_set(env.url, dest, "a", endpoint_url=env.endpoint.url,
                     trusted_keys=[env.keys / "team.key.pub"], **kw)


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_a_signed_set_names_blobs_by_sha256_and_is_fetched_with_trusted_keys(
        env: Any, here_fs: Path) -> None:
    members = _publish(env, here_fs, signing_key=env.keys / "team.key")
    doc = _doc(env)
    assert [s["key"] for s in doc["signatures"]] == [env.team.key_id]
    assert doc["sha256"] == {xxh(p): hashlib.sha256(p.read_bytes()).hexdigest()
                             for p in members["a"]}
    dest = here_fs / "out" / "a"
    dest.parent.mkdir()
    report = _fetch(env, dest)
    assert report.bytes_downloaded == sum(p.stat().st_size for p in members["a"])
    for p in members["a"]:
        assert (dest / p.name).read_bytes() == p.read_bytes()
    # Unsigned readers read it as before (they ignore the two fields).
    plain = fetch_set(env.url, here_fs / "out" / "plain", "a", endpoint_url=env.endpoint.url)
    assert plain.member == "a"


@pytest.mark.parametrize("attack", ["unsigned", "untrusted signer", "changed after signing",
                                    "xxh3 only"])
def test_a_set_no_trusted_key_vouches_for_is_refused_before_any_download(
        env: Any, here_fs: Path, attack: str) -> None:
    if attack == "unsigned":
        _publish(env, here_fs)
        said = "the set is refused: not signed"
    elif attack == "untrusted signer":
        _publish(env, here_fs, signing_key=env.keys / "evil.key")
        said = f"signed by '{env.evil.key_id}', not one of the trusted keys"
    elif attack == "changed after signing":
        _publish(env, here_fs, signing_key=env.keys / "team.key")
        doc = _doc(env)
        doc["members"]["a"]["metadata"]["compute_capability"] = "9.0"
        _put(env, doc)
        said = f"its signature by {env.team.key_id} does not verify"
    else:
        _publish(env, here_fs, signing_key=env.keys / "team.key")
        doc = _doc(env)
        del doc["sha256"]
        _put(env, doc)
        said = "names its blobs by xxh3-128 only"
    dest = here_fs / "out" / "a"
    dest.parent.mkdir()
    with pytest.raises(SetSignatureError) as caught:
        _fetch(env, dest, store=here_fs / "out" / "store")
    assert said in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert str(caught.value).endswith("; nothing downloaded")
    assert _files(here_fs / "out") == []  # no destination, no store: nothing made


def test_a_blob_whose_sha256_is_not_the_signed_one_is_not_placed(env: Any,
                                                                 here_fs: Path) -> None:
    members = _publish(env, here_fs, signing_key=env.keys / "team.key")
    doc = _doc(env)
    honest = json.loads(json.dumps(doc))
    ptd = xxh(members["a"][1])
    shas = dict(doc["sha256"], **{ptd: hashlib.sha256(b"what the signer meant").hexdigest()})
    _put(env, _resigned(doc, shas, env.keys / "team.key"))
    out = here_fs / "out"
    out.mkdir()
    store = out / "store"
    # Downloaded now: the sha256 taken as it arrived is refused.
    with pytest.raises(SetSignatureError) as caught:
        _fetch(env, out / "a", store=store)
    said = str(caught.value)
    assert f"blob {ptd}: its sha256 is {hashlib.sha256(members['a'][1].read_bytes()).hexdigest()}" \
        f", the signed set says {shas[ptd]}" in said, said
    assert _files(out / "a") == []  # nothing placed
    assert ptd not in _files(store)  # nor kept
    # In the store already (an unsigned fetch put it there): read once, refused the same.
    fetch_set(env.url, out / "plain", "a", endpoint_url=env.endpoint.url, store=store,
              placements=["clone", "copy"])  # no move: the store keeps the blob
    assert ptd in _files(store)
    with pytest.raises(SetSignatureError, match=f"blob {ptd}: its sha256 is"):
        _fetch(env, out / "a", store=store)
    assert _files(out / "a") == []
    # The honest manifest again: placed, byte for byte.
    _put(env, honest)
    _fetch(env, out / "a", store=store)
    assert [(out / "a" / p.name).read_bytes() for p in members["a"]] == \
        [p.read_bytes() for p in members["a"]]


def test_the_cli_signs_and_checks_a_set(env: Any, here_fs: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    from trtet_store.cli import main

    pte = write(here_fs / "src" / "model.pte", MiB, 3)
    ep = ["--endpoint-url", env.endpoint.url]
    assert main(["publish-set", env.url, "--member", "a", os.fspath(pte), "--signing-key",
                 os.fspath(env.keys / "team.key"), "--journal-dir",
                 os.fspath(env.journal_dir), *ep]) == 0
    assert [s["key"] for s in _doc(env)["signatures"]] == [env.team.key_id]
    capsys.readouterr()
    out = here_fs / "out"
    out.mkdir()
    rc = main(["fetch-set", env.url, os.fspath(out / "a"), "--member", "a", "--trusted-key",
               os.fspath(env.keys / "evil.key.pub"), *ep])
    err = capsys.readouterr().err
    assert rc == 1 and err.splitlines()[1].endswith("and its .ptd files are unchanged"), err
    assert f"trtet-store fetch-set: SetSignatureError: s3://{env.bucket}/llm/v3/trtet-set.json:" \
        f" the set is refused: signed by '{env.team.key_id}', not one of the trusted " \
        "keys" in err.splitlines()[0]
    assert f"the set is refused: signed by '{env.team.key_id}', not one of the trusted " \
        "keys" in err
    assert _files(out) == []
    assert main(["fetch-set", env.url, os.fspath(out / "a"), "--member", "a", "--trusted-key",
                 os.fspath(env.keys / "team.key.pub"), *ep]) == 0
    assert (out / "a" / "model.pte").read_bytes() == pte.read_bytes()


def test_a_signed_fetch_reads_no_byte_more_than_an_unsigned_one(env: Any,
                                                                here_fs: Path) -> None:
    """The sha256 of a blob downloaded now is taken as it arrives and kept in its seal: the
    check before placement reads nothing (bytes digested, unsigned against signed)."""
    from trtet_store.io import bytes_digested

    _publish(env, here_fs, signing_key=env.keys / "team.key")
    out = here_fs / "out"
    out.mkdir()
    spent = []
    for name, keys in (("plain", None), ("signed", [env.keys / "team.key.pub"])):
        before = bytes_digested()
        fetch_set(env.url, out / name, "a", endpoint_url=env.endpoint.url,
                  store=out / f"store-{name}", trusted_keys=keys)
        spent.append(bytes_digested() - before)
    assert spent[1] == spent[0] > 0, spent
