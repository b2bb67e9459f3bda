"""The set manifest's own checks, each at its edge: what a bucket writer's manifest may not say.

A set manifest written by another party (anyone who can write the bucket,
for an unsigned set) is parsed by :meth:`SetManifest.from_json` before
anything is picked or downloaded. Each check below is held at its boundary
(the cap, the 64-bit chunk digests, the chunk count) or given the one state
that needs it (a blob to remove that the set still names, ``true`` as a
size, a chunk size of 0, a blob name one digit too long), so that a check
inverted, dropped or off by one fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trtet_store.remote.errors import ManifestError
from trtet_store.sets.manifest import SetManifest

BLOB = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"
#: The documented cap (not imported: a changed constant must fail here).
SET_MAX_BYTES = 16 * 1024 * 1024


def _doc(**over: Any) -> dict[str, Any]:
    """A valid one-member set: model.pte (3 chunks of 4 bytes, the last short)."""
    doc = {"format": "trtet-store-set", "version": 1, "chunk_size": 4,
           "blobs": {BLOB: {"size": 10, "etag": '"e1"', "crc64nvme": "AAAAAAAAAAA="}},
           "members": {"sm89": {"metadata": {"compute_capability": "8.9"},
                                "files": [{"name": "model.pte", "blob": BLOB, "size": 10,
                                           "crc64nvme": "AAAAAAAAAAA=",
                                           "chunks": [1, 2, 3]}]}},
           "removing": {}}
    doc.update(over)
    return doc


def _bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def _file(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["members"]["sm89"]["files"][0]


def test_the_valid_manifest_parses() -> None:
    m = SetManifest.from_json(_bytes(_doc()))
    assert m.members["sm89"].files[0].chunks == (1, 2, 3)


def test_a_manifest_of_exactly_the_cap_is_read_and_one_byte_more_is_refused() -> None:
    body = _bytes(_doc())
    at_cap = body + b" " * (SET_MAX_BYTES - len(body))
    assert len(at_cap) == SET_MAX_BYTES
    assert SetManifest.from_json(at_cap).chunk_size == 4
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(at_cap + b" ")
    assert str(caught.value) == (f"set manifest is {SET_MAX_BYTES + 1} bytes, more than "
                                 f"{SET_MAX_BYTES}")


def test_chunk_digests_are_64_bit_unsigned_at_both_ends() -> None:
    for ok in (0, 2**64 - 1):
        doc = _doc()
        _file(doc)["chunks"] = [ok, 2, 3]
        assert SetManifest.from_json(_bytes(doc)).members["sm89"].files[0].chunks[0] == ok
    for bad in (2**64, -1, True, 1.0):
        doc = _doc()
        _file(doc)["chunks"] = [1, 2, bad]
        with pytest.raises(ManifestError, match="64-bit unsigned integers"):
            SetManifest.from_json(_bytes(doc))


def test_a_boolean_is_no_size() -> None:
    doc = _doc()
    doc["blobs"][BLOB]["size"] = True
    _file(doc)["size"] = True
    doc["members"]["sm89"]["files"][0]["chunks"] = [1]
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(_bytes(doc))
    assert str(caught.value) == "set manifest field 'size' is bool, expected int"


def test_a_chunk_size_of_zero_is_a_manifest_error() -> None:
    """Not a ZeroDivisionError from counting the chunks: the one-line ManifestError."""
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(_bytes(_doc(chunk_size=0)))
    assert str(caught.value) == "chunk_size 0 must be positive"


@pytest.mark.parametrize("name", [BLOB + "0", BLOB[:-1], BLOB.upper(), "../" + BLOB[3:]])
def test_a_blob_name_not_exactly_32_lowercase_hex_digits_is_refused(name: str) -> None:
    doc = _doc()
    doc["blobs"] = {name: doc["blobs"][BLOB]}
    _file(doc)["blob"] = name
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(_bytes(doc))
    assert str(caught.value) == f"blob name {name!r} is not an xxh3-128 hex digest"


def test_a_blob_to_remove_that_the_set_still_names_is_refused() -> None:
    """Else the publish's clean-up would delete a blob the committed set names."""
    with pytest.raises(ManifestError, match=f"blob '{BLOB}' to remove is no blob name, or one "
                       "the set names"):
        SetManifest.from_json(_bytes(_doc(removing={BLOB: '"e1"'})))
    assert SetManifest.from_json(_bytes(_doc(removing={OTHER: '"e0"'}))).removing == {
        OTHER: '"e0"'}
    with pytest.raises(ManifestError, match="to remove is no blob name"):
        SetManifest.from_json(_bytes(_doc(removing={"../x": '"e0"'})))


def test_removing_must_map_to_etags() -> None:
    for bad in ({OTHER: 5}, [OTHER]):
        with pytest.raises(ManifestError) as caught:
            SetManifest.from_json(_bytes(_doc(removing=bad)))
        assert str(caught.value) == "set manifest field 'removing' is not a map of ETags"


def test_one_chunk_digest_more_or_fewer_than_the_size_needs_is_refused() -> None:
    for chunks in ([1, 2], [1, 2, 3, 4]):
        doc = _doc()
        _file(doc)["chunks"] = chunks
        with pytest.raises(ManifestError) as caught:
            SetManifest.from_json(_bytes(doc))
        assert str(caught.value) == (f"member 'sm89': model.pte has {len(chunks)} chunk "
                                     "digests for 10 bytes")
    # 12 bytes on a 4-byte grid: exactly 3 (no extra chunk for a size on the boundary).
    doc = _doc()
    doc["blobs"][BLOB]["size"] = _file(doc)["size"] = 12
    assert SetManifest.from_json(_bytes(doc)).members["sm89"].size == 12
    _file(doc)["chunks"] = [1, 2, 3, 4]
    with pytest.raises(ManifestError, match="has 4 chunk digests for 12 bytes"):
        SetManifest.from_json(_bytes(doc))


def test_a_file_of_another_size_than_its_blob_is_refused() -> None:
    doc = _doc()
    doc["blobs"][BLOB]["size"] = 11
    with pytest.raises(ManifestError, match="names blob .* \\(10 bytes\\), which the set "
                       "does not list as such"):
        SetManifest.from_json(_bytes(doc))


@pytest.mark.parametrize("member", [".sm89", "a/b", "..", "sm\u202e89"])
def test_a_member_name_no_directory_entry_should_have_is_refused(member: str) -> None:
    doc = _doc()
    doc["members"] = {member: doc["members"]["sm89"]}
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(_bytes(doc))
    assert str(caught.value).startswith(f"member name {member!r} ")


def test_another_version_says_to_upgrade() -> None:
    with pytest.raises(ManifestError) as caught:
        SetManifest.from_json(_bytes(_doc(version=2)))
    assert str(caught.value) == ("set manifest version 2; this trtet_store reads version 1: "
                                 "upgrade trtet_store")
