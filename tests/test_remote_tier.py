"""trtet_store.cache.tier on the real SeaweedFS fixture: publish, download, races, tampering,
leases, prune, and a server that is not there.

Every state a test needs (a rival's pointer committed mid-publish, an object
overwritten, a holder that stopped renewing) is set up deterministically.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from clocks import TestClock

from trtet_store.cache.tier import (
    Lease,
    LeaseWaitTimeout,
    RemoteEntry,
    RemoteTier,
    TierEntryError,
)
from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    RemoteURLError,
)
from trtet_store.remote.s3 import S3

MiB = 1 << 20


@pytest.fixture
def env(s3env: Any) -> Any:
    return s3env


def _tier(env: Any, origin: str = "a", **kw: Any) -> RemoteTier:
    kw.setdefault("journal_dir", env.journal_dir / origin)
    return RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url,
                      origin=origin, **kw)


def _files(directory: Path, seed: bytes, sizes: tuple[int, ...] = (3 * MiB + 7, 1000)
           ) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, size in enumerate(sizes):
        name = "record" if i == 0 else f"e{i - 1}"
        data = (hashlib.sha256(seed + bytes([i])).digest() * (size // 32 + 1))[:size]
        p = directory / name
        p.write_bytes(data)
        out.append((name, p))
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _keys(env: Any, prefix: str = "") -> list[str]:
    return sorted(S3(client=env.client).list_keys(env.bucket, prefix, delimiter=""))


def _visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


# --- 1. publish, lookup, download, resume --------------------------------------------------


def test_publish_lookup_download_is_byte_identical_and_resumes(env: Any, tmp_path: Path) -> None:
    tier = _tier(env)
    files = _files(tmp_path / "src", b"one")
    pub = tier.publish("k1", files, {"kind": "test"})
    assert pub.published and pub.reason is None
    assert pub.sent == sum(p.stat().st_size for _, p in files)
    entry = tier.lookup("k1")
    assert entry is not None and entry.etag == pub.entry.etag
    assert entry.metadata == {"kind": "test"} and [f["name"] for f in entry.files] == \
        ["record", "e0"]
    assert entry.size == sum(p.stat().st_size for _, p in files)

    other = _tier(env, "b")
    out = tmp_path / "dl"
    got = other.download(other.lookup("k1"), out)
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}
    assert got.downloaded == entry.size
    assert _visible(out) == ["e0", "record"]

    # Complete already: nothing is downloaded again.
    again = other.download(entry, out)
    assert again.downloaded == 0
    assert {n: _sha(p) for n, p in again.paths.items()} == {n: _sha(p) for n, p in files}


class _Cut(Exception):
    pass


def test_a_cut_download_resumes_without_downloading_everything(env: Any,
                                                              tmp_path: Path) -> None:
    tier = _tier(env, concurrency=1, range_size=MiB)
    files = _files(tmp_path / "src", b"two", sizes=(4 * MiB, 10))
    entry = tier.publish("k2", files, {}).entry
    out = tmp_path / "dl"

    def cut(p: Any) -> None:
        # Ranges of 1 MiB, one at a time: at 2 MiB received the first range is queued
        # for the writer (kept), the second is not.
        if p.downloaded >= 2 * MiB:
            raise _Cut

    with pytest.raises(_Cut):
        tier.download(entry, out, progress=cut)
    assert not (out / "record").exists()  # never a partial file under its name
    got = tier.download(entry, out)
    assert 0 < got.downloaded <= entry.size - MiB, got.downloaded
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}


def _attempt_of(tier: RemoteTier, files: list[tuple[str, Path]]) -> str:
    from trtet_store.cache.tier.entry import attempt_id, file_digest

    return attempt_id(tier.origin, [{"name": n, "size": file_digest(p)[0],
                                     "digest": file_digest(p)[1]} for n, p in files])


def _publish_raw(env: Any, files: list[tuple[str, Path]], prefix: str, journal: Path) -> None:
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    publish_sources([ObjectSource.of_file(p, n) for n, p in files],
                    f"s3://{env.bucket}/{prefix}{files[0][0]}", endpoint_url=env.endpoint.url,
                    replace=True, config=PublishConfig(journal_dir=journal, index=False))


def test_an_upload_complete_before_a_kill_is_committed_without_sending_again(
        env: Any, tmp_path: Path) -> None:
    tier = _tier(env)
    files = _files(tmp_path / "src", b"K")
    # A run killed between its manifest and its pointer left the attempt complete.
    _publish_raw(env, files, f"cache/k/{_attempt_of(tier, files)}/", tmp_path / "j0")
    pub = tier.publish("k", files, {"m": 1})
    assert pub.published and pub.sent == 0, pub
    got = tier.download(tier.lookup("k"), tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}


def test_a_completed_attempt_of_other_bytes_is_sent_again_not_committed(
        env: Any, tmp_path: Path) -> None:
    tier = _tier(env)
    files = _files(tmp_path / "src", b"K")
    other = _files(tmp_path / "other", b"not K")
    _publish_raw(env, other, f"cache/k/{_attempt_of(tier, files)}/", tmp_path / "j0")
    pub = tier.publish("k", files, {})
    assert pub.published and pub.sent == sum(p.stat().st_size for _, p in files), pub
    got = tier.download(tier.lookup("k"), tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}


def test_a_publish_cut_midway_resumes_its_upload(env: Any, tmp_path: Path) -> None:
    tier = _tier(env, concurrency=1)
    files = _files(tmp_path / "src", b"R", sizes=(11 * MiB, 10))

    def cut(p: Any) -> None:
        if p.sent >= 8 * MiB:  # the first 8 MiB part is sent
            raise _Cut

    with pytest.raises(_Cut):
        tier.publish("r", files, {}, progress=cut)
    assert tier.lookup("r") is None
    pub = tier.publish("r", files, {})
    assert pub.published and 0 < pub.sent <= 11 * MiB + 10 - 8 * MiB, pub
    got = tier.download(tier.lookup("r"), tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}


# --- 2. first wins -------------------------------------------------------------------------


def _attempt_keys(env: Any, key: str, origin: str) -> list[str]:
    return [k for k in _keys(env, f"cache/{key}/") if k.split("/")[2].startswith(f"{origin}-")]


def _winner_intact(env: Any, entry: RemoteEntry, files: list[tuple[str, Path]],
                   tmp: Path) -> None:
    """The winner's objects are the versions its manifest names, and read back as its files."""
    s3 = S3(client=env.client)
    from trtet_store.remote.manifest import Manifest

    raw, _ = s3.get(env.bucket, f"cache/{entry.attempt}record.trtet.json")
    for o in Manifest.from_json(raw).objects:
        assert s3.head(env.bucket, o.key).etag == o.etag
    got = _tier(env, "reader").download(entry, tmp)
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}


