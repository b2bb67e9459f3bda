"""trtet_store.sets.signed: sign_set, verified_sha256s and check_blobs, each given the
state its check is for.

- ``sign_set`` refuses to sign a set without every blob's sha256 (a signature
  over a set naming a blob by xxh3 only would vouch for nothing);
- ``verified_sha256s`` refuses a signed sha256 map whose keys are not exactly
  the set's blobs (one more too) or whose values are not sha256 hex digests
  (uppercase, short), even when a trusted key signed it;
- ``check_blobs`` never reads a blob through a link planted at its name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
import xxhash

from trtet_store.cache.tier.signing import load_signing_key
from trtet_store.remote.keyconfig import resolve_trusted
from trtet_store.remote.keys import keygen
from trtet_store.remote.signing import sign_document
from trtet_store.sets.signed import (
    DOMAIN,
    SetSignatureError,
    check_blobs,
    sign_set,
    verified_sha256s,
)
from trtet_store.sets.store import ContentStore

WHERE = "s3://b/set/"
A, B = "a" * 32, "b" * 32


def _keys(tmp_path: Path):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    keygen(keys / "team.key")
    return load_signing_key(keys / "team.key"), resolve_trusted([keys / "team.key.pub"])


def _doc(shas: dict) -> dict:
    return {"format": "trtet-store-set", "version": 1, "blobs": {A: {}, B: {}},
            "members": {}, "sha256": shas}


def test_sign_set_needs_every_blobs_sha256(tmp_path: Path) -> None:
    key, trusted = _keys(tmp_path)
    body = json.dumps({k: v for k, v in _doc({}).items() if k != "sha256"}).encode()
    with pytest.raises(ValueError, match="no sha256 for blobs"):
        sign_set(body, {A: "1" * 64}, key)
    signed = sign_set(body, {A: "1" * 64, B: "2" * 64, "c" * 32: "3" * 64}, key)
    assert json.loads(signed)["sha256"] == {A: "1" * 64, B: "2" * 64}  # the set's blobs only
    assert verified_sha256s(signed, trusted, WHERE) == {A: "1" * 64, B: "2" * 64}


@pytest.mark.parametrize("shas", [
    {A: "1" * 64, B: "2" * 64, "c" * 32: "3" * 64},  # one blob more than the set has
    {A: "1" * 64, B: "A" * 64},  # uppercase: not a sha256 hex digest as written here
    {A: "1" * 64, B: "2" * 63},  # short
    {A: "1" * 64, B: None},
])
def test_a_signed_sha256_map_not_exactly_the_sets_blobs_sha256s_is_refused(
        tmp_path: Path, shas: dict) -> None:
    key, trusted = _keys(tmp_path)
    body = sign_document(_doc(shas), key, DOMAIN)  # a trusted key signed it
    with pytest.raises(SetSignatureError) as caught:
        verified_sha256s(body, trusted, WHERE)
    assert "names its blobs by xxh3-128 only" in str(caught.value)
    assert str(caught.value).startswith(f"{WHERE}: the set is refused")


def test_check_blobs_never_reads_a_blob_through_a_link_at_its_name(tmp_path: Path) -> None:
    data = b"L" * 9000
    digest = xxhash.xxh3_128(data).hexdigest()
    cas = ContentStore(tmp_path / "store")
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(data)  # the blob's very bytes, but not the store's file
    os.symlink(elsewhere, cas.path(digest))
    with pytest.raises(OSError) as caught:
        check_blobs(cas, [digest], {digest: hashlib.sha256(data).hexdigest()}, WHERE)
    assert caught.value.errno == errno.ELOOP  # refused at the open: nothing read
    assert elsewhere.read_bytes() == data


def test_a_seal_over_4_kib_is_not_read_for_its_sha256_the_blob_is(tmp_path: Path) -> None:
    """_sealed_sha256 reads a store seal (a line of JSON) capped at 4096 bytes: a bigger one
    is not believed, and the blob is read once for its sha256 instead."""
    from trtet_store.io import bytes_digested
    from trtet_store.io.safedir import write_atomic

    data = b"S" * 9000
    digest = xxhash.xxh3_128(data).hexdigest()
    real = hashlib.sha256(data).hexdigest()
    cas = ContentStore(tmp_path / "store")
    cas.path(digest).write_bytes(data)
    os.chmod(cas.path(digest), 0o444)
    cas.seal(digest, sha256=real)
    doc = json.loads(cas.seal_path(digest).read_bytes())
    body = json.dumps(doc).encode()
    write_atomic(cas.seal_path(digest), body + b" " * (4097 - len(body)), mode=0o444)
    assert cas.sealed(digest)  # the identity still vouches for the file
    before = bytes_digested()
    check_blobs(cas, [digest], {digest: real}, WHERE)
    assert bytes_digested() - before == len(data)  # read once, not trusted from the seal
    write_atomic(cas.seal_path(digest), body + b" " * (4096 - len(body)), mode=0o444)
    before = bytes_digested()
    check_blobs(cas, [digest], {digest: real}, WHERE)
    assert bytes_digested() == before  # at the cap: the seal's sha256, nothing read
