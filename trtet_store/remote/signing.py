"""Signed roots: a JSON document signed over its content, Nix style (several signatures).

The one scheme for every signed root in a bucket (a program's manifest, a
set's manifest): the document's ``"signatures"`` field is a list of
``{"key": <key id>, "ed25519": <base64>}``, each over a domain string (what
the document is, so a signature means nothing elsewhere) followed by the
document's other fields as canonical JSON (sorted keys, no spaces, ASCII).
The document names its bytes by sha256 as well as by xxh3 (each signer of a
kind of document says how); the signature covers those digests with the
rest. One signature by a trusted key that verifies is enough; others are
ignored. Each signature is checked by :func:`~trtet_store.remote.keys.signature_problem`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from trtet_store.remote.keys import signature_problem

__all__ = ["MAX_SIGNATURES", "payload", "sign_document", "signed_problem"]

#: Signatures one document may carry (each costs a verification).
MAX_SIGNATURES = 8


def payload(domain: bytes, doc: Mapping[str, Any]) -> bytes:
    """What a signature of ``doc`` covers: ``domain`` + canonical JSON of all but its signatures."""
    return domain + json.dumps({k: v for k, v in doc.items() if k != "signatures"},
                               sort_keys=True, separators=(",", ":"),
                               ensure_ascii=True).encode("ascii")


def sign_document(doc: dict[str, Any], key: Any, domain: bytes) -> bytes:
    """``doc`` with ``key``'s signature, as canonical JSON bytes (one trailing newline).

    ``doc`` already holds the sha256 digests its signature vouches for.
    """
    sig = key.sign(payload(domain, doc))
    doc = dict(doc)
    doc["signatures"] = [{"key": key.key_id, "ed25519": base64.b64encode(sig).decode("ascii")}]
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def signed_problem(doc: Any, trusted: Mapping[str, Any], domain: bytes, *, what: str,
                   changed: str, digests_problem: str | None) -> str | None:
    """Why no trusted key vouches for the parsed document ``doc``, or None when one does.

    Parameters
    ----------
    what : str
        What is fetched only when signed (``"sets"``), for the unsigned refusal.
    changed : str
        Appended to a trusted key's "does not verify".
    digests_problem : str or None
        The caller's own check of the sha256 digests the document must hold
        (None: every object is named by one); refused after the signatures'
        form and before any verification.
    """
    sigs = doc.get("signatures") if isinstance(doc, dict) else None
    if not sigs:
        return f"not signed (only {what} signed by the trusted keys are fetched)"
    if not isinstance(sigs, list) or len(sigs) > MAX_SIGNATURES:
        return f"its signatures are not a list of at most {MAX_SIGNATURES}"
    if digests_problem is not None:
        return digests_problem
    reasons = []
    data = payload(domain, doc)
    for sig in sigs:
        why = signature_problem(sig, trusted, data, changed=changed)
        if why is None:
            return None
        if "does not verify" in why:  # a trusted key's word comes first
            reasons.insert(0, why)
        else:
            reasons.append(why)
    return reasons[0]
