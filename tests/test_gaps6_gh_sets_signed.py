"""A signed set's blob check and root check, each given the state its check is for.

``check_blobs`` takes a blob's sha256 from its seal only while the blob is
still the sealed file (a blob rewritten in place with its mtime put back is
read again), takes a read sha256 only when the bytes read are the blob's
own (xxh3-128), refuses a blob whose bytes are not its name's even when
their sha256 is the signed one, and removes a refused blob and its seal from
the store. ``verified_sha256s`` refuses a set whose signed sha256 map does
not name every blob, even when a trusted key signed it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import xxhash

from trtet_store.remote.keyconfig import resolve_trusted
from trtet_store.remote.keys import keygen
from trtet_store.sets.signed import SetSignatureError, check_blobs, verified_sha256s
from trtet_store.sets.store import ContentStore

CHUNK = 4096
DATA = b"B" * (2 * CHUNK + 3)
WHERE = "s3://b/set/"


def _store(tmp_path: Path, data: bytes = DATA, sha256: str | None = None
           ) -> tuple[ContentStore, str]:
    cas = ContentStore(tmp_path / "store")
    digest = xxhash.xxh3_128(data).hexdigest()
    cas.path(digest).write_bytes(data)
    os.chmod(cas.path(digest), 0o444)
    cas.seal(digest, sha256=sha256)
    return cas, digest


def _rewrite_in_place(path: Path, at: int, byte: bytes) -> None:
    """Write ``byte`` at ``at`` and put the mtime (and atime) back, as a careful writer would."""
    st = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(byte)
    os.chmod(path, 0o444)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_a_sealed_sha256_is_not_believed_once_the_blob_was_rewritten_in_place(
        tmp_path: Path) -> None:
    """The seal keeps the sha256 the download took; the blob rewritten since (mtime put
    back) is no longer the sealed file: it is read, and refused and removed."""
    real = hashlib.sha256(DATA).hexdigest()
    cas, digest = _store(tmp_path, sha256=real)
    assert json.loads(cas.seal_path(digest).read_bytes())["sha256"] == real
    _rewrite_in_place(cas.path(digest), CHUNK + 1, b"Z")
    with pytest.raises(SetSignatureError) as caught:
        check_blobs(cas, [digest], {digest: real}, WHERE)
    assert f"blob {digest}: its sha256 is None, the signed set says {real}" in str(caught.value)
    assert not cas.path(digest).exists() and not cas.seal_path(digest).exists()


def test_bytes_that_are_not_the_blob_s_are_refused_even_with_the_signed_sha256(
        tmp_path: Path) -> None:
    """No seal; the store's file holds other bytes than its name's, and the (forged) signed
    map names their sha256: the read sha256 counts only for the blob's own bytes."""
    cas, digest = _store(tmp_path)
    os.unlink(cas.seal_path(digest))
    other = DATA[:CHUNK] + b"Z" + DATA[CHUNK + 1:]
    os.chmod(cas.path(digest), 0o644)
    cas.path(digest).write_bytes(other)
    with pytest.raises(SetSignatureError) as caught:
        check_blobs(cas, [digest], {digest: hashlib.sha256(other).hexdigest()}, WHERE)
    assert f"blob {digest}: its sha256 is None" in str(caught.value)
    assert not cas.path(digest).exists()


def test_a_refused_blob_and_its_seal_are_removed_and_a_good_one_kept(tmp_path: Path) -> None:
    good = b"G" * (CHUNK + 1)
    cas, digest = _store(tmp_path, sha256=hashlib.sha256(DATA).hexdigest())
    gd = xxhash.xxh3_128(good).hexdigest()
    cas.path(gd).write_bytes(good)
    os.chmod(cas.path(gd), 0o444)
    cas.seal(gd)
    shas = {digest: "e" * 64, gd: hashlib.sha256(good).hexdigest()}
    with pytest.raises(SetSignatureError) as caught:
        check_blobs(cas, [digest, gd], shas, WHERE)
    assert f"the signed set says {'e' * 64}; refused, removed from the store" in str(caught.value)
    assert not cas.path(digest).exists() and not cas.seal_path(digest).exists()
    check_blobs(cas, [gd], shas, WHERE)  # the other blob is untouched and still passes
    assert cas.path(gd).read_bytes() == good


def test_a_signed_sha256_map_that_leaves_out_a_blob_is_refused(tmp_path: Path) -> None:
    """A trusted key signed a manifest whose sha256 map names one blob of two (an older
    or broken publisher): the set names a blob by xxh3 only, so it is not trusted."""
    from trtet_store.cache.tier.signing import load_signing_key
    from trtet_store.remote.signing import sign_document
    from trtet_store.sets.signed import DOMAIN

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    keygen(keys / "team.key")
    trusted = resolve_trusted([keys / "team.key.pub"])
    a, b = "a" * 32, "b" * 32
    doc = {"format": "trtet-store-set", "version": 1, "blobs": {a: {}, b: {}},
           "members": {}, "sha256": {a: "1" * 64}}
    body = sign_document(doc, load_signing_key(keys / "team.key"), DOMAIN)
    with pytest.raises(SetSignatureError) as caught:
        verified_sha256s(body, trusted, WHERE)
    assert "names its blobs by xxh3-128 only" in str(caught.value)
    full = dict(doc, sha256={a: "1" * 64, b: "2" * 64})
    body = sign_document(full, load_signing_key(keys / "team.key"), DOMAIN)
    assert verified_sha256s(body, trusted, WHERE) == full["sha256"]
