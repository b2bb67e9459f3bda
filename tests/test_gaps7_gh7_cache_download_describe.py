"""What ``describe`` (trtet_store.remote.download.describe) refuses before any object byte.

``describe(reader, bucket, key, dest, names, trusted)`` reads a program's manifest: with
trusted keys, a program with no manifest and a manifest no trusted key vouches for are
``ProgramSignatureError`` (nothing downloaded, no HEAD); a manifest that is not JSON is a
``ManifestError`` naming where it is. The specs of a signed manifest are marked
``signed`` (each range then checked by sha256). The bucket writer is boto3 on SeaweedFS.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from keyed import with_keys

import trtet_store
from trtet_store.remote.download import describe as describe_module
from trtet_store.remote.download.describe import describe
from trtet_store.remote.download.reader import Reader
from trtet_store.remote.errors import ManifestError, ProgramSignatureError
from trtet_store.remote.s3 import S3

KEY = "m/model.pte"
MKEY = KEY + ".trtet.json"


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    s3env.reader = Reader(S3(client=s3env.client), s3env.bucket)
    return s3env


def _publish(env: Any, tmp_path: Path, signing_key: Any) -> None:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "model.pte").write_bytes(os.urandom(70_000))
    trtet_store.publish([os.fspath(src / "model.pte")], f"s3://{env.bucket}/{KEY}",
                        endpoint_url=env.endpoint.url, journal_dir=env.journal_dir,
                        signing_key=signing_key, replace=True)


def test_a_signed_manifests_specs_are_marked_signed(env: Any, tmp_path: Path) -> None:
    _publish(env, tmp_path, env.keys / "team.key")
    trusted = {env.team.key_id: env.team}
    found, _, specs, why = describe_module.describe(env.reader, env.bucket, KEY,
                                                    tmp_path / "out" / "model.pte", None,
                                                    trusted)
    assert found and why is None
    assert [s.signed for s in specs] == [True]
    _, _, plain, _ = describe(env.reader, env.bucket, KEY, tmp_path / "out" / "model.pte", None)
    assert [s.signed for s in plain] == [False]


def test_a_program_without_a_manifest_is_refused_with_trusted_keys(env: Any,
                                                                  tmp_path: Path) -> None:
    env.client.put_object(Bucket=env.bucket, Key=KEY, Body=b"a bare program")
    trusted = {env.team.key_id: env.team}
    with pytest.raises(ProgramSignatureError) as caught:
        describe(env.reader, env.bucket, KEY, tmp_path / "model.pte", None, trusted)
    assert str(caught.value).startswith(f"s3://{env.bucket}/{MKEY}: the program is refused: "
                                        "it has no manifest"), caught.value
    # Without keys the bare object is the program (a plain HEAD).
    found, _, specs, _ = describe(env.reader, env.bucket, KEY, tmp_path / "model.pte", None)
    assert not found and [s.key for s in specs] == [KEY]


def test_an_unsigned_manifest_is_refused_with_trusted_keys(env: Any, tmp_path: Path) -> None:
    _publish(env, tmp_path, None)
    trusted = {env.team.key_id: env.team}
    with pytest.raises(ProgramSignatureError, match="the program is refused: not signed"):
        describe(env.reader, env.bucket, KEY, tmp_path / "model.pte", None, trusted)


def test_a_manifest_that_is_not_json_is_a_manifest_error_naming_it(env: Any,
                                                                  tmp_path: Path) -> None:
    env.client.put_object(Bucket=env.bucket, Key=KEY, Body=b"a program")
    env.client.put_object(Bucket=env.bucket, Key=MKEY, Body=b"{not json")
    for trusted in (None, {env.team.key_id: env.team}):
        with pytest.raises(ManifestError) as caught:
            describe(env.reader, env.bucket, KEY, tmp_path / "model.pte", None, trusted)
        assert str(caught.value).startswith(f"s3://{env.bucket}/{MKEY}: "), caught.value
        assert not isinstance(caught.value, ProgramSignatureError)
