"""Signatures over content: a signed tier pointer names each file by sha256, on SeaweedFS.

xxh3-128 is not a cryptographic digest: an ed25519 signature over it is only
as strong as xxh3's second-preimage resistance, which it does not claim. So
a signed pointer names each file by sha256 as well (taken in the pass that
already digests the bytes, never by reading them again), and a reader with
trusted keys checks the downloaded bytes' sha256, taken as they arrive,
against the signed pointer's. Nobody can find an xxh3 collision for a test,
so the forger here holds the team key and signs a pointer whose xxh3 is the
stored bytes' and whose sha256 is not: exactly what a second preimage of
xxh3 would give a bucket writer against a reader that checked xxh3 only.
The bucket writer is boto3 on the server directly; no torch here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from keyed import with_keys

from trtet_store.cache.tier import RemoteEntry, RemoteTier, TierEntryError, TierSignatureError
from trtet_store.io import bytes_digested

MiB = 1 << 20


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    return s3env


def _tier(env: Any, origin: str, **kw: Any) -> RemoteTier:
    return RemoteTier(f"s3://{env.bucket}/c", endpoint_url=env.endpoint.url, origin=origin,
                      journal_dir=env.journal_dir / origin, **kw)


def _files(d: Path, sizes: tuple[int, ...] = (2 * MiB + 5, 3000)) -> list[tuple[str, Path]]:
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i, size in enumerate(sizes):
        p = d / ("record" if i == 0 else f"e{i - 1}")
        p.write_bytes(os.urandom(size))
        out.append((p.name, p))
    return out


def _pointer(env: Any, key: str) -> tuple[dict, str]:
    got = env.client.get_object(Bucket=env.bucket, Key=f"c/{key}.json")
    return json.loads(got["Body"].read()), got["ETag"]


def _put_pointer(env: Any, key: str, doc: dict) -> None:
    """The bucket writer: the pointer replaced with boto3, no condition."""
    env.client.put_object(Bucket=env.bucket, Key=f"c/{key}.json",
                          Body=json.dumps(doc, sort_keys=True).encode())


def _signed(doc: dict, key_path: Path) -> dict:
    """``doc`` re-signed with the key at ``key_path`` (its old signatures dropped)."""
    from trtet_store.cache.tier.signing import load_signing_key, sign_entry

    entry = RemoteEntry.from_json(json.dumps({k: v for k, v in doc.items()
                                              if k != "signature"}).encode(), "x")
    sign_entry(entry, load_signing_key(key_path))
    return json.loads(entry.to_json())


def _left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_a_signed_pointer_names_each_file_by_sha256_taken_in_the_download_pass(
        env: Any, tmp_path: Path) -> None:
    files = _files(tmp_path / "src")
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    # One file handed over with its xxh3 (as the local cache does), one without.
    size, digest = len(files[0][1].read_bytes()), xxhash.xxh3_128_hexdigest(
        files[0][1].read_bytes())
    pub = a.publish("k1", [(files[0][0], files[0][1], digest), files[1]], {"kind": "t"})
    assert pub.published
    doc, _ = _pointer(env, "k1")
    assert doc["signature"]["key"] == env.team.key_id
    for f, (_, p) in zip(doc["files"], files, strict=True):
        assert f["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        assert f["digest"] == xxhash.xxh3_128_hexdigest(p.read_bytes())
    assert doc["files"][0]["size"] == size

    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    entry = b.lookup("k1")
    before = bytes_digested()
    got = b.download(entry, tmp_path / "dl")
    # Each byte digested once: the chunk checks, the xxh3 and the sha256 in one pass.
    assert bytes_digested() - before == entry.size
    for name, p in files:
        assert got.digests[name].sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
        assert got.paths[name].read_bytes() == p.read_bytes()


def test_the_downloaded_bytes_sha256_must_be_the_signed_pointers(env: Any,
                                                                 tmp_path: Path) -> None:
    files = _files(tmp_path / "src")
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    assert a.publish("k2", files, {"kind": "t"}).published
    doc, _ = _pointer(env, "k2")
    honest = json.loads(json.dumps(doc))
    # What a second preimage of xxh3 gives a bucket writer: bytes whose size and xxh3
    # are the signed pointer's and whose sha256 is not. Written here the other way
    # round (the signed sha256 is of other bytes; the stored bytes keep their xxh3).
    doc["files"][1]["sha256"] = hashlib.sha256(b"the bytes the signer meant").hexdigest()
    _put_pointer(env, "k2", _signed(doc, env.keys / "team.key"))
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    entry = b.lookup("k2")
    assert b.signature_problem(entry) is None  # the signature itself verifies
    with pytest.raises(TierEntryError) as caught:
        b.download(entry, tmp_path / "dl")
    said = str(caught.value)
    assert "file e0: sha256 " in said and "the signed pointer says" in said, said
    assert "\n" not in said and caught.value.name == "e0"
    assert _left(tmp_path / "dl") == []  # nothing served, nothing kept
    # The honest pointer again: served, byte for byte.
    _put_pointer(env, "k2", honest)
    got = b.download(b.lookup("k2"), tmp_path / "dl2")
    assert [got.paths[n].read_bytes() for n, _ in files] == [p.read_bytes() for _, p in files]


def test_a_resumed_file_is_checked_by_sha256_too(env: Any, tmp_path: Path) -> None:
    files = _files(tmp_path / "src")
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    assert a.publish("k3", files, {"kind": "t"}).published
    doc, _ = _pointer(env, "k3")
    doc["files"][0]["sha256"] = "0" * 64
    _put_pointer(env, "k3", _signed(doc, env.keys / "team.key"))
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    # The directory already holds the files (a download that completed): read once here.
    dl = tmp_path / "dl"
    dl.mkdir()
    for name, p in files:
        (dl / name).write_bytes(p.read_bytes())
    with pytest.raises(TierEntryError, match="file record: sha256 .* the signed pointer says 0"):
        b.download(b.lookup("k3"), dl)
    assert _left(dl) == []


def _v1_signed(doc: dict, key_path: Path) -> dict:
    """``doc`` signed the way versions before sha256 signed: over xxh3-128 only."""
    from trtet_store.cache.tier.signing import load_signing_key

    key = load_signing_key(key_path)
    record = {k: v for k, v in doc.items() if k != "signature"}
    data = b"trtet-store/cache-entry-signature/1\n" + json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return {**record, "signature": {"key": key.key_id,
                                    "ed25519": base64.b64encode(key.sign(data)).decode()}}


def test_an_entry_signed_over_xxh3_only_is_refused_with_trusted_keys(env: Any,
                                                                     tmp_path: Path) -> None:
    from trtet_store.cache.tier.signing import sign_entry

    files = _files(tmp_path / "src")
    a = _tier(env, "a")  # unsigned: no sha256 named
    assert a.publish("k4", files, {"kind": "t"}).published
    doc, _ = _pointer(env, "k4")
    assert all("sha256" not in f for f in doc["files"])
    _put_pointer(env, "k4", _v1_signed(doc, env.keys / "team.key"))
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    entry = b.lookup("k4")
    with pytest.raises(TierSignatureError) as caught:
        b.download(entry, tmp_path / "dl")
    said = str(caught.value)
    assert "names its files by xxh3-128 only (record, e0 without sha256" in said, said
    assert "publish it again with the signing key" in said and "\n" not in said
    assert _left(tmp_path / "dl") == []
    # Nobody signs over xxh3 alone any more.
    from trtet_store.cache.tier.signing import load_signing_key
    with pytest.raises(ValueError, match="not named by sha256"):
        sign_entry(entry, load_signing_key(env.keys / "team.key"))
    # Without trusted keys it is an unsigned entry like any other (checked by xxh3).
    assert _tier(env, "c").download(entry, tmp_path / "plain").paths


def test_several_signatures_one_trusted_is_enough_and_a_bad_one_counts_for_nothing(
        env: Any, tmp_path: Path) -> None:
    from trtet_store.cache.tier.signing import load_signing_key, sign_entry

    files = _files(tmp_path / "src", (MiB + 1,))
    a = _tier(env, "a", signing_key=env.keys / "evil.key")
    assert a.publish("k5", files, {"kind": "t"}).published
    entry = a.lookup("k5")
    sign_entry(entry, load_signing_key(env.keys / "team.key"))  # a second signer (Nix style)
    assert [s["key"] for s in entry.signatures()] == [env.evil.key_id, env.team.key_id]
    _put_pointer(env, "k5", json.loads(entry.to_json()))
    team = _tier(env, "t", trusted_keys=[env.keys / "team.key.pub"])
    evil = _tier(env, "e", trusted_keys=[env.keys / "evil.key.pub"])
    both = [team.lookup("k5"), evil.lookup("k5")]
    assert [team.signature_problem(both[0]), evil.signature_problem(both[1])] == [None, None]
    assert team.download(both[0], tmp_path / "t").paths["record"].read_bytes() == \
        files[0][1].read_bytes()

    # The team's signature spoiled (one bit), the other's intact: the team refuses it.
    doc = json.loads(entry.to_json())
    raw = bytearray(base64.b64decode(doc["signature"][1]["ed25519"]))
    raw[0] ^= 1
    doc["signature"][1]["ed25519"] = base64.b64encode(bytes(raw)).decode()
    _put_pointer(env, "k5", doc)
    spoiled = team.lookup("k5")
    with pytest.raises(TierSignatureError, match=f"its signature by {env.team.key_id} does "
                       "not verify"):
        team.download(spoiled, tmp_path / "t2")
    assert _left(tmp_path / "t2") == []
    assert evil.signature_problem(evil.lookup("k5")) is None


def test_a_pointer_whose_sha256_is_not_one_is_damaged(env: Any, tmp_path: Path) -> None:
    files = _files(tmp_path / "src", (1000,))
    assert _tier(env, "a", signing_key=env.keys / "team.key").publish("k6", files, {}).published
    doc, _ = _pointer(env, "k6")
    doc["files"][0]["sha256"] = "ABC" * 30
    _put_pointer(env, "k6", doc)
    got = _tier(env, "b").read_pointer("k6")
    assert "has sha256 'ABCABC" in got.reason and "not a sha256 hex digest" in got.reason


def test_the_signature_covers_each_files_sha256(env: Any, tmp_path: Path) -> None:
    files = _files(tmp_path / "src", (MiB + 3, 10))
    assert _tier(env, "a", signing_key=env.keys / "team.key").publish("k7", files,
                                                                      {}).published
    doc, _ = _pointer(env, "k7")
    # A bucket writer names other bytes by sha256 (those it would put in place),
    # leaving the team's signature as it was.
    doc["files"][0]["sha256"] = hashlib.sha256(b"the forger's bytes").hexdigest()
    _put_pointer(env, "k7", doc)
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    entry = b.lookup("k7")
    assert b.signature_problem(entry) == (f"its signature by {env.team.key_id} does not "
                                          "verify: the pointer was changed after it was signed")
    with pytest.raises(TierSignatureError):
        b.download(entry, tmp_path / "dl")
    assert _left(tmp_path / "dl") == []


def _list(env: Any, capsys: pytest.CaptureFixture, *more: object) -> tuple[int, str]:
    """``trtet-store cache list --remote`` (in this process: the same entry point)."""
    from trtet_store.cli import main

    capsys.readouterr()
    rc = main(["cache", "list", "--remote", f"s3://{env.bucket}/c", "--endpoint-url",
               env.endpoint.url, *map(os.fspath, more)])
    return rc, capsys.readouterr().out


def test_a_listing_without_keys_says_a_signer_is_claimed_not_checked(
        env: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A bucket writer's pointer that names the team's key id with a signature that is
    nothing: without keys the listing cannot know, and must not say "signed by"."""
    files = _files(tmp_path / "src", (1000,))
    assert _tier(env, "a").publish("forged", files, {}).published  # unsigned
    doc, _ = _pointer(env, "forged")
    doc["signature"] = {"key": env.team.key_id,
                        "ed25519": base64.b64encode(b"\0" * 64).decode()}
    _put_pointer(env, "forged", doc)
    assert _tier(env, "s", signing_key=env.keys / "team.key").publish("real", files,
                                                                      {}).published
    rc, out = _list(env, capsys)
    assert rc == 0, out
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert rows["forged"].endswith(f"claims {env.team.key_id}, not checked"), rows
    assert rows["real"].endswith(f"claims {env.team.key_id}, not checked"), rows
    got = {r["key"]: r for r in json.loads(_list(env, capsys, "--json")[1])}
    assert (got["forged"]["signed_by"], got["forged"]["claims"], got["forged"]["checked"]) == \
        (None, [env.team.key_id], False)
    rc, out = _list(env, capsys, "--trusted-key", env.keys / "team.key.pub")
    assert rc == 0, out
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert rows["forged"].endswith(f"claims {env.team.key_id} (refused)"), rows
    assert rows["real"].endswith(f"  {env.team.key_id}"), rows