def test_a_second_publish_of_a_key_is_not_published_and_sends_nothing(env: Any,
                                                                     tmp_path: Path) -> None:
    a, b = _tier(env, "a"), _tier(env, "b")
    fa, fb = _files(tmp_path / "a", b"A"), _files(tmp_path / "b", b"B")
    first = a.publish("k", fa, {"by": "a"})
    second = b.publish("k", fb, {"by": "b"})
    assert first.published and not second.published
    assert "already in the shared cache" in second.reason and "origin a" in second.reason
    assert second.sent == 0 and second.entry.etag == first.entry.etag
    assert _attempt_keys(env, "k", "b") == []
    _winner_intact(env, first.entry, fa, tmp_path / "check")


def test_the_loser_of_a_race_past_the_lookup_removes_its_attempt(env: Any,
                                                                 tmp_path: Path) -> None:
    a, b = _tier(env, "a"), _tier(env, "b")
    fa, fb = _files(tmp_path / "a", b"A"), _files(tmp_path / "b", b"B")
    won: list[Any] = []

    def rival_commits(_: Any) -> None:
        # b has looked the key up (no pointer) and is uploading: a commits now.
        if not won:
            won.append(a.publish("k", fa, {"by": "a"}))

    lost = b.publish("k", fb, {"by": "b"}, progress=rival_commits)
    assert won and won[0].published
    assert not lost.published, lost
    assert "published it first" in lost.reason and "origin a" in lost.reason
    assert lost.sent > 0 and lost.entry.etag == won[0].entry.etag
    assert a.lookup("k").etag == won[0].entry.etag
    assert _attempt_keys(env, "k", "b") == []  # its attempt's objects removed
    assert S3(client=env.client).list_uploads(env.bucket, "cache/") == []
    _winner_intact(env, won[0].entry, fa, tmp_path / "check")


