"""Every field a signature covers, one at a time (the shared tier's signing module:
``trtet_store.cache.tier.signing`` ``refusal``/``payload``/``verified_by`` over
``RemoteEntry.record``, and ``trtet_store.cache.tier.lease`` ``lease_refusal`` over
``lease_payload``): a bucket writer who changes any one field of a signed pointer or a
signed lease (its created time, origin, host, attempt directory, a file's size, digest or
sha256, its metadata; a lease's holder, ttl, beat, renewed or started time) makes it a
pointer no trusted key vouches for. A field left out of what is signed would pass here.

Pure functions on real ed25519 keys made in ``tmp_path`` (no server), well under a second.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier.entry import RemoteEntry
from trtet_store.cache.tier.lease import lease_body, lease_refusal
from trtet_store.cache.tier.signing import payload, refusal, sign_entry, verified_by
from trtet_store.remote.keys import keygen, load_signing_key

SHA = "a" * 64
DIGEST = "0" * 32
KEY = "k" * 32


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    return {"trusted": {team.key_id: team}, "sk": load_signing_key(d / "team.key"),
            "id": team.key_id}


def _entry() -> RemoteEntry:
    return RemoteEntry(KEY, "etag", 1000.0, "origin-a", "host-a", f"{KEY}/a-0000000000000000/",
                       [{"name": "e0", "size": 10, "digest": DIGEST, "sha256": SHA},
                        {"name": "e1", "size": 20, "digest": "1" * 32, "sha256": "b" * 64}],
                       {"gpu": "sm_90", "trt": "10.3"})


def _tamper(e: RemoteEntry, field: str) -> None:
    if field == "key":
        e.key = "j" * 32
    elif field == "created":
        e.created = 2000.0
    elif field == "origin":
        e.origin = "origin-b"
    elif field == "host":
        e.host = "host-b"
    elif field == "attempt":
        e.attempt = f"{KEY}/b-1111111111111111/"
    elif field.startswith("files."):
        _, idx, name = field.split(".")
        f = e.files[int(idx)]
        f[name] = {"size": 11, "digest": "2" * 32, "sha256": "c" * 64, "name": "e9"}[name]
    elif field == "files.order":
        e.files.reverse()
    elif field == "metadata.value":
        e.metadata["gpu"] = "sm_80"
    elif field == "metadata.extra":
        e.metadata["kind"] = "other"
    else:
        raise AssertionError(field)


FIELDS = ["key", "created", "origin", "host", "attempt", "files.0.size", "files.0.digest",
          "files.0.sha256", "files.0.name", "files.1.size", "files.1.digest",
          "files.1.sha256", "metadata.value", "metadata.extra"]


@pytest.mark.parametrize("field", FIELDS)
def test_a_signed_pointer_with_any_one_field_changed_is_refused(keys, field: str) -> None:
    e = _entry()
    sign_entry(e, keys["sk"])
    assert refusal(e, keys["trusted"]) is None
    assert verified_by(e, keys["trusted"]) == keys["id"]
    before = payload(e)
    _tamper(e, field)
    assert payload(e) != before, f"the signed payload does not cover {field}"
    why = refusal(e, keys["trusted"]) or ""
    assert "does not verify" in why, (field, why)
    assert verified_by(e, keys["trusted"]) is None


def test_a_signed_pointer_read_back_from_its_json_verifies_and_a_changed_one_does_not(keys):
    e = _entry()
    sign_entry(e, keys["sk"])
    back = RemoteEntry.from_json(e.to_json(), "etag-2", KEY)
    assert refusal(back, keys["trusted"]) is None
    doc = json.loads(e.to_json())
    doc["files"][1]["sha256"] = "d" * 64
    bad = RemoteEntry.from_json(json.dumps(doc).encode(), "etag-3", KEY)
    assert "does not verify" in (refusal(bad, keys["trusted"]) or "")


LEASE_FIELDS = {"holder": "x" * 16, "host": "other-host", "pid": 999999, "started": 5.0,
                "renewed": 6.0, "ttl": 9000.0, "beat": 4}


@pytest.mark.parametrize("field", sorted(LEASE_FIELDS))
def test_a_signed_lease_with_any_one_field_changed_is_refused(keys, field: str) -> None:
    doc = json.loads(lease_body("h" * 16, 1.0, 300.0, 3, signing_key=keys["sk"],
                                bucket="bkt", object_key="cache/k.lease"))
    assert lease_refusal(doc, "bkt", "cache/k.lease", keys["trusted"]) is None
    bad = copy.deepcopy(doc)
    assert field in bad and bad[field] != LEASE_FIELDS[field]
    bad[field] = LEASE_FIELDS[field]
    why = lease_refusal(bad, "bkt", "cache/k.lease", keys["trusted"]) or ""
    assert "does not verify" in why, (field, why)


def test_a_pointer_whose_first_trusted_signature_is_broken_is_vouched_for_by_the_second(
        tmp_path: Path) -> None:
    """Two trusted keys (a key rotation): the first's signature bytes were damaged (or a
    bucket writer wrote junk under its id), the second's verifies. One trusted signature that
    verifies is enough: ``refusal`` is None and ``verified_by`` names the second key."""
    d = tmp_path / "two"
    d.mkdir(mode=0o700)
    old, new = keygen(d / "old.key"), keygen(d / "new.key")
    trusted = {old.key_id: old, new.key_id: new}
    e = _entry()
    sign_entry(e, load_signing_key(d / "old.key"))
    sign_entry(e, load_signing_key(d / "new.key"))
    first, second = e.signatures()
    assert (first["key"], second["key"]) == (old.key_id, new.key_id)
    first["ed25519"] = base64.b64encode(b"\x01" * 64).decode("ascii")
    assert refusal(e, trusted) is None
    assert verified_by(e, trusted) == new.key_id
    assert "does not verify" in (refusal(e, {old.key_id: old}) or "")


def test_an_unsigned_pointer_is_refused_as_not_signed(keys) -> None:
    e = _entry()
    assert refusal(e, keys["trusted"]) == ("not signed (this cache accepts only entries "
                                           "signed by its trusted keys)")
    assert verified_by(e, keys["trusted"]) is None
    e.signature = []
    assert (refusal(e, keys["trusted"]) or "").startswith("not signed")