def test_a_pointer_with_more_signatures_than_are_read_is_refused(env: Any,
                                                                 tmp_path: Path) -> None:
    """Each signature costs a verification: a bucket writer's pointer with thousands would
    cost each reader that many; past 8 it is refused, even with the team's among them."""
    files = _files(tmp_path / "src", (100,))
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    assert a.publish("k8", files, {}).published
    doc, _ = _pointer(env, "k8")
    junk = {"key": env.evil.key_id, "ed25519": base64.b64encode(b"\1" * 64).decode()}
    doc["signature"] = [junk] * 8 + [doc["signature"]]
    _put_pointer(env, "k8", doc)
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    assert b.signature_problem(b.lookup("k8")) == "carries 9 signatures, more than the 8 read"
    doc["signature"] = doc["signature"][1:]  # 8: read, and the team's verifies
    _put_pointer(env, "k8", doc)
    assert b.signature_problem(b.lookup("k8")) is None


def test_a_signed_publish_of_files_handed_over_with_their_xxh3_reads_them_once(
        env: Any, tmp_path: Path) -> None:
    """The local cache hands its files over with their xxh3 (sealed when they entered): the
    sha256 the signature needs is taken by the upload's own pass, not by a read of its own."""
    files = _files(tmp_path / "src", (3 * MiB + 1, 5000))
    handed = [(n, p, xxhash.xxh3_128_hexdigest(p.read_bytes())) for n, p in files]
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    before = bytes_digested()
    assert a.publish("k9", handed, {}).published
    size = sum(p.stat().st_size for _, p in files)
    assert bytes_digested() - before == size  # the upload's pass, once
    doc, _ = _pointer(env, "k9")
    assert [f["sha256"] for f in doc["files"]] == \
        [hashlib.sha256(p.read_bytes()).hexdigest() for _, p in files]
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    got = b.download(b.lookup("k9"), tmp_path / "dl")
    assert [got.paths[n].read_bytes() for n, _ in files] == [p.read_bytes() for _, p in files]


