"""The signing rules of the shared tier's entries and leases (RemoteTier's signing and
lease modules), and of the key files, each at its edge (gap hunt, hardening round 5): what
a bucket writer can write into a pointer or a lease (too many signatures, a lease for
another bucket, an unsigned or unreadable lease, a ttl of Infinity or a thousand times the
waiter's), and what a user is told.

Pure functions on real ed25519 keys made in ``tmp_path`` (no server): each test is well
under a second.
"""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

import pytest

from trtet_store.cache.tier.entry import RemoteEntry
from trtet_store.cache.tier.lease import capped_ttl, lease_body, lease_refusal, prunable
from trtet_store.cache.tier.signing import MAX_SIGNATURES, refusal, sign_entry
from trtet_store.remote.jsondoc import Dated
from trtet_store.remote.keys import (
    KeyFileError,
    keygen,
    load_public_key,
    load_signing_key,
    signature_problem,
)
from trtet_store.remote.signing import payload, sign_document, signed_problem

SHA = "a" * 64
DIGEST = "0" * 32


@pytest.fixture
def keys(tmp_path: Path):
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team, evil = keygen(d / "team.key"), keygen(d / "evil.key")
    return {"team": team, "evil": evil, "dir": d,
            "team_sk": load_signing_key(d / "team.key"),
            "evil_sk": load_signing_key(d / "evil.key")}


def entry(**meta: object) -> RemoteEntry:
    return RemoteEntry("k" * 32, "etag", 1.0, "a", "host", f"{'k' * 32}/a-0000000000000000/",
                       [{"name": "e0", "size": 10, "digest": DIGEST, "sha256": SHA}],
                       dict(meta or {"gpu": "sm_90"}))


# -- pointers ------------------------------------------------------------------------------

