"""Signed set manifests: the set's root signed over its blobs' content (sha256), Nix style.

A set manifest names each blob by its xxh3-128, which is not a cryptographic
digest. A publisher with a signing key adds, in the one object that commits
the set (``trtet-set.json``, so the signature commits with it), two fields:

- ``"sha256"``: ``{<blob xxh3-128 hex>: <sha256 hex>}`` for every blob,
  taken in the pass that already reads each file (its xxh3 and CRC64NVME);
- ``"signatures"``: ``[{"key": <key id>, "ed25519": <base64>}, ...]``, each
  over :data:`DOMAIN` followed by the manifest's other fields as canonical
  JSON (sorted keys, no spaces, ASCII): every member, name, metadata, blob
  and digest, the sha256 map too.

Readers of an older version ignore both. A ``fetch_set`` with trusted keys
(``trusted_keys=``, ``TRTET_TRUSTED_KEYS`` or the config file, as the
tier's) refuses, before a byte of a blob is downloaded, a set no trusted
key's signature verifies (unsigned, another signer, changed after signing,
or naming blobs by xxh3 only), and refuses to place a blob whose sha256 is
not the signed one: a blob downloaded now is hashed as it arrives (its seal
keeps the sha256), a blob already in the store is read once for it. One
signature by a trusted key that verifies is enough; others are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from trtet_store.io import is_sha256, read_digests
from trtet_store.remote.errors import FetchVerificationError, ManifestError
from trtet_store.remote.jsondoc import loads
from trtet_store.remote.signing import (  # noqa: F401 - MAX_SIGNATURES: as before
    MAX_SIGNATURES,
    payload,
    sign_document,
    signed_problem,
)

__all__ = ["DOMAIN", "SetSignatureError", "check_blobs", "read_signed_set", "sign_set",
           "verified_sha256s"]

#: What a set's signature covers starts with this, so that it means nothing elsewhere.
DOMAIN = b"trtet-store/set-manifest-signature/1\n"
#: A sha256 seal is a line of JSON (a reference's, with its path, may be longer).
_SEAL_LIMIT = 4096


class SetSignatureError(FetchVerificationError):
    """A set (or one of its blobs) the trusted keys do not vouch for: nothing of it placed."""


def _payload(doc: Mapping[str, Any]) -> bytes:
    return payload(DOMAIN, doc)


def sign_set(body: bytes, sha256s: Mapping[str, str], key: Any) -> bytes:
    """``body`` (a set manifest's canonical JSON) with every blob's sha256 and ``key``'s signature.

    Parameters
    ----------
    body : bytes
        :meth:`SetManifest.to_json`.
    sha256s : mapping
        Each blob's xxh3-128 hex -> the sha256 hex of its bytes.
    key : SigningKey
    """
    doc = json.loads(body)
    missing = sorted(set(doc["blobs"]) - set(sha256s))
    if missing:
        raise ValueError(f"no sha256 for blobs {missing[:3]}: a signature needs every one")
    doc["sha256"] = {b: sha256s[b] for b in doc["blobs"]}
    return sign_document(doc, key, DOMAIN)


def _refusal(doc: Any, trusted: Mapping[str, Any]) -> str | None:
    """Why the parsed set manifest ``doc`` is not vouched for by ``trusted``, or None."""
    shas = doc.get("sha256") if isinstance(doc, dict) else None
    blobs = doc.get("blobs") if isinstance(doc, dict) else None
    digests = None
    if not (isinstance(shas, dict) and isinstance(blobs, dict) and set(shas) == set(blobs)
            and all(is_sha256(v) for v in shas.values())):
        digests = ("names its blobs by xxh3-128 only (no sha256 for each): not trusted; "
                   "publish it again with the signing key")
    return signed_problem(doc, trusted, DOMAIN, what="sets", digests_problem=digests,
                          changed=": the set manifest was changed after it was signed")


def verified_sha256s(body: bytes, trusted: Mapping[str, Any], where: str) -> dict[str, str]:
    """``{blob xxh3-128: sha256}`` of the set manifest ``body``, once a trusted key vouches for it.

    Raises
    ------
    SetSignatureError
        No signature by one of ``trusted`` verifies (one line, with why).
    """
    try:
        doc = loads(body, "set manifest")
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    why = _refusal(doc, trusted)
    if why is not None:
        raise SetSignatureError(f"{where}: the set is refused: {why}; nothing downloaded")
    return dict(doc["sha256"])


def read_signed_set(s3: Any, bucket: str, prefix: str, trusted: Mapping[str, Any]
                    ) -> tuple[Any, str, dict[str, str]]:
    """:func:`~trtet_store.sets.fetch.read_set`, vouched for: ``(manifest, etag, sha256s)``.

    Raises
    ------
    ObjectNotFoundError, ManifestError
        As ``read_set``.
    SetSignatureError
        No trusted key vouches for it (:func:`verified_sha256s`).
    """
    from trtet_store.remote.errors import ObjectNotFoundError
    from trtet_store.sets.manifest import SET_KEY, SET_MAX_BYTES, SetManifest

    key = prefix + SET_KEY
    got = s3.get(bucket, key, limit=SET_MAX_BYTES)
    if got is None:
        raise ObjectNotFoundError(f"no set at s3://{bucket}/{prefix} (no {SET_KEY}); "
                                  "publish one with publish-set")
    shas = verified_sha256s(got[0], trusted, f"s3://{bucket}/{key}")
    return SetManifest.from_json(got[0]), got[1], shas


def _sealed_sha256(cas: Any, digest: str) -> str | None:
    """The sha256 the store's seal of ``digest`` keeps, while the blob is the sealed file."""
    seal, sha = cas.kept(digest, "sha256", _SEAL_LIMIT) if cas.sealed(digest) else (None, None)
    return sha if seal is not None and is_sha256(sha) and cas.sealed(digest) else None


def check_blobs(cas: Any, blobs: Any, sha256s: Mapping[str, str], where: str) -> None:
    """Each of ``blobs`` (xxh3-128 hex) in the store ``cas`` is the signed set's sha256.

    The sha256 the download took as the bytes arrived (kept in the blob's
    seal) is used; a blob without one (in the store before, copied from a
    reference, resumed) is read once. A blob whose sha256 is another is
    removed from the store and refused: nothing is placed.

    Raises
    ------
    SetSignatureError
    """
    for digest in sorted(set(blobs)):
        want = sha256s.get(digest)
        got = _sealed_sha256(cas, digest)
        if got is None:
            fd = os.open(cas.path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                read = read_digests(fd, 1 << 20, sha256=True)
            finally:
                os.close(fd)
            got = read.sha256 if read.digest == digest else None
        if got is None or got != want:
            cas.remove(digest)
            raise SetSignatureError(
                f"{where}: blob {digest}: its sha256 is {got}, the signed set says {want}; "
                "refused, removed from the store, nothing placed")
