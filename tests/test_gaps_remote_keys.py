"""Key files, key ids and one signature's check, each given the state its check exists for.

The signed set's rules (:func:`trtet_store.sets.signed.verified_sha256s`)
with a sha256 that is no sha256 (signed by the team key itself), a
signature with junk around its base64 (still the team's bytes once the
junk is dropped), a trusted key's signature that does not verify behind an
unknown signer's; key files: a private key a group can read, a public key
a group can write, a ``.pub`` name held by a dangling link, a key of
another algorithm, and the modes keygen makes whatever the umask.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from trtet_store.remote.keys import (  # noqa: E402
    KeyFileError,
    keygen,
    load_public_key,
    load_signing_key,
    signature_problem,
)
from trtet_store.sets.manifest import BlobEntry, FileEntry, MemberEntry, SetManifest  # noqa: E402
from trtet_store.sets.signed import SetSignatureError, sign_set, verified_sha256s  # noqa: E402

BLOB = "a" * 32
SHAS = {BLOB: hashlib.sha256(b"a").hexdigest()}
WHERE = "s3://bucket/llm/v3/trtet-set.json"


@pytest.fixture
def keys(tmp_path: Path) -> Any:
    from types import SimpleNamespace

    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    keygen(d / "evil.key")
    return SimpleNamespace(dir=d, trusted={team.key_id: team},
                           team=load_signing_key(d / "team.key"),
                           evil=load_signing_key(d / "evil.key"))


def _body() -> bytes:
    m = SetManifest(members={"a": MemberEntry((FileEntry("model.pte", BLOB, 10, "c", (1,)),))},
                    blobs={BLOB: BlobEntry(10, "e1", "c")}, chunk_size=1 << 20)
    return m.to_json()


def _sign(doc: dict, key: Any) -> dict:
    """``doc`` with one signature of ``key`` over exactly what it says."""
    from trtet_store.sets.signed import DOMAIN

    bare = {k: v for k, v in doc.items() if k != "signatures"}
    payload = DOMAIN + json.dumps(bare, sort_keys=True, separators=(",", ":"),
                                  ensure_ascii=True).encode("ascii")
    return {**bare, "signatures": [{"key": key.key_id, "ed25519": base64.b64encode(
        key.sign(payload)).decode()}]}


def _refusal(body: dict | bytes, trusted: dict) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(SetSignatureError) as caught:
        verified_sha256s(raw, trusted, WHERE)
    return str(caught.value)


@pytest.mark.parametrize("sha", ["A" * 64, "a" * 63, "g" * 64, 7, None])
def test_a_sha256_that_is_no_sha256_is_refused_though_the_team_signed_it(keys: Any,
                                                                         sha: Any) -> None:
    """The signature verifies over that very map; only the form rule refuses it, before a
    byte is downloaded (not later, as a blob whose sha256 'differs')."""
    doc = _sign({**json.loads(_body()), "sha256": {BLOB: sha}}, keys.team)
    assert signature_problem(doc["signatures"][0], keys.trusted, b"x") is not None
    said = _refusal(doc, keys.trusted)
    assert said == (f"{WHERE}: the set is refused: names its blobs by xxh3-128 only (no "
                    "sha256 for each): not trusted; publish it again with the signing key; "
                    "nothing downloaded")


def test_the_team_signature_with_junk_in_its_base64_is_refused(keys: Any) -> None:
    """A decoder that skips what is not base64 would read the team's very signature."""
    good = json.loads(sign_set(_body(), SHAS, keys.team))
    assert verified_sha256s(json.dumps(good).encode(), keys.trusted, WHERE) == SHAS
    text = good["signatures"][0]["ed25519"]
    for junk in (text[:10] + "!" + text[10:], text + "\n", " " + text, text[:40] + "*" + text[40:]):
        doc = {**good, "signatures": [{**good["signatures"][0], "ed25519": junk}]}
        assert _refusal(doc, keys.trusted) == (
            f"{WHERE}: the set is refused: its signature by {keys.team.key_id} is not base64; "
            "nothing downloaded")


def test_a_trusted_key_that_does_not_verify_is_named_before_an_unknown_signer(keys: Any) -> None:
    """Two signatures: another key's (not trusted), then the team key's over another body.
    The refusal says the team's does not verify (the set was changed), not 'not trusted'."""
    good = json.loads(sign_set(_body(), SHAS, keys.team))
    changed = {**good, "chunk_size": 1 << 21}  # a bucket writer's change after signing
    theirs = _sign(changed, keys.evil)["signatures"]
    for sigs in (theirs + good["signatures"], good["signatures"] + theirs):
        said = _refusal({**changed, "signatures": sigs}, keys.trusted)
        assert said == (f"{WHERE}: the set is refused: its signature by {keys.team.key_id} "
                        "does not verify: the set manifest was changed after it was signed; "
                        "nothing downloaded"), said


