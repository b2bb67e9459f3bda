"""Checks a planted-bug audit found no test for: a record's dunder targets, a set's signature
rules (too many signatures, blobs not all named by sha256) and a lease bound to its bucket.

Each test sets up the one state its check exists for, with everything else valid (a
record every other rule passes, a set signed by the trusted team key, a lease signed
by the trusted team key for the very object key), so that only that check can refuse.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from records_helpers import exported_archive
from test_lease_trust import LKEY, TestClock, _get, _put, _tier, _warnings
from test_tier_no_code import archive, members_of

from trtet_store.cache.tier import Lease
from trtet_store.cache.tier.lease import lease_body, lease_refusal
from trtet_store.remote.keys import keygen, load_signing_key
from trtet_store.sets.signed import (
    MAX_SIGNATURES,
    SetSignatureError,
    _payload,
    sign_set,
    verified_sha256s,
)

# --- a record's node target with a dunder -----------------------------------------------------


@pytest.fixture(scope="module")
def record() -> bytes:
    """A real torch.export archive (as the package's build records are), in-process."""
    return exported_archive(weighted=False)


@pytest.mark.parametrize("target", ["_operator.__import__", "math.__dict__",
                                    "_operator.__getattribute__"])
def test_a_node_target_with_a_dunder_is_refused(record: bytes, target: str) -> None:
    """``_operator.__import__`` / ``math.__dict__`` fit the target pattern (``_operator.<id>``,
    ``math.<id>``) and are not ``torch.ops`` attributes: only the dunder rule refuses them."""
    from trtet_store.export import record_check
    from trtet_store.export.record_check import record_problem

    assert record_problem(record) is None  # the record as torch wrote it is data
    assert record_check._TARGET.fullmatch(target)  # the pattern alone would take it
    assert not record_check._torch_ops_method(target)
    base = members_of(record)
    model = json.loads(base["models/model.json"])
    nodes = model["graph_module"]["graph"]["nodes"]
    assert nodes and all(isinstance(n.get("target"), str) for n in nodes)
    nodes[-1]["target"] = target
    hostile = archive({**base, "models/model.json": json.dumps(model).encode()})
    said = record_problem(hostile)
    assert said == f"its program calls {target!r}, not an operator", said


# --- a set manifest's signature rules ---------------------------------------------------------

BLOB_A, BLOB_B = "a" * 32, "b" * 32


@pytest.fixture
def keys(tmp_path: Path) -> Any:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    team = keygen(d / "team.key")
    keygen(d / "evil.key")  # a key not trusted: its signatures are the junk
    return {"trusted": {team.key_id: team}, "team": load_signing_key(d / "team.key"),
            "evil": load_signing_key(d / "evil.key")}


def _set_body() -> bytes:
    """A set manifest of one member naming two blobs (canonical JSON, as published)."""
    from trtet_store.sets.manifest import BlobEntry, FileEntry, MemberEntry, SetManifest

    m = SetManifest(members={"a": MemberEntry((FileEntry("model.pte", BLOB_A, 10, "c", (10,)),
                                               FileEntry("foundation.ptd", BLOB_B, 20, "d",
                                                         (20,))))},
                    blobs={BLOB_A: BlobEntry(10, "e1", "c"), BLOB_B: BlobEntry(20, "e2", "d")},
                    chunk_size=1 << 20)
    return m.to_json()


SHAS = {BLOB_A: hashlib.sha256(b"a").hexdigest(), BLOB_B: hashlib.sha256(b"b").hexdigest()}
WHERE = "s3://bucket/llm/v3/trtet-set.json"


def test_a_set_with_more_than_max_signatures_is_refused_even_with_the_team_one(keys) -> None:
    signed = sign_set(_set_body(), SHAS, keys["team"])
    assert verified_sha256s(signed, keys["trusted"], WHERE) == SHAS  # the team's set is read
    doc = json.loads(signed)
    junk = [{"key": keys["evil"].key_id,
             "ed25519": base64.b64encode(keys["evil"].sign(_payload(doc))).decode()}
            for _ in range(MAX_SIGNATURES)]
    for sigs in (doc["signatures"] + junk, junk + doc["signatures"]):  # team's first, last
        body = json.dumps({**doc, "signatures": sigs}).encode()
        with pytest.raises(SetSignatureError) as err:
            verified_sha256s(body, keys["trusted"], WHERE)
        assert str(err.value) == (f"{WHERE}: the set is refused: its signatures are not a "
                                  f"list of at most {MAX_SIGNATURES}; nothing downloaded")
    # exactly MAX_SIGNATURES (the team's among them) is still read
    body = json.dumps({**doc, "signatures": doc["signatures"] + junk[1:]}).encode()
    assert verified_sha256s(body, keys["trusted"], WHERE) == SHAS


def test_a_set_whose_sha256_map_misses_a_blob_is_refused_though_the_team_signed_it(
        keys) -> None:
    """The team key signed a sha256 map naming only one of two blobs: the other would be
    taken on its xxh3-128 alone. Only the coverage rule can refuse it (the signature
    verifies over that very map)."""
    from trtet_store.remote.keys import signature_problem

    for shas in ({BLOB_A: SHAS[BLOB_A]},  # a blob without a sha256
                 {**SHAS, "c" * 32: SHAS[BLOB_A]}):  # or a sha256 of no blob of the set
        doc = json.loads(_set_body())
        doc["sha256"] = shas
        doc["signatures"] = [{"key": keys["team"].key_id, "ed25519": base64.b64encode(
            keys["team"].sign(_payload(doc))).decode()}]
        assert signature_problem(doc["signatures"][0], keys["trusted"], _payload(doc)) is None
        with pytest.raises(SetSignatureError) as err:
            verified_sha256s(json.dumps(doc).encode(), keys["trusted"], WHERE)
        assert "names its blobs by xxh3-128 only (no sha256 for each): not trusted" \
            in str(err.value), err.value


# --- a lease's signature binds its bucket -----------------------------------------------------


def test_a_lease_signed_for_another_bucket_does_not_verify(keys) -> None:
    team_id = keys["team"].key_id
    body = lease_body("f" * 32, 1_800_000_000.0, 300, 1, signing_key=keys["team"],
                      bucket="bucket-a", object_key=LKEY)
    doc = json.loads(body)
    assert lease_refusal(doc, "bucket-a", LKEY, keys["trusted"]) is None  # where it was signed
    assert lease_refusal(doc, "bucket-b", LKEY, keys["trusted"]) == \
        f"its signature by {team_id} does not verify"


@pytest.fixture
def lease_env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "TRTET_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    k = tmp_path / "lease-keys"
    k.mkdir(mode=0o700)
    s3env.team = keygen(k / "team.key")
    s3env.keys = k
    return s3env


def test_a_lease_copied_from_another_bucket_holds_no_waiter(lease_env: Any, caplog) -> None:
    """The bucket writer copies the team's live signed lease of bucket A (same object key)
    into this bucket, rewriting it at every look: the waiter takes it over at once."""
    env = lease_env
    team = load_signing_key(env.keys / "team.key")
    beats = iter(range(2, 10_000))

    def copied(beat: int) -> bytes:
        return lease_body("f" * 32, 1_800_000_000.0, 300, beat, signing_key=team,
                          bucket=f"{env.bucket}-a", object_key=LKEY)

    _put(env, copied(1))
    clock = TestClock(lambda _: _put(env, copied(next(beats))))
    waiter = _tier(env, "w", clock)
    with caplog.at_level(logging.INFO, "trtet_store"):
        got = waiter.claim("k" * 32, timeout=600)
    assert isinstance(got, Lease) and got.holder != "f" * 32
    try:
        assert clock.sleeps == 0 and clock.t == 0.0  # not waited on at all
        assert json.loads(_get(env))["holder"] == got.holder
        [ignored] = _warnings(caplog, "ignored the build lease of")
        assert f"its signature by {env.team.key_id} does not verify" in ignored, ignored
    finally:
        got.release()
