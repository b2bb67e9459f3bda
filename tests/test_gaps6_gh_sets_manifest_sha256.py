"""A program manifest's sha256 fields (a signed program's), each malformed way refused.

The manifest names an object's bytes by sha256 (``"sha256"`` on the object)
and each chunk's by a list on its piece. A value that is no sha256 hex digest,
a list holding one, or a list of another length than the piece's chunk
digests is refused with one line saying which; a well-formed one round-trips.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from trtet_store.remote.errors import ManifestError
from trtet_store.remote.manifest import (
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    crc64nvme_b64,
)

MiB = 1 << 20
SHA = hashlib.sha256(b"x").hexdigest()


def _doc() -> dict:
    size = 3 * MiB
    pieces = (PieceEntry(0, size, "file", "a" * 32, (1, 2, 3), (SHA, SHA, SHA)),)
    parts = (PartEntry(1, 0, size, "etag1", crc64nvme_b64(1), "1" * 32),)
    pte = ObjectEntry("m.pte", "models/m.pte", size, "e-1", crc64nvme_b64(3), 8 * MiB, parts,
                      pieces, sha256=SHA)
    return json.loads(Manifest("m.pte", MiB, (pte,)).to_json())


def test_a_well_formed_signed_manifest_round_trips() -> None:
    m = Manifest.from_json(json.dumps(_doc()).encode())
    assert m.objects[0].sha256 == SHA and m.objects[0].pieces[0].sha256 == (SHA,) * 3


@pytest.mark.parametrize("change,said", [
    (lambda o: o.update(sha256="f" * 63), "object 'm.pte': sha256 'fffff"),
    (lambda o: o.update(sha256=SHA.upper()), "is not a sha256 hex digest"),
    (lambda o: o["pieces"][0].update(sha256=[SHA, SHA, "0" * 63]),
     "a piece's sha256 must be a list of sha256 hex digests"),
    (lambda o: o["pieces"][0].update(sha256=[SHA, SHA, 7]),
     "a piece's sha256 must be a list of sha256 hex digests"),
    (lambda o: o["pieces"][0].update(sha256=[SHA, SHA]), "piece 0 has 2 chunk sha256 for 3 chunks"),
    (lambda o: o["pieces"][0].update(sha256=[SHA] * 4), "piece 0 has 4 chunk sha256 for 3 chunks"),
], ids=["object-short", "object-upper", "chunk-short", "chunk-int", "fewer", "more"])
def test_a_malformed_sha256_is_refused_in_one_line(change, said: str) -> None:
    doc = _doc()
    change(doc["objects"][0])
    with pytest.raises(ManifestError) as caught:
        Manifest.from_json(json.dumps(doc).encode())
    assert said in str(caught.value) and "\n" not in str(caught.value), caught.value


@pytest.mark.parametrize("change", ["fewer", "object-missing", "chunk-list-missing", "none"])
def test_a_signed_manifest_that_names_a_chunk_by_xxh3_only_is_not_vouched_for(
        tmp_path, change: str) -> None:
    """The team key signed it, but not every object and chunk is named by sha256 (a list
    one short, an object's own missing, a piece without its list): with trusted keys it
    is refused as naming its bytes by xxh3 only, before anything else is read of it."""
    from trtet_store.remote.download.describe import program_refusal
    from trtet_store.remote.keyconfig import resolve_trusted
    from trtet_store.remote.keys import keygen, load_signing_key
    from trtet_store.remote.manifest import SIGNATURE_DOMAIN
    from trtet_store.remote.signing import sign_document

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    keygen(keys / "team.key")
    trusted = resolve_trusted([keys / "team.key.pub"])
    doc = _doc()
    o = doc["objects"][0]
    if change == "fewer":
        o["pieces"][0]["sha256"] = [SHA, SHA]
    elif change == "object-missing":
        del o["sha256"]
    elif change == "chunk-list-missing":
        del o["pieces"][0]["sha256"]
    signed = json.loads(sign_document(doc, load_signing_key(keys / "team.key"),
                                      SIGNATURE_DOMAIN))
    why = program_refusal(signed, trusted)
    if change == "none":
        assert why is None
    else:
        assert why is not None and "names its objects by xxh3 only" in why, why