def test_a_pointer_with_more_signatures_than_read_is_refused_even_with_a_valid_one_last(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    e = entry()
    sign_entry(e, keys["team_sk"])
    good = e.signature
    junk = {"key": keys["evil"].key_id, "ed25519": base64.b64encode(b"x" * 64).decode()}
    e.signature = [junk] * MAX_SIGNATURES + [good]
    assert refusal(e, trusted) == f"carries {MAX_SIGNATURES + 1} signatures, more than the " \
                                  f"{MAX_SIGNATURES} read"
    e.signature = [junk] * (MAX_SIGNATURES - 1) + [good]  # exactly the bound: read
    assert refusal(e, trusted) is None


def test_the_reason_given_is_the_trusted_signer_s_not_the_first_signature_s(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    e = entry()
    sign_entry(e, keys["team_sk"])
    team_sig = e.signature
    e.metadata = {"gpu": "sm_80"}  # changed after signing: the team's no longer verifies
    e.signature = None
    sign_entry(e, keys["evil_sk"])  # the bucket writer's own, valid, listed first
    e.signature = [e.signature, team_sig]
    why = refusal(e, trusted)
    assert why == f"its signature by {keys['team'].key_id} does not verify: the pointer was " \
                  "changed after it was signed", why


def test_a_signed_pointer_s_metadata_changed_is_refused(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    e = entry(gpu="sm_90", trt="10.3")
    sign_entry(e, keys["team_sk"])
    assert refusal(e, trusted) is None
    e.metadata = {"gpu": "sm_80", "trt": "10.3"}
    assert "does not verify" in (refusal(e, trusted) or "")


def test_a_pointer_whose_files_lost_their_sha256_is_refused_as_xxh3_only(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    e = entry()
    sign_entry(e, keys["team_sk"])
    e.files = [{k: v for k, v in f.items() if k != "sha256"} for f in e.files]
    why = refusal(e, trusted) or ""
    assert why.startswith("names its files by xxh3-128 only (e0 without sha256"), why


def test_sign_entry_refuses_a_file_not_named_by_sha256_and_leaves_the_entry_unsigned(keys):
    e = entry()
    e.files = [{"name": "e0", "size": 10, "digest": DIGEST}]
    with pytest.raises(ValueError, match=r"files \['e0'\] are not named by sha256"):
        sign_entry(e, keys["team_sk"])
    assert e.signature is None


def test_signing_again_with_the_same_key_replaces_its_own_signature(keys):
    e = entry()
    sign_entry(e, keys["team_sk"])
    sign_entry(e, keys["team_sk"])
    assert isinstance(e.signature, dict) and e.signature["key"] == keys["team"].key_id
    sign_entry(e, keys["evil_sk"])
    sign_entry(e, keys["team_sk"])
    assert [s["key"] for s in e.signatures()] == [keys["evil"].key_id, keys["team"].key_id]


# -- leases --------------------------------------------------------------------------------

def _lease(keys, bucket: str, object_key: str) -> dict:
    return json.loads(lease_body("h" * 16, 1.0, 300.0, 3, signing_key=keys["team_sk"],
                                 bucket=bucket, object_key=object_key))


def test_a_lease_signed_for_another_bucket_does_not_verify(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    doc = _lease(keys, "bucket-a", "cache/k.lease")
    assert lease_refusal(doc, "bucket-a", "cache/k.lease", trusted) is None
    why = lease_refusal(doc, "bucket-b", "cache/k.lease", trusted) or ""
    assert "does not verify" in why, why
    assert "does not verify" in (lease_refusal(doc, "bucket-a", "cache/j.lease", trusted) or "")


def test_an_unsigned_or_unreadable_lease_is_refused_by_a_signed_tier(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    doc = {k: v for k, v in _lease(keys, "b", "k.lease").items() if k != "signature"}
    assert lease_refusal(doc, "b", "k.lease", trusted) == "it is not signed"
    assert lease_refusal(None, "b", "k.lease", trusted) == \
        "it cannot be read (damaged or too large), so it is not signed"


@pytest.mark.parametrize("claimed", [math.inf, -math.inf, math.nan, 0, -5, True, "300", None])
def test_a_lease_ttl_that_is_not_a_positive_finite_number_is_the_waiter_s_own(claimed):
    ttl, why = capped_ttl(claimed, 60.0)
    assert ttl == 60.0 and why is not None and "is not a number of seconds" in why


@pytest.mark.parametrize("claimed,want", [(120.0, 120.0), (120.5, 120.0), (121, 120.0),
                                          (6000.0, 120.0), (59.5, 59.5)])
def test_a_lease_ttl_is_capped_at_twice_the_waiter_s_own(claimed, want):
    ttl, why = capped_ttl(claimed, 60.0)
    assert ttl == want
    assert (why is None) == (claimed <= 120), why


def _dated(body: bytes | None, age: float | None) -> Dated:
    return Dated(body, "etag", len(body or b""), None if age is None else 1000.0,
                 None if age is None else 1000.0 + age)


def test_prune_keeps_a_lease_whose_age_the_server_did_not_give():
    body = json.dumps({"holder": "h", "ttl": 1.0}).encode()
    assert not prunable(_dated(body, None), 1.0)
    assert not prunable(_dated(b"not json", None), 1.0)
    assert prunable(_dated(body, 2.5), 1.0) and not prunable(_dated(body, 1.5), 1.0)


def test_prune_removes_a_lease_with_no_ttl_to_read_once_any_age_passes():
    # No ttl of ours in it (damaged, or none of ours): the prune's age bound alone decides.
    assert prunable(_dated(b"not json", 1.0), 300.0)
    assert prunable(_dated(json.dumps({"ttl": "forever"}).encode(), 1.0), 300.0)
    # One with a ttl still waits two of them.
    assert not prunable(_dated(json.dumps({"ttl": 300.0}).encode(), 1.0), 300.0)


# -- signature_problem, signed_problem (set and program manifests) -------------------------

def test_a_signature_is_checked_with_the_key_its_id_names(keys):
    data = b"some document"
    trusted = {keys["evil"].key_id: keys["evil"], keys["team"].key_id: keys["team"]}
    sig = {"key": keys["team"].key_id,
           "ed25519": base64.b64encode(keys["team_sk"].sign(data)).decode()}
    assert signature_problem(sig, trusted, data) is None
    nobody = dict(sig, key="0" * 16)
    assert (signature_problem(nobody, trusted, data) or "").startswith("signed by '0000"), \
        signature_problem(nobody, trusted, data)


DOMAIN = b"trtet-store/test-document/1\n"


def _signed_doc(keys, name: str = "team_sk") -> dict:
    return json.loads(sign_document({"objects": {"x": SHA}}, keys[name], DOMAIN))


def test_a_document_with_more_signatures_than_read_is_refused(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    doc = _signed_doc(keys)
    good = doc["signatures"][0]
    kw = dict(what="sets", changed=": changed", digests_problem=None)
    doc["signatures"] = [dict(good, key="0" * 16)] * MAX_SIGNATURES + [good]
    assert signed_problem(doc, trusted, DOMAIN, **kw) == \
        f"its signatures are not a list of at most {MAX_SIGNATURES}"
    doc["signatures"] = [dict(good, key="0" * 16)] * (MAX_SIGNATURES - 1) + [good]
    assert signed_problem(doc, trusted, DOMAIN, **kw) is None


def test_a_document_s_digest_problem_is_refused_before_its_signatures(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    doc = _signed_doc(keys)
    assert signed_problem(doc, trusted, DOMAIN, what="sets", changed="",
                          digests_problem="x is not named by sha256") == \
        "x is not named by sha256"


def test_a_document_s_reason_is_the_trusted_key_s_does_not_verify(keys):
    trusted = {keys["team"].key_id: keys["team"]}
    doc = _signed_doc(keys)
    evil = json.loads(sign_document({"objects": {"x": SHA, "y": SHA}}, keys["evil_sk"], DOMAIN))
    doc["objects"]["y"] = SHA  # changed after the team signed; the evil key signed this
    doc["signatures"] = evil["signatures"] + doc["signatures"]
    assert payload(DOMAIN, doc) == payload(DOMAIN, evil)
    why = signed_problem(doc, trusted, DOMAIN, what="sets", changed=": the set was changed",
                         digests_problem=None)
    assert why == f"its signature by {keys['team'].key_id} does not verify: the set was changed"


# -- key files -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_a_signing_key_others_can_read_or_write_is_refused(keys, mode):
    path = keys["dir"] / "team.key"
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=f"has mode {mode:04o}: other users could"):
        load_signing_key(path)


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_trusted_key_others_can_replace_is_refused(keys, mode):
    path = keys["dir"] / "team.key.pub"
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=f"has mode {mode:04o}: other users could replace"):
        load_public_key(path)
    os.chmod(path, 0o644)
    assert load_public_key(path).key_id == keys["team"].key_id


def test_keygen_refuses_a_dangling_link_at_the_public_path_and_writes_nothing(tmp_path):
    target = tmp_path / "elsewhere.pub"
    os.symlink(target, tmp_path / "new.key.pub")
    with pytest.raises(FileExistsError, match="keygen never overwrites a key"):
        keygen(tmp_path / "new.key")
    assert not os.path.lexists(tmp_path / "new.key") and not target.exists()
    assert os.readlink(tmp_path / "new.key.pub") == os.fspath(target)