# --- 3. tampering, and the replacement of a damaged entry ----------------------------------


def _put_raw(env: Any, key: str, data: bytes) -> None:
    env.client.put_object(Bucket=env.bucket, Key=key, Body=data)


def _damaged(tier: RemoteTier, entry: RemoteEntry, out: Path) -> TierEntryError:
    with pytest.raises(TierEntryError) as info:
        tier.download(entry, out)
    assert info.value.key == entry.key
    # Nothing of the entry left under its names: never the bad bytes.
    assert _visible(out) == []
    return info.value


def test_an_object_overwritten_with_same_size_bytes_is_never_served(env: Any,
                                                                    tmp_path: Path) -> None:
    tier = _tier(env)
    files = _files(tmp_path / "src", b"T1")
    entry = tier.publish("t1", files, {}).entry
    e0 = files[1][1].read_bytes()
    _put_raw(env, f"cache/{entry.attempt}e0", bytes(b ^ 0xFF for b in e0))
    _damaged(tier, tier.lookup("t1"), tmp_path / "dl")


def test_a_truncated_object_is_never_served(env: Any, tmp_path: Path) -> None:
    tier = _tier(env)
    files = _files(tmp_path / "src", b"T2")
    entry = tier.publish("t2", files, {}).entry
    _put_raw(env, f"cache/{entry.attempt}record", files[0][1].read_bytes()[:MiB])
    _damaged(tier, tier.lookup("t2"), tmp_path / "dl")


def test_an_attempt_rewritten_consistently_fails_the_pointers_digests_and_is_replaced(
        env: Any, tmp_path: Path) -> None:
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    tier = _tier(env)
    files = _files(tmp_path / "src", b"T3")
    entry = tier.publish("t3", files, {"v": 1}).entry
    # Objects AND their manifest rewritten by a publish of other bytes of the same size
    # into the same attempt directory: fetch's own checks all pass.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "record").write_bytes(files[0][1].read_bytes())
    (bad / "e0").write_bytes(bytes(b ^ 0x5A for b in files[1][1].read_bytes()))
    publish_sources([ObjectSource.of_file(bad / "record", "record"),
                     ObjectSource.of_file(bad / "e0", "e0")],
                    f"s3://{env.bucket}/cache/{entry.attempt}record",
                    endpoint_url=env.endpoint.url, replace=True,
                    config=PublishConfig(journal_dir=tmp_path / "j2", index=False))
    err = _damaged(tier, tier.lookup("t3"), tmp_path / "dl")
    assert err.name == "e0"

    # The damaged entry is replaced (If-Match its pointer): a new attempt, the old one gone.
    old_keys = _keys(env, f"cache/{entry.attempt}")
    assert old_keys
    rep = tier.publish("t3", files, {"v": 2}, replace=entry)
    assert rep.published, rep
    now = tier.lookup("t3")
    assert now.etag == rep.entry.etag != entry.etag and now.attempt != entry.attempt
    assert now.metadata == {"v": 2}
    assert _keys(env, f"cache/{entry.attempt}") == []
    got = tier.download(now, tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}
    # A replacement pinned to a pointer that moved since is not published.
    stale = tier.publish("t3", files, {"v": 3}, replace=entry)
    assert not stale.published and tier.lookup("t3").etag == now.etag


