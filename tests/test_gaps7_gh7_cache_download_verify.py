"""A signed program's ranges checked by sha256: ``remote.download.verify`` and ``describe``.

Unit-level, no server: ``sha256_ok`` and ``staged_ok`` (trtet_store.remote.download.verify)
on specs built by hand on a 16-byte chunk grid, and ``program_refusal`` /
``_sha256_problem`` (trtet_store.remote.download.describe) on manifests signed with a
fresh key. Each test sets up the one state its check exists for: bytes whose xxh3 is the
manifest's and whose sha256 is not (the forger's), a signed piece that names no sha256,
a staged range whose bytes no longer match its journal, a signed manifest that names an
object or a chunk by xxh3 alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import xxhash

from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.download import describe, verify
from trtet_store.remote.download.describe import _sha256_problem, program_refusal
from trtet_store.remote.download.plan import ObjectSpec, Range, Run
from trtet_store.remote.download.verify import sha256_ok, staged_ok
from trtet_store.remote.manifest import SIGNATURE_DOMAIN, PieceEntry

CHUNK = 16
DATA = bytes(range(48)) + b"tail-12byte"  # 59 bytes: three whole chunks and a short one


def _chunks(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


def _spec(data: bytes = DATA, *, signed: bool = True, shas: Any = "right") -> ObjectSpec:
    """One object of one piece over ``data``; ``shas``: "right", None or a list."""
    if shas == "right":
        shas = tuple(hashlib.sha256(c).hexdigest() for c in _chunks(data))
    piece = PieceEntry(0, len(data), "file", xxhash.xxh3_128_hexdigest(data),
                       tuple(xxhash.xxh3_64_intdigest(c) for c in _chunks(data)),
                       tuple(shas) if shas is not None else None)
    return ObjectSpec("model.pte", "m/model.pte", len(data), "etag", None, (piece,), CHUNK,
                      signed)


class _Stage:
    """What ``staged_ok`` reads of a staging area: the bytes journaled for a range."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, run: Run, rng: Range) -> bytes:
        return self.data[rng.offset:rng.end]


def test_sha256_ok_refuses_a_chunk_whose_sha256_is_not_the_signed_one() -> None:
    forged = [hashlib.sha256(c).hexdigest() for c in _chunks(DATA)]
    forged[1] = hashlib.sha256(b"other bytes").hexdigest()
    spec = _spec(shas=forged)
    whole = Range(0, 0, 0, len(DATA))
    assert verify.sha256_ok(spec, whole, memoryview(DATA)) is False
    # The chunk before the forged one alone checks; a range over the forged one does not.
    assert sha256_ok(spec, Range(0, 0, 0, CHUNK), memoryview(DATA[:CHUNK])) is True
    assert sha256_ok(spec, Range(0, 0, CHUNK, CHUNK), memoryview(DATA[CHUNK:2 * CHUNK])) \
        is False
    # The same bytes and digests, unsigned: nothing to check by sha256.
    assert sha256_ok(_spec(shas=forged, signed=False), whole, memoryview(DATA)) is True


def test_sha256_ok_checks_each_chunk_of_a_range_at_its_own_offset() -> None:
    spec = _spec()
    assert sha256_ok(spec, Range(0, 0, 0, len(DATA)), memoryview(DATA)) is True
    tail = Range(0, 0, 2 * CHUNK, len(DATA) - 2 * CHUNK)
    assert sha256_ok(spec, tail, memoryview(DATA[2 * CHUNK:])) is True
    wrong = bytearray(DATA[2 * CHUNK:])
    wrong[-1] ^= 1  # the short last chunk's last byte
    assert sha256_ok(spec, tail, memoryview(bytes(wrong))) is False


def test_sha256_ok_refuses_a_signed_piece_that_names_no_sha256() -> None:
    """A signed spec whose piece has no sha256 list: its chunks are checked by nothing, so
    they are not ok (the sum of what the sha256 cover must be the range)."""
    spec = _spec(shas=None)
    assert sha256_ok(spec, Range(0, 0, 0, len(DATA)), memoryview(DATA)) is False
    assert sha256_ok(_spec(shas=None, signed=False), Range(0, 0, 0, len(DATA)),
                     memoryview(DATA)) is True