@pytest.mark.parametrize("sigs", [[], {}, "", None])
def test_no_signature_at_all_is_not_signed(keys: Any, sigs: Any) -> None:
    doc = json.loads(sign_set(_body(), SHAS, keys.team))
    doc["signatures"] = sigs
    assert _refusal(doc, keys.trusted) == (
        f"{WHERE}: the set is refused: not signed (only sets signed by the trusted keys are "
        "fetched); nothing downloaded")


def test_signatures_that_are_a_map_are_refused(keys: Any) -> None:
    doc = json.loads(sign_set(_body(), SHAS, keys.team))
    doc["signatures"] = {"0": doc["signatures"][0]}
    assert "its signatures are not a list of at most 8" in _refusal(doc, keys.trusted)


def test_a_signature_of_another_length_does_not_verify(keys: Any) -> None:
    good = json.loads(sign_set(_body(), SHAS, keys.team))
    raw = base64.b64decode(good["signatures"][0]["ed25519"])
    for sig in (raw + b"\0", raw[:63]):
        doc = {**good, "signatures": [{"key": keys.team.key_id,
                                       "ed25519": base64.b64encode(sig).decode()}]}
        assert "does not verify" in _refusal(doc, keys.trusted)


# --- key files ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610, 0o601])
def test_a_signing_key_any_other_user_may_read_or_write_is_refused(keys: Any, mode: int) -> None:
    path = keys.dir / "team.key"
    before = path.read_bytes()
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as caught:
        load_signing_key(path)
    # A private key is held to 0600 as ssh holds one: the fix said is always chmod 600.
    assert str(caught.value) == (f"signing key {path} has mode {mode:04o}: other users could "
                                 "read it; chmod 600 it")
    assert path.read_bytes() == before and stat.S_IMODE(path.stat().st_mode) == mode
    os.chmod(path, 0o400)
    assert load_signing_key(path).key_id == keys.team.key_id


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_trusted_key_others_may_write_is_refused_and_one_they_may_read_is_not(
        keys: Any, mode: int) -> None:
    path = keys.dir / "team.key.pub"
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as caught:
        load_public_key(path)
    assert str(caught.value) == (f"trusted key {path} has mode {mode:04o}: other users could "
                                 "replace it; chmod go-w it")
    os.chmod(path, 0o644)
    assert load_public_key(path).key_id == keys.team.key_id


def test_keygen_refuses_a_dangling_link_at_the_public_name_and_writes_nothing(
        tmp_path: Path) -> None:
    d = tmp_path / "k"
    d.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.pub"
    os.symlink(target, d / "ci.key.pub")
    with pytest.raises(FileExistsError) as caught:
        keygen(d / "ci.key")
    assert str(caught.value) == (f"{d / 'ci.key.pub'} exists: keygen never overwrites a key; "
                                 "pick another PATH or remove it")
    assert sorted(os.listdir(d)) == ["ci.key.pub"] and not os.path.lexists(target)


def test_keygen_makes_exactly_0600_and_0644_whatever_the_umask(tmp_path: Path) -> None:
    for umask in (0o077, 0o000, 0o027):
        d = tmp_path / f"k{umask:o}"
        d.mkdir(mode=0o700)
        old = os.umask(umask)
        try:
            keygen(d / "ci.key")
        finally:
            os.umask(old)
        assert stat.S_IMODE((d / "ci.key").stat().st_mode) == 0o600
        assert stat.S_IMODE((d / "ci.key.pub").stat().st_mode) == 0o644
        load_signing_key(d / "ci.key")
        load_public_key(d / "ci.key.pub")


def test_a_key_of_another_algorithm_is_a_key_file_error(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    key, pub = tmp_path / "ec.key", tmp_path / "ec.pub"
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    os.chmod(key, 0o600)
    os.chmod(pub, 0o644)
    with pytest.raises(KeyFileError) as caught:
        load_signing_key(key)
    assert str(caught.value).startswith(f"signing key {key} is a ")
    assert str(caught.value).endswith(", not ed25519 (make one with `trtet-store cache keygen "
                                      "PATH`)")
    with pytest.raises(KeyFileError, match="not ed25519"):
        load_public_key(pub)
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        load_signing_key(key)
    pub.write_bytes(b"ssh-ed25519 AAAA\n")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(pub)
