"""remote/upload/program.py ``publish``: a signing key that cannot be used is refused first.

``publish(signing_key=...)`` resolves the key (``resolve_signing``) "before a read":
a key file other users can read (mode 0644) or a public key given as the private one
is a KeyFileError (a missing one load_signing_key's FileNotFoundError, naming the key)
before the source is read (a source that does not
exist is not what is reported) and before any request: the bucket holds no object and
no open multipart upload, and no journal is made.
"""

from __future__ import annotations

import os

import pytest
from keyed import with_keys

import trtet_store
from trtet_store.remote.keys import KeyFileError


@pytest.fixture
def env(s3env, tmp_path, monkeypatch):
    return with_keys(s3env, tmp_path, monkeypatch)


def _bucket(env) -> tuple[list, list]:
    objects = env.client.list_objects_v2(Bucket=env.bucket).get("Contents", [])
    uploads = env.client.list_multipart_uploads(Bucket=env.bucket).get("Uploads", [])
    return objects, uploads


@pytest.mark.parametrize("which", ["loose", "public", "missing"])
def test_publish_refuses_an_unusable_signing_key_before_reading_or_sending(env, tmp_path,
                                                                          which):
    loose = env.keys / "loose.key"
    loose.write_bytes((env.keys / "team.key").read_bytes())
    loose.chmod(0o644)
    key = {"loose": loose, "public": env.keys / "team.key.pub",
           "missing": env.keys / "nobody.key"}[which]
    url = f"s3://{env.bucket}/k/model.pte"
    journal = tmp_path / "journal"
    # A missing key is load_signing_key's documented FileNotFoundError (naming the key).
    refused = FileNotFoundError if which == "missing" else KeyFileError
    # A source that does not exist: the key is refused before it is looked at.
    with pytest.raises(refused) as caught:
        trtet_store.publish([os.fspath(tmp_path / "no-such.pte")], url,
                            endpoint_url=env.endpoint.url, journal_dir=journal,
                            signing_key=key)
    assert "no-such.pte" not in str(caught.value)
    real = tmp_path / "model.pte"
    real.write_bytes(os.urandom(70_000))
    with pytest.raises(refused):
        trtet_store.publish([os.fspath(real)], url, endpoint_url=env.endpoint.url,
                            journal_dir=journal, signing_key=key)
    assert _bucket(env) == ([], [])
    assert not journal.exists()
