"""What a bucket writer can put in the shared tier's small objects, and what the reader does.

On the real SeaweedFS fixture (issue 44 items 6 and 7, issue 45 items 4, 16, 17):

- a lease's ttl is the bucket's word: capped at twice the waiter's own;
- a lease's staleness is its age on the server's clock (Date less
  Last-Modified): a lease dead for long is taken over at once, and prune
  removes a lease dead for two ttls, never one renewed within them;
- a wait says when it starts (WARNING: holder, until when) and, once, when
  it outlasts the lease's ttl;
- manifests, pointers and leases are read with a size cap checked before
  the body (bytes counted through a proxy) and parsed with a depth cap;
- a damaged pointer is listed as damaged, never breaks the others, and is
  replaced by the next publisher (If-Match its ETag);
- a publish source that is not a regular file is one clear refusal.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from clocks import TestClock

from trtet_store.cache.tier import Lease, LeaseWaitTimeout, RemoteTier
from trtet_store.cache.tier.entry import DamagedPointer
from trtet_store.remote.errors import ManifestError, NotARegularFileError
from trtet_store.remote.s3 import S3
from trtet_store.testing.proxy import CountingProxy

MiB = 1 << 20


def _tier(env: Any, origin: str = "a", endpoint: str | None = None, **kw: Any) -> RemoteTier:
    kw.setdefault("journal_dir", env.journal_dir / origin)
    kw.setdefault("poll", 0.05)
    return RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=endpoint or env.endpoint.url,
                      origin=origin, **kw)


def _put(env: Any, key: str, body: bytes) -> None:
    env.client.put_object(Bucket=env.bucket, Key=key, Body=body)


def _lease(ttl: Any, holder: str = "f" * 32) -> bytes:
    now = time.time()
    doc = {"holder": holder, "host": "elsewhere", "pid": 4242, "started": now - 60,
           "renewed": now, "ttl": ttl, "beat": 1}
    return json.dumps(doc).encode()  # Infinity/NaN written as JSON's extension, as json reads


def _keys(env: Any, prefix: str = "cache/") -> list[str]:
    return sorted(S3(client=env.client).list_keys(env.bucket, prefix, delimiter=""))


def _file(directory: Path, name: str, data: bytes) -> tuple[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)
    return name, directory / name


def _warnings(caplog: Any, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.fixture
def env(s3env: Any) -> Any:
    return s3env


# --- leases: the ttl read from the bucket is capped (44.6) -----------------------------------


@pytest.mark.parametrize("claimed", [1e12, float("inf"), float("nan"), -5, "forever", None])
def test_a_lease_claiming_a_huge_or_damaged_ttl_holds_a_waiter_at_most_twice_its_own(
        env: Any, caplog: Any, claimed: Any) -> None:
    # The wait's clock moves only as it sleeps (no wall time waited), so its ttl can be long
    # enough that no stall of this machine ages the lease past it on the server's clock
    # between the put and the takeover (a few looks, a poll of 5 s each on that clock).
    own = 30.0
    _put(env, "cache/K.lease", _lease(claimed))
    tier = _tier(env, lease_ttl=own, poll=5.0)
    tier.clock = clock = TestClock()
    with caplog.at_level(logging.INFO, "trtet_store"):
        got = tier.claim("K", timeout=300)
    assert isinstance(got, Lease)
    got.release()
    # Never renewed: taken over once unchanged for the capped ttl (2 x 30 s), or 30 s for a
    # ttl that is no number, on the waiter's clock: the takeover says which ttl it judged
    # by, and it waited that long (to the poll after it), not the timeout.
    ttl = 2 * own if claimed == 1e12 else own
    assert ttl < clock.t <= ttl + 5.0, clock.t
    took = _warnings(caplog, "took over the build lease of elsewhere")
    assert len(took) == 1 and f"(its ttl {ttl:.1f} s)" in took[0], caplog.text
    started = _warnings(caplog, "is being built by holder " + "f" * 32)
    assert len(started) == 1, caplog.text
    assert "elsewhere" in started[0] and "its lease runs until" in started[0]
    assert ("capped to 60 s" if claimed == 1e12 else
            "is not a number of seconds; 30 s is used") in started[0]


def test_a_renewed_lease_is_waited_out_with_one_warning_past_its_ttl(
        env: Any, caplog: Any) -> None:
    holder = _tier(env, "h", lease_ttl=10.0).claim("R")
    assert isinstance(holder, Lease)
    holder._stop_renewing()  # renewed below, between the waiter's looks, as a live holder
    waiter = _tier(env, "w", lease_ttl=10.0, poll=1.0)
    # The waiter's clock moves only as it sleeps (no wall time waited); the holder renews
    # at every third of its polls (3 s of that clock, within the ttl of 10 s).
    waiter.clock = TestClock(lambda c: c.sleeps % 3 or holder.renew())
    try:
        with caplog.at_level(logging.INFO, "trtet_store"), \
                pytest.raises(LeaseWaitTimeout, match="waited 35 s for the build lease"):
            waiter.claim("R", timeout=35)
    finally:
        holder.release()
    assert not holder.lost
    assert len(_warnings(caplog, "is being built by holder")) == 1, caplog.text
    long = _warnings(caplog, "still waiting after")
    assert len(long) == 1, caplog.text
    assert f"holder {holder.holder}" in long[0] and "building since 20" in long[0]
    assert "renewed until 20" in long[0] and "waiting until 20" in long[0]


# --- leases: staleness on the server's clock; prune (45.16, 45.4) ----------------------------


def test_a_lease_dead_for_longer_than_its_ttl_is_taken_over_at_once(
        env: Any, tcp_proxy: Any) -> None:
    dead = _tier(env, "d", lease_ttl=2.0).claim("D")
    assert isinstance(dead, Lease)
    dead._stop_renewing()  # a killed holder: its lease stays as it was
    # Dead for more than its ttl on the server's clock: the waiter reads the server through
    # a proxy whose Date is 4.5 s on (as after a 4.5 s wait; no wall time waited).
    skewed = tcp_proxy(env.endpoint.url)
    skewed.date_skew = 4.5
    looks: list[dict] = []
    got = _tier(env, "w", skewed.url, lease_ttl=2.0).claim("D", timeout=30,
                                                            on_wait=looks.append)
    assert isinstance(got, Lease) and got.holder != dead.holder
    got.release()
    # At the first look: no wait for a whole ttl more on the waiter's own clock (a
    # count of looks, not a wall-clock bound: this machine stalls).
    assert looks == []


def test_prune_keeps_a_lease_renewed_within_two_ttls_and_its_holder_renews_it(
        env: Any, tcp_proxy: Any) -> None:
    tier = _tier(env, "p", lease_ttl=10.0)
    held = tier.claim("H")
    assert isinstance(held, Lease)
    held._stop_renewing()  # its next renewal is ours to make, after prune
    # Prune reads the server through a proxy whose Date is 15 s on: the lease is unchanged
    # for more than its ttl (10 s), less than two (20 s), on the server's clock.
    skewed = tcp_proxy(env.endpoint.url)
    skewed.date_skew = 15.0
    assert _tier(env, "p", skewed.url, lease_ttl=10.0).prune(0) == []
    assert "cache/H.lease" in _keys(env)
    assert held.renew() and not held.lost
    held.release()
    assert _keys(env) == []


def test_prune_removes_a_lease_dead_for_two_ttls(env: Any, tcp_proxy: Any) -> None:
    dead = _tier(env, "p", lease_ttl=10.0).claim("G")
    assert isinstance(dead, Lease)
    dead._stop_renewing()
    # More than 2 x ttl (20 s) on the server's clock: read through a proxy whose Date is
    # 22 s on (no wall time waited; Date and Last-Modified are whole seconds, so the age
    # read is at least 22 s less a second's rounding).
    skewed = tcp_proxy(env.endpoint.url)
    skewed.date_skew = 22.0
    tier = _tier(env, "p", skewed.url, lease_ttl=10.0)
    assert tier.prune(3600) == []  # --older-than still bounds it
    assert tier.prune(0, dry_run=True) == ["G.lease"]
    assert tier.prune(0) == ["G.lease"]
    assert _keys(env) == []
    assert not dead.renew() and dead.lost  # the holder, were it alive, would know


# --- small objects: size and depth caps (44.7) -----------------------------------------------


def test_a_deeply_nested_manifest_is_a_manifest_error(env: Any, tmp_path: Path) -> None:
    from trtet_store.remote.download.receive import fetch

    _put(env, "prog/m.pte", b"x" * 100)
    _put(env, "prog/m.pte.trtet.json", b"[" * 200_000 + b"]" * 200_000)
    dest = tmp_path / "out" / "m.pte"
    dest.parent.mkdir()
    with pytest.raises(ManifestError, match="nests arrays or objects 200000 deep; at most 64"):
        fetch(f"s3://{env.bucket}/prog/m.pte", dest, endpoint_url=env.endpoint.url)
    assert list(dest.parent.iterdir()) == []


def test_a_huge_manifest_is_refused_before_its_body_is_read(env: Any, tmp_path: Path) -> None:
    from trtet_store.remote.download.receive import fetch

    size = 48 * MiB
    _put(env, "prog/h.pte", b"x" * 100)
    _put(env, "prog/h.pte.trtet.json", b'{"pad": "' + b"a" * (size - 11) + b'"}')
    dest = tmp_path / "out" / "h.pte"
    dest.parent.mkdir()
    with CountingProxy.for_url(env.endpoint.url) as proxy:
        with pytest.raises(ManifestError, match=f"is {size} bytes, more than the 16777216"):
            fetch(f"s3://{env.bucket}/prog/h.pte", dest, endpoint_url=proxy.endpoint_url)
        read = proxy.downstream
    # Headers, and what the sockets held when the body was closed: never the 48 MiB.
    assert read < 16 * MiB, read
    assert list(dest.parent.iterdir()) == []


def test_a_damaged_pointer_is_listed_as_damaged_and_the_others_still_work(
        env: Any, tmp_path: Path, caplog: Any) -> None:
    tier = _tier(env)
    for key in ("good1", "good2"):
        assert tier.publish(key, [_file(tmp_path / key, "e0", key.encode() * 1000)], {}).published
    _put(env, "cache/deep.json", b'{"format": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    _put(env, "cache/junk.json", b"\xff not json")
    _put(env, "cache/huge.json", b" " * (40 * MiB))
    with CountingProxy.for_url(env.endpoint.url) as proxy:
        seen = _tier(env, "b", endpoint=proxy.endpoint_url)
        with caplog.at_level(logging.INFO, "trtet_store"):
            entries, damaged = seen.listing()
        read = proxy.downstream
    assert [e.key for e in entries] == ["good1", "good2"]
    assert [(d.key, d.size) for d in damaged] == [
        ("deep", 200_012), ("huge", 40 * MiB), ("junk", 10)]
    assert all(isinstance(d, DamagedPointer) for d in damaged)
    assert "nests arrays or objects 100001 deep" in damaged[0].reason
    assert "more than the 262144 a pointer may be; not read" in damaged[1].reason
    assert "not JSON" in damaged[2].reason
    assert read < 16 * MiB, read  # the 40 MiB pointer was not read
    other = _tier(env, "c")
    with caplog.at_level(logging.INFO, "trtet_store"):
        for key in ("good1", "good2"):
            got = other.download(other.lookup(key), tmp_path / "dl" / key)
            assert got.paths["e0"].read_bytes() == key.encode() * 1000
        assert other.lookup("deep") is None and other.lookup("deep") is None
    assert len(_warnings(caplog, "the pointer of deep cannot be read")) == 1


def test_an_unreadable_pointer_is_replaced_by_the_next_publisher(
        env: Any, tmp_path: Path, caplog: Any) -> None:
    _put(env, "cache/r.json", b"[" * 5000 + b"]" * 5000)
    tier = _tier(env)
    before = env.client.head_object(Bucket=env.bucket, Key="cache/r.json")["ETag"]
    with caplog.at_level(logging.INFO, "trtet_store"):
        for _ in range(4):  # an export looks several times: one warning
            assert tier.lookup("r") is None
        pub = tier.publish("r", [_file(tmp_path, "e0", b"fresh")], {"v": 1})
    assert pub.published, pub
    assert len(_warnings(caplog, "the pointer of r cannot be read")) == 1, caplog.text
    entry = _tier(env, "b").lookup("r")
    assert entry is not None and entry.metadata == {"v": 1}
    assert entry.etag != before.strip('"')
    got = tier.download(entry, tmp_path / "dl")
    assert got.paths["e0"].read_bytes() == b"fresh"


# --- publish sources that are not regular files (44.7) ---------------------------------------


def test_a_fifo_a_device_or_a_directory_as_publish_source_is_not_a_regular_file(
        env: Any, tmp_path: Path) -> None:
    from trtet_store.remote import publish

    prog = tmp_path / "m.pte"
    prog.write_bytes(b"p" * 100)
    # .ptd names: a program's files are its own name and .ptd names (the name rule
    # is checked too); the device is reached through a link of such a name.
    fifo = tmp_path / "pipe.ptd"
    os.mkfifo(fifo)
    (tmp_path / "adir.ptd").mkdir()
    (tmp_path / "zero.ptd").symlink_to("/dev/zero")
    tier = _tier(env)
    for source, kind in ((fifo, "a FIFO"), (tmp_path / "zero.ptd", "a device"),
                         (tmp_path / "adir.ptd", "a directory")):
        # A FIFO with no writer would block an open forever: it is never opened.
        with pytest.raises(NotARegularFileError, match=f"is not a regular file \\({kind}\\)"):
            publish([prog, source], f"s3://{env.bucket}/p/m.pte",
                    endpoint_url=env.endpoint.url)
        with pytest.raises(NotARegularFileError, match="is not a regular file"):
            tier.publish("k", [("e0", source)], {})
    assert _keys(env, "") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adir.ptd", "m.pte", "pipe.ptd", "zero.ptd"]
