"""What a signed program manifest's sha256 fields must be, read back (``remote.manifest``),
and how they are taken (``remote.checksum.PieceDigester(chunk_sha256=True)``).

``Manifest.from_dict`` (trtet_store.remote.manifest: ``_piece``, ``_sha256``,
``_validate_object``, ``is_sha256``) holds an object's ``sha256`` and each piece's list to
64 lower-case hex digits, one per chunk; an unsigned manifest names none (``to_dict``
writes no ``sha256`` key, so older readers see what they always saw). A bucket writer's
manifest that breaks one of these is a ``ManifestError``, never a fetch checked by
something else. No server: the documents are built here.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
from test_fetch_support import CHUNK, MiB, engine_bytes, piece_entries

from trtet_store.remote import manifest as manifest_module
from trtet_store.remote.checksum import PieceDigester
from trtet_store.remote.errors import ManifestError
from trtet_store.remote.manifest import (
    Manifest,
    ObjectEntry,
    PartEntry,
    is_sha256,
)

DATA = engine_bytes(801, 2 * MiB + 333)
SIZES = [MiB + 5, MiB + 328]


def _manifest(signed: bool = True) -> Manifest:
    import dataclasses

    pieces = piece_entries(DATA, SIZES)
    if signed:
        pieces = tuple(dataclasses.replace(p, sha256=tuple(
            hashlib.sha256(DATA[p.offset + i:min(p.offset + i + CHUNK, p.offset + p.size)])
            .hexdigest() for i in range(0, p.size, CHUNK))) for p in pieces)
    md5 = hashlib.md5(DATA, usedforsecurity=False).hexdigest()
    crc = "AAAAAAAAAAA="
    entry = ObjectEntry("model.pte", "m/model.pte", len(DATA), md5, crc, 5 * MiB,
                        (PartEntry(1, 0, len(DATA), md5, crc, md5),), pieces,
                        hashlib.sha256(DATA).hexdigest() if signed else None)
    return Manifest(program="model.pte", chunk_size=CHUNK, objects=(entry,))


def test_a_signed_manifest_round_trips_and_an_unsigned_one_names_no_sha256() -> None:
    doc = _manifest().to_dict()
    back = Manifest.from_dict(copy.deepcopy(doc))
    assert back.objects[0].sha256 == hashlib.sha256(DATA).hexdigest()
    assert [len(p.sha256) for p in back.objects[0].pieces] == [2, 2]
    assert back.objects[0].sha256_named
    plain = _manifest(signed=False).to_dict()
    assert "sha256" not in plain["objects"][0]
    assert all("sha256" not in p for p in plain["objects"][0]["pieces"])
    assert not Manifest.from_dict(plain).objects[0].sha256_named


@pytest.mark.parametrize("bad", ["A" * 64, "0" * 63, "g" * 64, 7, "0" * 64 + "\n"])
def test_a_pieces_sha256_that_is_not_a_sha256_hex_digest_is_refused(bad: object) -> None:
    doc = _manifest().to_dict()
    doc["objects"][0]["pieces"][1]["sha256"][0] = bad
    with pytest.raises(ManifestError, match="a piece's sha256 must be a list of sha256 hex"):
        Manifest.from_dict(doc)


@pytest.mark.parametrize("bad", ["A" * 64, "0" * 65, ["0" * 64], 1])
def test_an_objects_sha256_that_is_not_a_sha256_hex_digest_is_refused(bad: object) -> None:
    doc = _manifest().to_dict()
    doc["objects"][0]["sha256"] = bad
    with pytest.raises(ManifestError, match="is not a sha256 hex digest"):
        Manifest.from_dict(doc)


def test_a_piece_naming_another_count_of_sha256_than_chunks_is_refused() -> None:
    for change in (lambda s: s.pop(), lambda s: s.append("0" * 64)):
        doc = _manifest().to_dict()
        change(doc["objects"][0]["pieces"][0]["sha256"])
        with pytest.raises(ManifestError, match="chunk sha256 for 2 chunks"):
            Manifest.from_dict(doc)


def test_is_sha256_takes_lower_case_hex_of_64_digits_only() -> None:
    good = hashlib.sha256(b"x").hexdigest()
    assert is_sha256(good) and manifest_module.is_sha256("0" * 64)
    for bad in (good.upper(), good[:-1], good + "0", " " + good[1:], None, 5, good.encode()):
        assert not is_sha256(bad), bad


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_piece_digester_names_every_chunk_by_sha256_the_last_short_one_too(size: int) -> None:
    data = DATA[:size] if size <= len(DATA) else engine_bytes(802, size)
    d = PieceDigester(CHUNK, chunk_sha256=True)
    for i in range(0, len(data), 300_001):  # writes that straddle chunk boundaries
        d.update(data[i:i + 300_001])
    d.finish()
    want = tuple(hashlib.sha256(data[i:i + CHUNK]).hexdigest()
                 for i in range(0, len(data), CHUNK))
    assert d.chunk_sha256() == want
    plain = PieceDigester(CHUNK)
    plain.update(data)
    plain.finish()
    assert plain.chunk_sha256() is None
