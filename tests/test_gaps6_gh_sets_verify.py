"""``verify.sha256_ok``: a signed object's range passes only when every byte of it is named.

A range of a signed object is checked chunk by chunk against the signed
sha256; a range whose chunks are not all named by sha256 (a piece with no
list, or one short) is not ok, even when every chunk that is named matches.
An unsigned spec has nothing to check.
"""

from __future__ import annotations

import hashlib

from trtet_store.remote.download.plan import ObjectSpec, Range
from trtet_store.remote.download.verify import sha256_ok
from trtet_store.remote.manifest import PieceEntry

CHUNK = 1024
DATA = bytes(range(256)) * 12  # 3 chunks
SHAS = tuple(hashlib.sha256(DATA[i:i + CHUNK]).hexdigest() for i in range(0, len(DATA), CHUNK))


def _spec(shas, *, signed: bool = True) -> ObjectSpec:
    piece = PieceEntry(0, len(DATA), "file", "a" * 32, (1, 2, 3), shas)
    return ObjectSpec("m.pte", "k", len(DATA), "e", None, (piece,), CHUNK, signed)


def test_every_chunk_named_and_matching_is_ok_and_one_byte_changed_is_not() -> None:
    rng = Range(0, 0, 0, len(DATA))
    assert sha256_ok(_spec(SHAS), rng, memoryview(DATA))
    bad = bytearray(DATA)
    bad[CHUNK + 7] ^= 1
    assert not sha256_ok(_spec(SHAS), rng, memoryview(bytes(bad)))


def test_a_signed_range_not_wholly_named_by_sha256_is_not_ok() -> None:
    rng = Range(0, 0, 0, len(DATA))
    assert not sha256_ok(_spec(None), rng, memoryview(DATA))  # the piece names none
    assert not sha256_ok(_spec(SHAS[:2]), rng, memoryview(DATA))  # its last chunk unnamed
    assert sha256_ok(_spec(None, signed=False), rng, memoryview(DATA))  # nothing to check
