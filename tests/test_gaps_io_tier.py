"""Checks of the shared tier's signing, publish and lease wait that no test set up (a gap audit).

- A signing publish of a file handed over with an xxh3-128 that is not its bytes' (the
  file rewritten since it was sealed, or a caller's wrong digest): the upload's own pass
  took the sha256 of the bytes it read, whose xxh3 is not the one the pointer would
  name; signing that sha256 would vouch for other bytes than the pointer's. Refused, no
  pointer written (SeaweedFS, the real upload).
- Which key vouches for an entry (``cache list``'s "signed by"): the trusted signer whose
  signature verifies, not the first signature's key.
- Signing again with the same key replaces its own signature, so re-signing never piles
  up signatures until the entry carries more than are read.
- The lease wait's last pause is what is left before the deadline, never a whole poll,
  and at the deadline exactly it ends.
- A caller's sha256 is taken only with its xxh3-128.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from clocks import TestClock
from test_signing_sha256 import _files, _tier
from test_signing_sha256 import env as env  # the fixture  # noqa: PLC0414

from trtet_store.cache.tier import RemoteEntry, keygen
from trtet_store.cache.tier.claim import _pause
from trtet_store.cache.tier.entry import parse_files
from trtet_store.cache.tier.lease import Clock, LeaseWaitTimeout, LeaseWatch
from trtet_store.cache.tier.signing import (
    MAX_SIGNATURES,
    load_public_key,
    load_signing_key,
    refusal,
    sign_entry,
    verified_by,
)

MiB = 1 << 20
KEY = "k" * 32


def test_a_signing_publish_of_a_file_whose_handed_xxh3_is_not_its_bytes_is_refused(
        env: Any, tmp_path: Path) -> None:
    """store.py _name_by_sha256: ``if source.sha256_xxh3 != d["digest"]``. The file is handed
    over with the xxh3-128 of the bytes it held when sealed; it was rewritten since (same
    size). The upload reads the new bytes and takes their sha256: that sha256 is not of the
    bytes the pointer names by xxh3, so nothing is signed and no pointer is written."""
    files = _files(tmp_path / "src", (2 * MiB + 3, 4000))
    sealed = [(n, p, xxhash.xxh3_128_hexdigest(p.read_bytes())) for n, p in files]
    record = files[0][1]
    record.write_bytes(os.urandom(record.stat().st_size))  # rewritten, same size
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    with pytest.raises(ValueError) as caught:
        a.publish(KEY, sealed, {"kind": "t"})
    said = str(caught.value)
    assert "the upload read bytes with xxh3-128 " \
        f"{xxhash.xxh3_128_hexdigest(record.read_bytes())}, not the {sealed[0][2]} it was " \
        "published with" in said, said
    assert a.read_pointer(KEY) is None  # nothing signed, nothing published
    # The control: handed over with its bytes' own xxh3, the same file is published, and
    # the signed sha256 is of those bytes.
    honest = [(n, p, xxhash.xxh3_128_hexdigest(p.read_bytes())) for n, p in files]
    assert a.publish(KEY, honest, {"kind": "t"}).published
    entry = a.lookup(KEY)
    assert entry.files[0]["sha256"] == hashlib.sha256(record.read_bytes()).hexdigest()


def _entry() -> RemoteEntry:
    return RemoteEntry(KEY, "etag", 1.0, "o", "h", f"{KEY}/a0/",
                       [{"name": "record", "size": 3, "digest": "0" * 32,
                         "sha256": hashlib.sha256(b"abc").hexdigest()}], {"kind": "t"})


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    keygen(d / "evil.key")
    return d


def test_the_signer_said_is_the_trusted_one_whose_signature_verifies(keys: Path) -> None:
    """signing.py verified_by: ``if _one(s, entry, trusted) is None``. Signed by evil first,
    then by the team: with the team trusted, the signer is the team, never evil (whose
    signature is first)."""
    team = load_public_key(keys / "team.key.pub")
    evil = load_signing_key(keys / "evil.key")
    entry = _entry()
    sign_entry(entry, evil)
    sign_entry(entry, load_signing_key(keys / "team.key"))
    trusted = {team.key_id: team}
    assert refusal(entry, trusted) is None
    assert [s["key"] for s in entry.signatures()] == [evil.key_id, team.key_id]
    assert verified_by(entry, trusted) == team.key_id
    # A changed entry: nobody vouches for it.
    entry.metadata["kind"] = "other"
    assert verified_by(entry, trusted) is None


def test_signing_again_with_the_same_key_replaces_its_own_signature(keys: Path) -> None:
    """signing.py sign_entry: ``others`` leaves out the signing key's own signature. Signed
    by the team more times than a pointer's signatures are read (and once by another key
    between): still one team signature, and the entry still verifies."""
    team_key = load_signing_key(keys / "team.key")
    evil = load_signing_key(keys / "evil.key")
    team = load_public_key(keys / "team.key.pub")
    entry = _entry()
    sign_entry(entry, team_key)
    assert isinstance(entry.signature, dict)  # one signer: a plain dict, as before lists
    sign_entry(entry, evil)
    for _ in range(MAX_SIGNATURES + 1):
        sign_entry(entry, team_key)
    assert [s["key"] for s in entry.signatures()] == [evil.key_id, team.key_id]
    assert refusal(entry, {team.key_id: team}) is None


def test_the_lease_waits_last_pause_is_what_is_left_before_the_deadline() -> None:
    """claim.py _pause: ``min(poll, left)`` and ``left <= 0``. A deadline 10 s away with a
    poll of 75 s: the pause is 10 s (a whole poll would wait 65 s past the wait_timeout);
    at the deadline exactly, and past it, the wait ends."""
    clock = TestClock()
    clock.t = 600.0
    doc = {"host": "elsewhere", "pid": 42}
    assert _pause(75.0, 610.0, clock, 610, KEY, "s3://b/c", doc) == pytest.approx(10.0)
    assert _pause(75.0, 700.0, clock, 700, KEY, "s3://b/c", doc) == pytest.approx(75.0)
    assert _pause(75.0, None, clock, None, KEY, "s3://b/c", doc) == 75.0
    for deadline in (600.0, 599.0):
        with pytest.raises(LeaseWaitTimeout, match="waited 610 s for the build lease of "
                           "elsewhere .pid 42.; it is still renewed"):
            _pause(75.0, deadline, clock, 610, KEY, "s3://b/c", doc)


def test_a_sha256_is_taken_only_with_its_xxh3(tmp_path: Path) -> None:
    """entry.py parse_files: a caller's sha256 without an xxh3-128 (which the publish then
    takes itself, and would sign the caller's sha256 beside it unchecked), or one that is
    not a sha256, is refused before anything is read."""
    p = tmp_path / "record"
    p.write_bytes(b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    xxh = xxhash.xxh3_128_hexdigest(b"abc")
    assert parse_files([("record", p, xxh, sha)]) == [("record", p, xxh, sha)]
    for bad in ([("record", p, None, sha)], [("record", p, xxh, sha.upper())],
                [("record", p, xxh, sha[:-1])]):
        with pytest.raises(ValueError, match="is not a sha256 hex digest given with the "
                           "file's xxh3-128"):
            parse_files(bad)


def test_a_signature_over_another_entry_is_not_a_signature_of_this_one(keys: Path) -> None:
    """signing.py refusal: the signature of one entry copied onto another (another key, same
    files) does not verify."""
    team_key = load_signing_key(keys / "team.key")
    team = load_public_key(keys / "team.key.pub")
    a, b = _entry(), _entry()
    b.key = "b" * 32
    b.attempt = f"{b.key}/a0/"
    sign_entry(a, team_key)
    b.signature = dict(a.signature)
    said = refusal(b, {team.key_id: team})
    assert said is not None and "does not verify" in said, said


# --- a pointer is parsed before anything trusts it ---------------------------------------------


def _doc() -> dict:
    import json

    return json.loads(_entry().to_json())


def _damage(edit: Any) -> bytes:
    import json

    doc = _doc()
    edit(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("edit, said", [
    (lambda d: d.update(format="trtet-store/cache-entry/2"),
     "not a cache-entry pointer (format 'trtet-store/cache-entry/2'"),
    (lambda d: d.update(metadata=["kind"]), "the pointer's 'metadata' is missing or not a dict"),
    (lambda d: d.update(created=True), "the pointer's 'created' is missing or not a number"),
    (lambda d: d.update(attempt=f"{'b' * 32}/a0/"),
     f"the pointer's attempt '{'b' * 32}/a0/' is not '{KEY}/<attempt>/'"),
    (lambda d: d.update(attempt=f"{KEY}/../"), "is not '"),
    (lambda d: d.update(attempt=f"{KEY}/a0/x/"), "is not '"),
    (lambda d: d["files"][0].update(name="../record"), "is not {'name', 'size', 'digest'}"),
    (lambda d: d["files"][0].update(size=-1), "is not {'name', 'size', 'digest'}"),
    (lambda d: d["files"][0].update(size=True), "is not {'name', 'size', 'digest'}"),
    (lambda d: d["files"].append(dict(d["files"][0])),
     "the pointer names no file, or one name twice"),
    (lambda d: d.update(files=[]), "the pointer names no file, or one name twice"),
], ids=["format", "metadata", "created bool", "attempt of another key", "attempt dotdot",
        "attempt deeper", "file name dotdot", "size negative", "size bool", "name twice",
        "no file"])
def test_a_pointer_a_bucket_writer_damaged_is_not_an_entry(edit: Any, said: str) -> None:
    """entry.py RemoteEntry.from_json: each field check. The untouched pointer parses."""
    assert RemoteEntry.from_json(_damage(lambda d: None), "e", KEY).key == KEY
    with pytest.raises(ValueError) as caught:
        RemoteEntry.from_json(_damage(edit), "e", KEY)
    assert said in str(caught.value), str(caught.value)


def test_a_signed_pointer_of_another_key_copied_to_this_key_is_not_its_entry(
        env: Any, tmp_path: Path) -> None:
    """entry.py from_json: ``doc["key"] != key``. Both entries are the team's, signed; a
    bucket writer copies k2's pointer to k1's name. Its signature verifies (it is k2's
    record), so only the key check keeps k2's files from being served as k1's."""
    import json

    src = _files(tmp_path / "src", (1000,))
    other = _files(tmp_path / "other", (1200,))
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    k1, k2 = "1" * 32, "2" * 32
    assert a.publish(k1, src, {"kind": "t"}).published
    assert a.publish(k2, other, {"kind": "t"}).published
    got = env.client.get_object(Bucket=env.bucket, Key=f"c/{k2}.json")["Body"].read()
    env.client.put_object(Bucket=env.bucket, Key=f"c/{k1}.json", Body=got)
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    damaged = b.read_pointer(k1)
    assert not isinstance(damaged, RemoteEntry), damaged
    assert f"the pointer names key {k2!r}, not {k1!r}" in damaged.reason
    assert b.lookup(k1) is None  # a miss: nothing downloaded
    assert json.loads(got)["key"] == k2 and b.signature_problem(b.lookup(k2)) is None


def test_an_honest_signed_entry_whose_files_are_already_here_is_served(
        env: Any, tmp_path: Path) -> None:
    """store.py download: a file the download found complete is read once, its sha256 taken
    (``file_digests(..., sha256=signed)``): without it, every valid signed entry whose
    files a cut download left complete would be refused."""
    files = _files(tmp_path / "src", (MiB + 7, 2000))
    a = _tier(env, "a", signing_key=env.keys / "team.key")
    assert a.publish(KEY, files, {"kind": "t"}).published
    dl = tmp_path / "dl"
    dl.mkdir()
    for name, p in files:
        (dl / name).write_bytes(p.read_bytes())
    b = _tier(env, "b", trusted_keys=[env.keys / "team.key.pub"])
    got = b.download(b.lookup(KEY), dl)
    assert got.downloaded == 0  # nothing fetched again
    for name, p in files:
        assert got.paths[name].read_bytes() == p.read_bytes()
        assert got.digests[name].sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_leases_ttl_is_its_own_up_to_twice_ours_and_never_zero_or_a_bool() -> None:
    """lease.py capped_ttl: ``claimed <= 0`` and ``bool`` are no ttl (ours is used: a ttl of 0
    would make every waiter take a live lease over at its first look), and exactly twice
    ours is the claim itself, only more is capped."""
    from trtet_store.cache.tier.lease import capped_ttl

    assert capped_ttl(600, 300.0) == (600.0, None)
    assert capped_ttl(600.5, 300.0) == (600.0, "its ttl 600.5 s is capped to 600 s")
    assert capped_ttl(0.25, 300.0) == (0.25, None)
    for bad in (0, 0.0, -0.0, True, False):
        ttl, why = capped_ttl(bad, 300.0)
        assert ttl == 300.0 and why == f"its ttl {bad!r} is not a number of seconds; 300 s " \
            "is used", (bad, ttl, why)


class _Steps(Clock):
    """A clock the test moves (no wall time passes)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_two_holders_old_signed_leases_replayed_in_turn_do_not_renew_it() -> None:
    """lease.py LeaseWatch._token: a signed lease counts as renewed only when its holder's
    beat moves past the highest seen (``beat > last``). A bucket writer holding two old
    signed bodies (holder A at beat 5, holder B at beat 1) and writing them in turn makes
    every look see a changed holder; with ``>=`` (final audit V8, which passed every test)
    each replay reset the ttl and the waiter waited for ever. Here it is judged dead one
    ttl after B first appeared."""
    clock = _Steps()
    watch = LeaseWatch("s3://b/cache: k", own_ttl=10.0, deadline=None, clock=clock)
    bodies = [{"holder": "A", "beat": 5, "ttl": 10.0}, {"holder": "B", "beat": 1, "ttl": 10.0}]
    dead_at = None
    for look in range(12):  # a look every 4 s for 48 s, the bodies alternating
        dead, _ttl, _unchanged = watch.look(bodies[look % 2], f"etag-{look}", None, None,
                                            signed=True)
        if dead:
            dead_at = look
            break
        clock.sleep(4.0)
    # B (a holder not seen before) renews it at 4 s; nothing after does: dead at 16 s.
    assert dead_at == 4, dead_at
    # An honest holder whose beat moves on keeps it alive all the while.
    honest = LeaseWatch("s3://b/cache: k", own_ttl=10.0, deadline=None, clock=clock)
    for beat in range(12):
        assert not honest.look({"holder": "A", "beat": beat, "ttl": 10.0}, f"e{beat}", None,
                               None, signed=True)[0]
        clock.sleep(4.0)


@pytest.mark.parametrize(("age", "pruned"), [(15.0, False), (19.9, False), (20.1, True)])
def test_prune_removes_a_lease_only_after_two_of_its_ttls_on_the_servers_clock(
        age: float, pruned: bool) -> None:
    """lease.py prunable: a live holder rewrites its lease every ttl/3 and a waiter takes
    over after one ttl, so prune waits two (a late renewal keeps its lease). Final audit
    V9 (one ttl) passed every test: no test dated a lease between one and two ttls."""
    from trtet_store.cache.tier.lease import prunable
    from trtet_store.remote.jsondoc import Dated

    body = b'{"holder": "h", "beat": 3, "ttl": 10.0}'
    dated = Dated(body, "etag", len(body), modified=5000.0, server_now=5000.0 + age)
    assert dated.age == pytest.approx(age)
    assert prunable(dated, 30.0) is pruned  # the lease's own ttl (10 s) counts, not ours
