"""Signed shared-tier entries: ed25519 key files, a pointer's signatures, and their check.

A signed pointer names every file of its entry by size, xxh3-128 and sha256,
so a signature over the pointer's fields (:meth:`RemoteEntry.record`)
vouches for every byte a reader will accept through a cryptographic digest
(as a Nix binary cache's fingerprint holds the content's sha256): with
trusted keys the tier checks each downloaded file's sha256, taken in the
download's own pass over the bytes, against the very pointer whose
signature it checked. xxh3 is not second-preimage resistant, so it alone
never carries a signature. What is signed is :data:`DOMAIN` followed by the
record as canonical JSON (sorted keys, no spaces, ASCII), recomputed by the
reader from the fields it parsed and will use; the pointer stores
``"signature": {"key": <key id>, "ed25519": <base64>}``, or a list of such
when several keys signed it. An entry is accepted when one signature by a
trusted key verifies (signatures by other keys are ignored); a signature
that does not verify counts for nothing, and an entry no trusted signature
vouches for is a miss. A writer of the bucket who changes the pointer (its
files' sizes and digests, its metadata, anything) cannot make a signature
that a trusted key verifies.

Entries signed by versions before sha256 (``.../cache-entry-signature/1``,
files named by xxh3-128 only) are refused by a reader with trusted keys, in
one line ("names its files by xxh3-128 only ..."): publish them again with
the signing key (``trtet-store cache push``, or the next build).

Key files, key ids and the check of one signature are :mod:`trtet_store.remote.keys`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from trtet_store.cache.tier.entry import RemoteEntry, TierEntryError
from trtet_store.remote.keys import (
    KeyFileError,
    PublicKey,
    SigningKey,
    SigningUnavailableError,
    keygen,
    load_public_key,
    load_signing_key,
    signature_problem,
)

__all__ = ["DOMAIN", "MAX_SIGNATURES", "KeyFileError", "PublicKey", "SigningKey",
           "SigningUnavailableError", "TierSignatureError", "keygen", "load_public_key",
           "load_signing_key", "payload", "refusal", "sign_entry", "unnamed_by_sha256",
           "claimed_keys", "verified_by", "signature_problem"]

#: What a signature covers starts with this, so that it means nothing elsewhere
#: (``/2``: every file named by sha256 too; ``/1`` named them by xxh3-128 only).
DOMAIN = b"trtet-store/cache-entry-signature/2\n"
class TierSignatureError(TierEntryError):
    """An entry the tier's trusted keys do not vouch for: never served.

    Attributes
    ----------
    reason : str
        Why: not signed, signed by a key not trusted, or a signature that
        does not verify (the pointer changed after it was signed).
    """

    def __init__(self, message: str, key: str, reason: str) -> None:
        super().__init__(message, key)
        self.reason = reason


def payload(entry: RemoteEntry) -> bytes:
    """What a signature of ``entry`` covers: :data:`DOMAIN` + its record as canonical JSON."""
    return DOMAIN + json.dumps(entry.record(), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=True).encode("ascii")


#: Signatures one pointer may carry (each costs a verification).
MAX_SIGNATURES = 8


def unnamed_by_sha256(entry: RemoteEntry) -> list[str]:
    """The names of ``entry``'s files its pointer does not name by sha256."""
    return [f["name"] for f in entry.files if "sha256" not in f]


def sign_entry(entry: RemoteEntry, key: SigningKey) -> None:
    """Add ``key``'s signature over :func:`payload` to ``entry`` (call last, before the put).

    Every file must be named by sha256 (``ValueError`` otherwise: a
    signature over xxh3-128 alone vouches for nothing). A second key's
    signature is added beside the first (a list); the same key's replaces
    its own.
    """
    missing = unnamed_by_sha256(entry)
    if missing:
        raise ValueError(f"entry {entry.key}: files {missing} are not named by sha256; a "
                         "signature needs it (xxh3-128 is not a cryptographic digest)")
    sig = {"key": key.key_id,
           "ed25519": base64.b64encode(key.sign(payload(entry))).decode("ascii")}
    others = [s for s in entry.signatures()
              if not (isinstance(s, dict) and s.get("key") == key.key_id)]
    entry.signature = [*others, sig] if others else sig


def _one(sig: Any, entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """Why the one signature ``sig`` does not vouch for ``entry``, or None when it does."""
    return signature_problem(sig, trusted, payload(entry),
                             changed=": the pointer was changed after it was signed")


def claimed_keys(entry: RemoteEntry) -> list[str]:
    """The key ids ``entry``'s signatures claim, unchecked (what a bucket writer can write)."""
    return [str(s["key"])[:40] for s in entry.signatures()[:MAX_SIGNATURES]
            if isinstance(s, dict) and isinstance(s.get("key"), str)]


def verified_by(entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """The id of the first of ``trusted`` whose signature vouches for ``entry``, or None."""
    if refusal(entry, trusted) is not None:
        return None
    return next(s["key"] for s in entry.signatures() if _one(s, entry, trusted) is None)


def refusal(entry: RemoteEntry, trusted: Mapping[str, PublicKey]) -> str | None:
    """Why ``entry`` is not vouched for by one of ``trusted`` (by key id), or None.

    One of: not signed; a file not named by sha256 (an entry signed before
    sha256, over xxh3-128 only); a signature field that is not ``{"key",
    "ed25519"}``; signed by a key not trusted; a signature that does not
    verify (the pointer was changed after signing: its files, metadata,
    anything). With several signatures, one by a trusted key that verifies
    is enough; else the reason is the first trusted signer's, or the first's.
    """
    sigs = entry.signatures()
    if not sigs:
        return "not signed (this cache accepts only entries signed by its trusted keys)"
    missing = unnamed_by_sha256(entry)
    if missing:
        return (f"names its files by xxh3-128 only ({', '.join(missing)} without sha256: "
                "signed by a version before sha256, or not signed over the content); not "
                "trusted: publish it again with the signing key")
    if len(sigs) > MAX_SIGNATURES:
        return f"carries {len(sigs)} signatures, more than the {MAX_SIGNATURES} read"
    reasons = [_one(sig, entry, trusted) for sig in sigs]
    if any(r is None for r in reasons):
        return None
    by_trusted = [r for sig, r in zip(sigs, reasons, strict=True)
                  if isinstance(sig, dict) and sig.get("key") in trusted]
    return (by_trusted or reasons)[0]
