"""remote.signing.payload / signed_problem and sets.signed.verified_sha256s: what a set's
signature covers, and which refusal the user reads.

- Every field of a signed set manifest is covered: the sha256 map (a bucket writer who
  swaps one blob's sha256 for the one of bytes of its own), a blob's ETag, the blobs in
  ``removing``, the chunk size, a member's file and its metadata. Each changed after
  signing is refused with the trusted key's "does not verify", before anything is read.
- Where an untrusted key's signature sits before the trusted key's failed one, the user
  reads the trusted key's word (the set was changed after signing), not "signed by another
  key".
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from trtet_store.remote.keys import keygen, load_signing_key  # noqa: E402
from trtet_store.sets.signed import (  # noqa: E402
    SetSignatureError,
    _payload,
    sign_set,
    verified_sha256s,
)

BLOB_A, BLOB_B = "a" * 32, "b" * 32
SHAS = {BLOB_A: hashlib.sha256(b"a").hexdigest(), BLOB_B: hashlib.sha256(b"b").hexdigest()}
WHERE = "s3://bucket/llm/v3/trtet-set.json"


@pytest.fixture
def keys(tmp_path: Path) -> Any:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    keygen(d / "evil.key")
    return {"team": load_signing_key(d / "team.key"), "evil": load_signing_key(d / "evil.key"),
            "trusted": {team.key_id: team}}


def _set_body() -> bytes:
    from trtet_store.sets.manifest import BlobEntry, FileEntry, MemberEntry, SetManifest

    m = SetManifest(members={"a": MemberEntry((FileEntry("model.pte", BLOB_A, 10, "c", (10,)),
                                               FileEntry("foundation.ptd", BLOB_B, 20, "d",
                                                         (20,))),
                                              {"compute_capability": "8.9"})},
                    blobs={BLOB_A: BlobEntry(10, "e1", "c"), BLOB_B: BlobEntry(20, "e2", "d")},
                    chunk_size=1 << 20, removing={"c" * 32: "e3"})
    return m.to_json()


def _swap_sha(doc: dict) -> None:
    doc["sha256"][BLOB_B] = hashlib.sha256(b"the bucket writer's bytes").hexdigest()


def _etag(doc: dict) -> None:
    doc["blobs"][BLOB_B]["etag"] = "e9"


def _removing(doc: dict) -> None:
    doc["removing"] = {BLOB_A: "e1"}


def _chunk(doc: dict) -> None:
    doc["chunk_size"] = 1 << 21


def _member_file(doc: dict) -> None:
    doc["members"]["a"]["files"][1]["name"] = "cpu.ptd"


def _metadata(doc: dict) -> None:
    doc["members"]["a"]["metadata"]["compute_capability"] = "9.0"


@pytest.mark.parametrize("change", [_swap_sha, _etag, _removing, _chunk, _member_file,
                                    _metadata])
def test_every_field_of_a_signed_set_is_covered_by_its_signature(keys: Any, change: Any
                                                                  ) -> None:
    signed = sign_set(_set_body(), SHAS, keys["team"])
    assert verified_sha256s(signed, keys["trusted"], WHERE) == SHAS
    doc = json.loads(signed)
    change(doc)
    assert "sha256" in doc and "signatures" in doc
    with pytest.raises(SetSignatureError) as caught:
        verified_sha256s(json.dumps(doc).encode(), keys["trusted"], WHERE)
    said = str(caught.value)
    assert f"its signature by {keys['team'].key_id} does not verify" in said, said
    assert said.endswith("; nothing downloaded") and "\n" not in said


def test_the_trusted_key_s_failed_signature_is_named_before_another_key_s(keys: Any) -> None:
    signed = sign_set(_set_body(), SHAS, keys["team"])
    doc = json.loads(signed)
    _metadata(doc)  # changed after the team signed it
    evil = {"key": keys["evil"].key_id,
            "ed25519": base64.b64encode(keys["evil"].sign(_payload(doc))).decode()}
    for sigs in ([evil, *doc["signatures"]], [*doc["signatures"], evil]):
        body = json.dumps({**doc, "signatures": sigs}).encode()
        with pytest.raises(SetSignatureError) as caught:
            verified_sha256s(body, keys["trusted"], WHERE)
        said = str(caught.value)
        assert f"its signature by {keys['team'].key_id} does not verify" in said, said
        assert "not one of the trusted keys" not in said, said
