"""A program's manifest as a signed root: objects and chunks named by sha256, checked with keys.

``publish(signing_key=...)`` adds each object's sha256 and each chunk's (taken
in the pass that reads the bytes for their xxh3 and CRC) and an ed25519
signature to ``<key>.trtet.json``; ``fetch(trusted_keys=...)`` refuses a
program no trusted key vouches for before a byte of an object is downloaded,
and refuses bytes (downloaded now, or found in a local file to reuse) whose
sha256 is not the signed one. The bucket writer is boto3 on SeaweedFS. The
"second preimage" forger (nobody can find an xxh3 collision for a test) is
stood in for as in test_sets_signed: a manifest signed with the team key
whose xxh3, CRC and ETag fields are those of other bytes while its sha256
fields are the publisher's; a reader that checked only xxh3 would take them.
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
from attacker import listing, tree
from keyed import with_keys
from sets_helpers import write

import trtet_store
from trtet_store.remote.errors import ObjectChangedError, ProgramSignatureError
from trtet_store.remote.manifest import SIGNATURE_DOMAIN

MiB = 1 << 20
KEY = "m/model.pte"
MKEY = KEY + ".trtet.json"


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.url = f"s3://{s3env.bucket}/{KEY}"
    return s3env


def _sources(root: Path) -> list[Path]:
    """Plain byte files under a program's names: a .pte of three chunks, a .ptd of two."""
    return [write(root / "src" / "model.pte", 2 * MiB + 5, 1),
            write(root / "src" / "cpu.ptd", MiB + 3, 2)]


def _publish(env: Any, files: list[Path], url: str | None = None, **kw: Any) -> Any:
    return trtet_store.publish([os.fspath(f) for f in files], url or env.url,
                               endpoint_url=env.endpoint.url, journal_dir=env.journal_dir, **kw)


def _doc(env: Any) -> dict:
    return json.loads(env.client.get_object(Bucket=env.bucket, Key=MKEY)["Body"].read())