# --- 4. leases -----------------------------------------------------------------------------


class _Waiter(threading.Thread):
    def __init__(self, tier: RemoteTier, key: str, timeout: float | None = 20.0) -> None:
        super().__init__(daemon=True)
        self.tier, self.key, self.timeout = tier, key, timeout
        self.result: Any = None
        self.waited = 0
        self.seconds = 0.0

    def _on_wait(self, _: dict) -> None:
        self.waited += 1

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.result = self.tier.claim(self.key, timeout=self.timeout, on_wait=self._on_wait)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.result = exc
        self.seconds = time.monotonic() - start


def _lt(env: Any, origin: str, ttl: float = 1.0, client: Any = None) -> RemoteTier:
    kw: dict[str, Any] = {"lease_ttl": ttl, "poll": 0.05}
    if client is not None:
        kw["client"] = client
    return _tier(env, origin, **kw)


def _until(cond: Any, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_released_lease_goes_to_the_waiter_at_once(env: Any) -> None:
    # The waiter's clock moves only when it sleeps (tests/clocks.py), and the holder
    # releases at its third sleep: 0.15 s on that clock against a 60 s ttl, so only the
    # deleted lease, never its expiry, can let the waiter in, however slow the machine.
    a, b = _lt(env, "a", ttl=60.0), _lt(env, "b", ttl=60.0)
    lease = a.claim("L")
    assert isinstance(lease, Lease) and len(lease.holder) == 32
    doc = json.loads(env.client.get_object(Bucket=env.bucket, Key="cache/L.lease")["Body"].read())
    assert doc["holder"] == lease.holder and doc["ttl"] == 60.0
    looks: list[dict] = []
    b.clock = TestClock(lambda clock: lease.release() if clock.sleeps == 3 else None)
    got = b.claim("L", timeout=30.0, on_wait=looks.append)
    assert isinstance(got, Lease) and got.holder != lease.holder
    assert len(looks) == 3 and b.clock.sleeps == 3  # in at the first look after the release
    got.release()
    assert _keys(env, "cache/L.lease") == []


def test_a_holder_that_stops_renewing_is_taken_over_after_its_ttl(env: Any) -> None:
    a, b = _lt(env, "a"), _lt(env, "b")
    lease = a.claim("K")
    lease._stop_renewing()  # a killed holder: its lease object stays, unchanged
    w = _Waiter(b, "K")
    w.start()
    w.join(10)
    assert isinstance(w.result, Lease), w.result
    assert w.seconds >= 1.0  # not before the ttl passed on the waiter's clock
    w.result.release()


def test_a_lease_taken_from_its_holder_is_lost_and_its_release_leaves_the_new_one(
        env: Any) -> None:
    a = _lt(env, "a", ttl=0.6)
    lease = a.claim("X")
    _put_raw(env, "cache/X.lease", b'{"holder": "someone else"}')  # taken over meanwhile
    _until(lambda: lease.lost)  # the next renewal (If-Match our ETag) finds it
    lease.release()
    body = env.client.get_object(Bucket=env.bucket, Key="cache/X.lease")["Body"].read()
    assert json.loads(body) == {"holder": "someone else"}
    # Taken over after the last renewal (none in a 60 s ttl): release deletes If-Match ours.
    slow = _lt(env, "a", ttl=60.0).claim("Y")
    _put_raw(env, "cache/Y.lease", b'{"holder": "another"}')
    slow.release()
    body = env.client.get_object(Bucket=env.bucket, Key="cache/Y.lease")["Body"].read()
    assert json.loads(body) == {"holder": "another"}


def test_a_live_lease_makes_a_waiter_time_out(env: Any) -> None:
    # Renewed at each of the waiter's sleeps (its clock moves only then, 5 s a look), the
    # holder's background renewals stopped: the waiter looks for 45 s on its clock, past the
    # lease's 30 s ttl, so only the renewals keep it live; on the server's clock (Date less
    # Last-Modified) a renewal is never more than one look old.
    a, b = _tier(env, "a", lease_ttl=30.0, poll=5.0), _tier(env, "b", lease_ttl=30.0, poll=5.0)
    lease = a.claim("T")
    lease._stop_renewing()
    renewed: list[bool] = []
    b.clock = TestClock(lambda clock: renewed.append(lease.renew()))
    try:
        with pytest.raises(LeaseWaitTimeout):
            b.claim("T", timeout=45.0)
        assert b.clock.t >= 45.0 and renewed and all(renewed)
        assert not lease.lost
    finally:
        lease.release()


def test_a_waiter_returns_the_entry_the_holder_publishes(env: Any, tmp_path: Path) -> None:
    # The holder publishes at the waiter's second sleep; the waiter's clock moves only
    # when it sleeps and the ttl is 60 s, so the waiter gets the entry, never a takeover,
    # however long the publish (hashing, uploading) takes on a loaded machine.
    a, b = _lt(env, "a", ttl=60.0), _lt(env, "b", ttl=60.0)
    lease = a.claim("P")
    files = _files(tmp_path, b"P")
    pubs: list[Any] = []
    b.clock = TestClock(
        lambda clock: pubs.append(a.publish("P", files, {"x": 1})) if clock.sleeps == 2 else None)
    got = b.claim("P", timeout=30.0)
    lease.release()
    assert isinstance(got, RemoteEntry) and got.etag == pubs[0].entry.etag
    assert b.clock.sleeps == 2  # returned at the first look after the publish
    assert a.claim("P").etag == pubs[0].entry.etag  # an entry: no lease at all


class _TakeoverBarrier(S3):
    """An S3 whose first conditional overwrite (a takeover) waits for the other waiter's."""

    def __init__(self, barrier: threading.Barrier, **kw: Any) -> None:
        super().__init__(**kw)
        self.barrier: threading.Barrier | None = barrier

    def put(self, *args: Any, **kw: Any) -> str:
        if kw.get("if_match") and self.barrier is not None:
            barrier, self.barrier = self.barrier, None
            barrier.wait(10)
        return super().put(*args, **kw)


def test_two_waiters_taking_over_a_stale_lease_at_once_one_gets_it(env: Any) -> None:
    a = _lt(env, "a")
    stale = a.claim("S")
    stale._stop_renewing()
    barrier = threading.Barrier(2)
    # Each waiter's clock moves only when it sleeps (tests/clocks.py): the stale lease (1 s
    # ttl) is dead after 1 s on it, and the winner's lease (60 s ttl) stays live through the
    # loser's 3 s wait without a renewal, however slow the machine.
    tiers = [_lt(env, o, ttl=60.0, client=_TakeoverBarrier(barrier, client=env.client))
             for o in ("b", "c")]
    for tier in tiers:
        tier.clock = TestClock()
    waiters = [_Waiter(tier, "S", timeout=3.0) for tier in tiers]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join(15)
    leases = [w.result for w in waiters if isinstance(w.result, Lease)]
    timeouts = [w.result for w in waiters if isinstance(w.result, LeaseWaitTimeout)]
    assert len(leases) == 1 and len(timeouts) == 1, [w.result for w in waiters]
    leases[0].release()


# --- 5. no server, wrong credentials, missing bucket ---------------------------------------


def test_no_server_wrong_credentials_missing_bucket_are_their_errors(env: Any) -> None:
    import dataclasses
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=f"http://127.0.0.1:{port}",
                      connect_timeout=1)
    for call in (dead.check, lambda: dead.lookup("k")):
        with pytest.raises(EndpointUnreachableError):
            call()
    wrong = dataclasses.replace(env.endpoint, secret_key="not-the-secret").client()
    denied = RemoteTier(f"s3://{env.bucket}/cache", client=wrong)
    for call in (denied.check, lambda: denied.lookup("k")):
        with pytest.raises(AccessDeniedError):
            call()
    missing = RemoteTier("s3://no-such-bucket-here/cache", endpoint_url=env.endpoint.url)
    for call in (missing.check, lambda: missing.lookup("k")):
        with pytest.raises(BucketNotFoundError):
            call()