def test_staged_ok_refuses_staged_bytes_whose_sha256_is_not_the_signed_one() -> None:
    """A resume: the journal's CRC and the manifest's xxh3 match the staged bytes, the
    signed sha256 does not (the forger's manifest): not kept."""
    forged = [hashlib.sha256(c).hexdigest() for c in _chunks(DATA)]
    forged[0] = hashlib.sha256(b"the publisher's bytes").hexdigest()
    rng = Range(0, 0, 0, 2 * CHUNK)
    run = Run(0, 0, len(DATA))
    crc = crc64nvme(DATA[:2 * CHUNK])
    assert staged_ok(_spec(), _Stage(DATA), run, rng, crc) is True
    assert verify.staged_ok(_spec(shas=forged), _Stage(DATA), run, rng, crc) is False
    assert staged_ok(_spec(shas=forged, signed=False), _Stage(DATA), run, rng, crc) is True


def test_staged_ok_refuses_a_staged_range_cut_short_or_changed() -> None:
    rng = Range(0, 0, 0, 2 * CHUNK)
    run = Run(0, 0, len(DATA))
    crc = crc64nvme(DATA[:2 * CHUNK])
    assert staged_ok(_spec(), _Stage(DATA[:2 * CHUNK - 1]), run, rng, crc) is False
    changed = bytearray(DATA)
    changed[3] ^= 0x40
    assert staged_ok(_spec(), _Stage(bytes(changed)), run, rng, crc) is False
    assert staged_ok(_spec(), _Stage(DATA), run, rng, crc ^ 1) is False


# --- describe: what a signed manifest must name ---------------------------------------------

def _doc(data: bytes = DATA) -> dict:
    chunks = _chunks(data)
    return {"version": 1, "chunk_size": CHUNK, "objects": [{
        "name": "model.pte", "key": "m/model.pte", "size": len(data), "etag": "e",
        "sha256": hashlib.sha256(data).hexdigest(),
        "pieces": [{"offset": 0, "size": len(data), "kind": "file",
                    "xxh3": xxhash.xxh3_128_hexdigest(data),
                    "chunks": [xxhash.xxh3_64_intdigest(c) for c in chunks],
                    "sha256": [hashlib.sha256(c).hexdigest() for c in chunks]}]}]}


def _refused(why: str | None) -> None:
    assert why is not None, "a manifest naming some bytes by xxh3 only was taken as signed"
    assert "xxh3 only" in why, why


def test_sha256_problem_holds_every_object_and_chunk_to_a_sha256() -> None:
    assert _sha256_problem(_doc()) is None
    no_object_sha = _doc()
    del no_object_sha["objects"][0]["sha256"]
    _refused(describe._sha256_problem(no_object_sha))
    short = _doc()
    short["objects"][0]["pieces"][0]["sha256"].pop()  # one chunk named by xxh3 alone
    _refused(_sha256_problem(short))
    not_hex = _doc()
    not_hex["objects"][0]["pieces"][0]["sha256"][0] = "A" * 64
    _refused(_sha256_problem(not_hex))
    _refused(_sha256_problem({"objects": []}))


@pytest.fixture
def keys(tmp_path: Path) -> Any:
    from trtet_store.remote.keys import keygen, load_signing_key

    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    return team, load_signing_key(d / "team.key")


def _sign(doc: dict, key: Any) -> dict:
    from trtet_store.remote.signing import sign_document

    return json.loads(sign_document(doc, key, SIGNATURE_DOMAIN))


def test_program_refusal_refuses_a_signed_manifest_that_names_a_chunk_by_xxh3_only(
        keys: Any) -> None:
    """Signed by the trusted key, but one chunk has no sha256: the signature vouches for
    nothing a forger of xxh3 could not match, so it is refused all the same."""
    team, signing = keys
    trusted = {team.key_id: team}
    assert program_refusal(_sign(_doc(), signing), trusted) is None
    short = _doc()
    short["objects"][0]["pieces"][0]["sha256"].pop()
    why = describe.program_refusal(_sign(short, signing), trusted)
    assert why is not None and "xxh3 only" in why, why
    no_object_sha = _doc()
    del no_object_sha["objects"][0]["sha256"]
    why = program_refusal(_sign(no_object_sha, signing), trusted)
    assert why is not None and "xxh3 only" in why, why