def _put(env: Any, doc: dict) -> None:
    """The bucket writer: the manifest replaced with boto3, no condition."""
    env.client.put_object(Bucket=env.bucket, Key=MKEY, Body=(
        json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode())


def _signed(doc: dict, key_path: Path) -> dict:
    """``doc`` signed (alone) by the key at ``key_path``, over the program manifest's domain."""
    from trtet_store.remote.keys import load_signing_key
    from trtet_store.remote.signing import sign_document

    bare = {k: v for k, v in doc.items() if k != "signatures"}
    return json.loads(sign_document(bare, load_signing_key(key_path), SIGNATURE_DOMAIN))


def _fetch(env: Any, dest: Path, key: str = "team", **kw: Any) -> Any:
    kw.setdefault("endpoint_url", env.endpoint.url)
    return trtet_store.fetch(env.url, dest, trusted_keys=[env.keys / f"{key}.key.pub"], **kw)


def _victim(root: Path) -> Path:
    """A destination directory that holds an older program and a file of the user's."""
    out = root / "out"
    write(out / "model.pte", MiB + 77, 9)
    write(out / "notes.txt", 100, 10)
    return out


def _chunks_sha256(data: bytes) -> list[str]:
    return [hashlib.sha256(data[i:i + MiB]).hexdigest() for i in range(0, len(data), MiB)]


def _replace_object(env: Any, key: str, data: bytes) -> str:
    """The bucket writer puts ``data`` at ``key`` (with a full-object CRC64NVME); its ETag."""
    env.client.put_object(Bucket=env.bucket, Key=key, Body=data,
                          ChecksumAlgorithm="CRC64NVME")
    return env.client.head_object(Bucket=env.bucket, Key=key)["ETag"].strip('"')


def _fields_of(data: bytes) -> dict:
    """An object entry's xxh3-128, xxh3-64 chunk digests and CRC64NVME for ``data``."""
    from trtet_store.remote.checksum import crc64nvme

    return {"xxh3": xxhash.xxh3_128_hexdigest(data),
            "chunks": [xxhash.xxh3_64_intdigest(data[i:i + MiB])
                       for i in range(0, len(data), MiB)],
            "crc64nvme": base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()}


# --- the happy path ------------------------------------------------------------------------


def test_a_signed_program_names_its_bytes_by_sha256_and_is_fetched_with_trusted_keys(
        env: Any, here_fs: Path) -> None:
    files = _sources(here_fs)
    _publish(env, files, signing_key=env.keys / "team.key")
    doc = _doc(env)
    assert [s["key"] for s in doc["signatures"]] == [env.team.key_id]
    for o, f in zip(doc["objects"], files, strict=True):
        data = f.read_bytes()
        assert o["sha256"] == hashlib.sha256(data).hexdigest()
        assert [h for p in o["pieces"] for h in p["sha256"]] == _chunks_sha256(data)
    out = _victim(here_fs)
    report = _fetch(env, out / "model.pte")
    assert [(out / f.name).read_bytes() for f in files] == [f.read_bytes() for f in files]
    assert report.bytes_downloaded == sum(f.stat().st_size for f in files)
    assert sorted(os.listdir(out)) == ["cpu.ptd", "model.pte", "notes.txt"]
    # Unsigned readers read it as before (they ignore the new fields).
    plain = here_fs / "plain"
    plain.mkdir()
    trtet_store.fetch(env.url, plain / "model.pte", endpoint_url=env.endpoint.url)
    assert (plain / "model.pte").read_bytes() == files[0].read_bytes()
    # Fetched again with keys: up to date, every chunk of the old files checked by sha256.
    again = _fetch(env, out / "model.pte")
    assert again.up_to_date and again.bytes_downloaded == 0


def test_signing_reads_no_byte_more_than_an_unsigned_publish(env: Any, here_fs: Path) -> None:
    """The sha256 (whole and per chunk) comes out of the pass that reads for xxh3 and CRC."""
    from trtet_store.io import bytes_digested

    files = _sources(here_fs)
    spent = []
    for name, key in (("plain", None), ("signed", env.keys / "team.key")):
        before = bytes_digested()
        _publish(env, files, f"s3://{env.bucket}/{name}/model.pte", signing_key=key,
                 index=False)
        spent.append(bytes_digested() - before)
    assert spent[1] == spent[0] == sum(f.stat().st_size for f in files), spent
    assert "signatures" in json.loads(env.client.get_object(
        Bucket=env.bucket, Key="signed/model.pte.trtet.json")["Body"].read())


def test_a_republish_of_the_same_bytes_is_signed_too(env: Any, here_fs: Path) -> None:
    """Objects kept unchanged in the bucket (never sent again) are named by sha256 as well,
    from the pass that reads them to find them unchanged: no byte more than unsigned."""
    from trtet_store.io import bytes_digested

    files = _sources(here_fs)
    _publish(env, files, index=False)
    spent = []
    for key in (None, env.keys / "team.key"):
        before = bytes_digested()
        report = _publish(env, files, signing_key=key, replace=True, index=False)
        spent.append(bytes_digested() - before)
        assert report.bytes_unchanged == report.bytes_total
    assert spent[1] == spent[0], spent
    doc = _doc(env)
    assert [o["sha256"] for o in doc["objects"]] == \
        [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    out = here_fs / "out"
    out.mkdir()
    _fetch(env, out / "model.pte")
    assert (out / "cpu.ptd").read_bytes() == files[1].read_bytes()
    # Published again unsigned: no sha256 left over from the signed version it replaced.
    _publish(env, files, replace=True, index=False)
    assert "sha256" not in json.dumps(_doc(env))


# --- refused before any byte of an object is downloaded --------------------------------------


ATTACKS = ["unsigned", "untrusted signer", "digest changed", "signature dropped",
           "re-signed by another key", "xxh3 only", "no manifest",
           "object and its xxh3 fields replaced"]


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_manifest_no_trusted_key_vouches_for_is_refused_before_any_download(
        env: Any, here_fs: Path, attack: str) -> None:
    from trtet_store.testing.proxy import CountingProxy

    files = _sources(here_fs)
    _publish(env, files, signing_key=None if attack == "unsigned" else
             env.keys / ("evil.key" if attack == "untrusted signer" else "team.key"))
    doc = _doc(env)
    said = f"its signature by {env.team.key_id} does not verify: the manifest was changed " \
        "after it was signed"
    if attack == "unsigned":
        said = "the program is refused: not signed (only programs signed by the trusted " \
            "keys are fetched)"
    elif attack == "untrusted signer":
        said = f"signed by '{env.evil.key_id}', not one of the trusted keys"
    elif attack == "digest changed":
        doc["objects"][1]["pieces"][0]["sha256"][0] = hashlib.sha256(b"x").hexdigest()
        _put(env, doc)
    elif attack == "signature dropped":
        del doc["signatures"]
        _put(env, doc)
        said = "not signed"
    elif attack == "re-signed by another key":
        _put(env, _signed(doc, env.keys / "evil.key"))
        said = f"signed by '{env.evil.key_id}', not one of the trusted keys"
    elif attack == "xxh3 only":
        for o in doc["objects"]:
            del o["sha256"]
            for p in o["pieces"]:
                del p["sha256"]
        _put(env, doc)
        said = "names its objects by xxh3 only"
    elif attack == "no manifest":
        env.client.delete_object(Bucket=env.bucket, Key=MKEY)
        said = "it has no manifest"
    else:
        # The .ptd replaced (same size), and every field that names it by xxh3, CRC and
        # ETag fixed up to the new bytes: the signature no longer verifies.
        evil = os.urandom(files[1].stat().st_size)
        o = doc["objects"][1]
        o["etag"] = _replace_object(env, o["key"], evil)
        fields = _fields_of(evil)
        o["crc64nvme"] = fields["crc64nvme"]
        o["pieces"][0]["xxh3"], o["pieces"][0]["chunks"] = fields["xxh3"], fields["chunks"]
        _put(env, doc)
    out = _victim(here_fs)
    before = listing(out)
    with CountingProxy.for_url(env.endpoint.url) as proxy, \
            pytest.raises(ProgramSignatureError) as caught:
        _fetch(env, out / "model.pte", endpoint_url=proxy.endpoint_url)
    text = str(caught.value)
    assert said in text and "\n" not in text, text
    assert text.startswith(f"s3://{env.bucket}/{MKEY}: the program is refused: ")
    assert text.endswith("; nothing downloaded"), text
    # The manifest (a few KiB) and nothing of an object (each over 1 MiB).
    assert proxy.downstream < 64 * 1024, proxy.downstream
    assert listing(out) == before  # destination untouched, nothing added (no staging)


def test_an_object_replaced_under_a_signed_manifest_is_refused(env: Any,
                                                              here_fs: Path) -> None:
    """The bucket writer replaces the .ptd (same size) and leaves the manifest alone."""
    files = _sources(here_fs)
    _publish(env, files, signing_key=env.keys / "team.key")
    _replace_object(env, "m/cpu.ptd", os.urandom(files[1].stat().st_size))
    out = _victim(here_fs)
    before = listing(out)
    with pytest.raises(ObjectChangedError):
        _fetch(env, out / "model.pte", if_replaced="error")
    assert listing(out) == before


# --- bytes whose sha256 is not the signed one (the xxh3 forger stood in for) -----------------


def _forged(env: Any, files: list[Path], evil: bytes) -> None:
    """The .ptd replaced by ``evil`` (same size) under a manifest whose xxh3, CRC and ETag
    fields are ``evil``'s and whose sha256 fields are the publisher's, signed by the team key:
    what an xxh3 second preimage would give a bucket writer."""
    _publish(env, files, signing_key=env.keys / "team.key")
    doc = _doc(env)
    o = doc["objects"][1]
    o["etag"] = _replace_object(env, o["key"], evil)
    fields = _fields_of(evil)
    o["crc64nvme"] = fields["crc64nvme"]
    o["pieces"][0]["xxh3"], o["pieces"][0]["chunks"] = fields["xxh3"], fields["chunks"]
    assert o["sha256"] == hashlib.sha256(files[1].read_bytes()).hexdigest()
    _put(env, _signed(doc, env.keys / "team.key"))


def test_downloaded_bytes_whose_sha256_is_not_the_signed_one_are_not_placed(
        env: Any, here_fs: Path) -> None:
    files = _sources(here_fs)
    evil = os.urandom(files[1].stat().st_size)
    _forged(env, files, evil)
    out = _victim(here_fs)
    write(out / "cpu.ptd", 333, 11)
    before = listing(out)
    with pytest.raises(ProgramSignatureError) as caught:
        _fetch(env, out / "model.pte")
    text = str(caught.value)
    assert f"s3://{env.bucket}/m/cpu.ptd bytes 0-" in text and \
        "their sha256 is not the one the signed manifest names" in text, text
    assert "\n" not in text
    assert listing(out) == before  # nothing placed, nothing staged left behind
    # Without keys the same manifest is taken as before (its xxh3 fields agree).
    plain = here_fs / "plain"
    plain.mkdir()
    trtet_store.fetch(env.url, plain / "model.pte", endpoint_url=env.endpoint.url)
    assert (plain / "cpu.ptd").read_bytes() == evil


def test_a_local_file_whose_sha256_is_not_the_signed_one_is_not_reused(
        env: Any, here_fs: Path) -> None:
    """The destination holds the forger's bytes already (an unsigned fetch put them there):
    their xxh3 is the manifest's, their sha256 is not. Not reused, not 'up to date'."""
    files = _sources(here_fs)
    evil = os.urandom(files[1].stat().st_size)
    _forged(env, files, evil)
    out = here_fs / "out"
    out.mkdir()
    trtet_store.fetch(env.url, out / "model.pte", endpoint_url=env.endpoint.url)
    assert (out / "cpu.ptd").read_bytes() == evil
    before = listing(out)
    with pytest.raises(ProgramSignatureError):
        _fetch(env, out / "model.pte")
    assert listing(out) == before
    # A file given with reuse= is held to the same digests.
    fresh = here_fs / "fresh"
    fresh.mkdir()
    with pytest.raises(ProgramSignatureError):
        _fetch(env, fresh / "model.pte", reuse=[out / "model.pte"])
    assert os.listdir(fresh) == []


# --- the CLI, the environment and the config file ---------------------------------------------


def test_the_cli_signs_a_publish_and_checks_a_fetch(env: Any, here_fs: Path,
                                                    capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from trtet_store.cli import main

    files = _sources(here_fs)
    ep = ["--endpoint-url", env.endpoint.url]
    assert main(["publish", *map(os.fspath, files), env.url, "--signing-key",
                 os.fspath(env.keys / "team.key"), "--journal-dir",
                 os.fspath(env.journal_dir), "--no-progress", *ep]) == 0
    assert [s["key"] for s in _doc(env)["signatures"]] == [env.team.key_id]
    capsys.readouterr()
    out = _victim(here_fs)
    before = listing(out)
    rc = main(["fetch", env.url, os.fspath(out / "model.pte"), "--trusted-key",
               os.fspath(env.keys / "evil.key.pub"), "--no-progress", *ep])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"ProgramSignatureError: s3://{env.bucket}/{MKEY}: the program is refused: signed " \
        f"by '{env.team.key_id}', not one of the trusted keys" in err.splitlines()[0], err
    assert listing(out) == before
    # TRTET_TRUSTED_KEYS, then the config file: the same resolution as fetch-set's.
    monkeypatch.setenv("TRTET_TRUSTED_KEYS", os.fspath(env.keys / "evil.key.pub"))
    assert main(["fetch", env.url, os.fspath(out / "model.pte"), "--no-progress", *ep]) == 1
    assert "not one of the trusted keys" in capsys.readouterr().err
    monkeypatch.delenv("TRTET_TRUSTED_KEYS")
    config = here_fs / "config"
    config.write_text(f"[trtet_store]\ntrusted_keys = {env.keys / 'evil.key.pub'}\n")
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(config))
    assert main(["fetch", env.url, os.fspath(out / "model.pte"), "--no-progress", *ep]) == 1
    assert "not one of the trusted keys" in capsys.readouterr().err
    assert listing(out) == before
    config.write_text(f"[trtet_store]\ntrusted_keys = {env.keys / 'team.key.pub'}\n")
    assert main(["fetch", env.url, os.fspath(out / "model.pte"), "--no-progress", *ep]) == 0
    assert [(out / f.name).read_bytes() for f in files] == [f.read_bytes() for f in files]


def test_a_staged_range_whose_sha256_is_not_the_signed_one_is_not_resumed(
        env: Any, here_fs: Path, tcp_proxy: Any) -> None:
    """An unsigned fetch of the forger's version, cut off after the .ptd's first chunk (the
    forged one) was staged; the signed fetch that resumes it checks that chunk again."""
    from tcp_proxy import Fault

    from trtet_store.remote.errors import FetchInterruptedError
    from trtet_store.testing.s3server import S3Endpoint

    files = [write(here_fs / "src" / "model.pte", 2 * MiB + 5, 1),
             write(here_fs / "src" / "cpu.ptd", 3 * MiB + 3, 2)]
    honest = files[1].read_bytes()
    evil = os.urandom(MiB) + honest[MiB:]  # only the first chunk differs
    _forged(env, files, evil)
    out = here_fs / "out"
    out.mkdir()
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    # The .pte's three 1 MiB ranges and the .ptd's first get through; then every one resets.
    proxy = tcp_proxy(env.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                               skip=4, times=10_000)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError) as caught:
        trtet_store.fetch(env.url, out / "model.pte", client=client, range_size=MiB,
                          concurrency=1, attempts=1, trusted_keys=False)
    assert "cpu.ptd bytes 1048576-" in str(caught.value)  # its first chunk was staged
    assert sorted(os.listdir(out)) == [".trtet-staging"]
    with pytest.raises(ProgramSignatureError, match="their sha256 is not the one the signed"):
        _fetch(env, out / "model.pte", range_size=MiB, concurrency=1)
    # Nothing placed, and nothing staged kept (the forged chunk is not resumed again).
    assert os.listdir(out) in ([], [".trtet-staging"]), os.listdir(out)
    assert [n for n in tree(out) if n.endswith((".run", ".journal", ".blob"))] == []


def test_an_object_of_several_pieces_names_every_chunk_of_each_by_sha256(
        env: Any, here_fs: Path) -> None:
    """Pieces as a program's are laid out (inline header, a file range, inline tail), each on
    its own chunk grid: every chunk of every piece is named, and the fetch checks them."""
    from trtet_store.io import ExternalFile
    from trtet_store.remote.keys import load_signing_key
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    engine = write(here_fs / "src" / "engine.bin", 2 * MiB + 100, 5)
    head, tail = os.urandom(4096 + 7), os.urandom(MiB + 11)
    pieces = [head, ExternalFile.range(engine, 50, 2 * MiB), tail]
    publish_sources([ObjectSource("model.pte", pieces)], env.url,
                    endpoint_url=env.endpoint.url, journal_dir=env.journal_dir,
                    signing_key=load_signing_key(env.keys / "team.key"))
    body = engine.read_bytes()[50:50 + 2 * MiB]
    (o,) = _doc(env)["objects"]
    assert [p["sha256"] for p in o["pieces"]] == [_chunks_sha256(b) for b in (head, body, tail)]
    assert o["sha256"] == hashlib.sha256(head + body + tail).hexdigest()
    out = here_fs / "out"
    out.mkdir()
    _fetch(env, out / "model.pte")
    assert (out / "model.pte").read_bytes() == head + body + tail