# --- 6. entries and prune ------------------------------------------------------------------


def _rewrite_created(env: Any, tier: RemoteTier, key: str, created: float) -> None:
    e = tier.lookup(key)
    e.created = created
    from trtet_store.cache.tier.lease import put

    put(tier.s3, env.bucket, f"cache/{key}.json", e.to_json(), if_match=e.etag)


def _orphan(env: Any, tmp_path: Path, key: str, attempt: str, seed: bytes) -> None:
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.send import publish_sources
    from trtet_store.remote.upload.source import ObjectSource

    (name, path), = _files(tmp_path / attempt, seed, sizes=(100,))
    publish_sources([ObjectSource.of_file(path, name)],
                    f"s3://{env.bucket}/cache/{key}/{attempt}/{name}",
                    endpoint_url=env.endpoint.url,
                    config=PublishConfig(journal_dir=tmp_path / "jo", index=False))


class _CommitsDuringPrune(RemoteTier):
    """A tier whose entries() listing is followed by a publisher committing ``late``'s pointer."""

    def entries(self) -> list[RemoteEntry]:
        out = super().entries()
        from trtet_store.cache.tier.lease import put

        late = RemoteEntry("late", "", time.time(), "d", "elsewhere",
                           "late/d-00000000000000dd/",
                           [{"name": "record", "size": 100, "digest": "0" * 32}], {})
        put(self.s3, self.bucket, "cache/late.json", late.to_json(), if_none_match=True)
        return out