def test_a_signed_publish_that_finds_its_upload_complete_reads_each_file_once(
        env: Any, tmp_path: Path) -> None:
    """A publisher killed between its upload and its pointer: the next run sends nothing
    (its attempt is complete), so it reads each file once for the sha256, checked against
    the xxh3 it publishes."""
    files = _files(tmp_path / "src", (MiB + 9,))
    handed = [(n, p, xxhash.xxh3_128_hexdigest(p.read_bytes())) for n, p in files]
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    assert a.publish("k10", handed, {}).published
    env.client.delete_object(Bucket=env.bucket, Key="c/k10.json")  # as if killed before it
    before = bytes_digested()
    again = a.publish("k10", handed, {})
    assert again.published and again.sent == 0
    assert bytes_digested() - before == files[0][1].stat().st_size
    doc, _ = _pointer(env, "k10")
    assert doc["files"][0]["sha256"] == hashlib.sha256(files[0][1].read_bytes()).hexdigest()
    # The file changed since its xxh3 was handed over: refused, no pointer.
    env.client.delete_object(Bucket=env.bucket, Key="c/k10.json")
    files[0][1].write_bytes(os.urandom(MiB + 9))
    with pytest.raises(ValueError, match="not the .* it was published with"):
        a.publish("k10", handed, {})
    assert a.read_pointer("k10") is None