def test_prune_removes_old_entries_orphans_and_dead_leases_never_a_live_attempt(
        env: Any, tmp_path: Path) -> None:
    tier = _CommitsDuringPrune(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url,
                               origin="a", journal_dir=env.journal_dir)
    small = (100, 10)
    tier.publish("old", _files(tmp_path / "o", b"o", small), {})
    live = tier.publish("live", _files(tmp_path / "l", b"l", small), {}).entry
    _orphan(env, tmp_path, "lost", "b-00000000000000aa", b"x")
    _orphan(env, tmp_path, "late", "d-00000000000000dd", b"z")  # its pointer comes mid-prune
    _put_raw(env, "cache/dead.lease", b"{}")
    held = tier.claim("held")  # ttl 300 s: renewed every 100 s, so unchanged during prune
    assert isinstance(held, Lease)
    time.sleep(2.5)
    # Everything above is older than `boundary - 2.5`, everything below younger than
    # `boundary - 1` (the server's LastModified is truncated to the second). Each prune
    # cuts at `boundary - 1.5`, whatever time the steps take on a loaded machine.
    boundary = time.time()

    def older() -> float:
        return time.time() - boundary + 1.5

    _rewrite_created(env, tier, "old", boundary - 1000)
    _rewrite_created(env, tier, "live", time.time())  # fresh pointer, old attempt objects
    tier.publish("new", _files(tmp_path / "n", b"n", small), {})
    _orphan(env, tmp_path, "lost", "c-00000000000000bb", b"y")
    before = _keys(env)
    assert [e.key for e in RemoteTier.entries(tier)] == ["live", "new", "old"]

    want = sorted(["old", "lost/b-00000000000000aa/", "dead.lease"])
    assert sorted(tier.prune(older(), dry_run=True)) == want
    assert _keys(env) == sorted([*before, "cache/late.json"])
    env.client.delete_object(Bucket=env.bucket, Key="cache/late.json")
    assert sorted(tier.prune(older())) == want
    after = _keys(env)
    assert [e.key for e in RemoteTier.entries(tier)] == ["late", "live", "new"]
    assert [k for k in after if k.startswith("cache/late/d-")] != []
    assert not [k for k in after if k.startswith(("cache/old", "cache/lost/b-",
                                                  "cache/dead"))]
    assert [k for k in after if k.startswith(f"cache/{live.attempt}")] == \
        [k for k in before if k.startswith(f"cache/{live.attempt}")] != []
    assert [k for k in after if k.startswith("cache/lost/c-")] != []
    assert "cache/held.lease" in after  # a live lease is kept
    held.release()
    got = tier.download(tier.lookup("live"), tmp_path / "dl")
    assert got.downloaded == live.size


# --- 7. bad input --------------------------------------------------------------------------


def test_bad_input_is_refused_before_any_request(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: any request would be refused differently
    for url in ("http://b/p", "s3://", "s3:///p", "s3://b/a//c", "s3://b/../x"):
        with pytest.raises(RemoteURLError) as refused:
            RemoteTier(url, endpoint_url=dead)
        # Said of the URL given (not of a probe key under it), in a tier's words.
        assert str(refused.value).startswith(repr(url)), refused.value
        assert "s3://bucket/key" not in str(refused.value), refused.value
    with pytest.raises(ValueError, match="lease_ttl"):
        RemoteTier("s3://bucket", endpoint_url=dead, lease_ttl=0)
    with pytest.raises(ValueError, match="poll"):
        RemoteTier("s3://bucket", endpoint_url=dead, poll=-1)
    with pytest.raises(TypeError):
        RemoteTier("s3://bucket", endpoint_url=dead, lease_tll=5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="origin"):
        RemoteTier("s3://bucket", endpoint_url=dead, origin="a/b")
    tier = RemoteTier("s3://bucket/p", endpoint_url=dead)
    assert tier.url == "s3://bucket/p" and tier.prefix == "p/"
    f = tmp_path / "f"
    f.write_bytes(b"x")
    for key in ("a/b", "", ".hidden", "x.trtet.json"):
        with pytest.raises(ValueError, match="key"):
            tier.publish(key, [("f", f)], {})
        with pytest.raises(ValueError, match="key"):
            tier.claim(key)
    with pytest.raises(ValueError, match="empty"):
        tier.publish("k", [], {})
    with pytest.raises(ValueError, match="one name"):
        tier.publish("k", [("f", f), ("f", f)], {})
    with pytest.raises(FileNotFoundError):
        tier.publish("k", [("f", tmp_path / "missing")], {})
    with pytest.raises(TypeError, match="JSON"):
        tier.publish("k", [("f", f)], {"x": object()})
    with pytest.raises(TypeError):
        tier.publish("k", [("f", f)], {}, replace_entry=None)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="older_than"):
        tier.prune(-1)
    assert os.listdir(tmp_path) == ["f"]


def test_the_tier_sits_above_upload_and_download_and_knows_no_engine() -> None:
    import ast
    import warnings

    import trtet_store.cache as cache
    import trtet_store.cache.tier as tier
    import trtet_store.remote as remote

    remote_root = Path(remote.__file__).resolve().parent
    tier_root = Path(tier.__file__).resolve().parent

    def imports(path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                out.add(node.module or "")
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
        return out

    for path in remote_root.rglob("*.py"):
        assert not any("cache" in m.split(".") for m in imports(path)), path
    for path in tier_root.rglob("*.py"):
        bad = [m for m in imports(path)
               if m.split(".")[0] in ("torch", "tensorrt", "executorch")
               or m.startswith("trtet_store.export")]
        assert bad == [], (path, bad)
    for name in tier.__all__:
        if name != "keygen":
            assert getattr(cache, name) is getattr(tier, name), name
        if name in remote.__all__:  # the remote floor's own error, exported by both faces
            assert getattr(remote, name) is getattr(tier, name), name
            continue
        if name not in remote._MOVED_TO_CACHE_TIER:  # new since the move (LeaseWait): no old home
            assert not hasattr(remote, name), name
            continue
        # The old home stays one release, warning where the name went.
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert getattr(remote, name) is getattr(tier, name), name
        assert [str(w.message) for w in said] == [
            f"trtet_store.remote.{name} moved to trtet_store.cache.tier.{name}; import it "
            "from there (this alias goes in the next release)"], name
        assert said[0].category is DeprecationWarning and said[0].filename == __file__


