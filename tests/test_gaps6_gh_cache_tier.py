"""The shared tier's pointer as a bucket writer can write it, and claim's arguments (RemoteTier,
gap hunt of hardening round 5): a pointer copied to another key's name, one naming a file
twice or with a sha256 that is not one, each refused as a damaged pointer; a NaN wait
timeout refused before any request.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier.entry import RemoteEntry

KEY = "k" * 32
SHA = "a" * 64


def pointer(key: str = KEY, files: list | None = None) -> bytes:
    files = files or [{"name": "e0", "size": 10, "digest": "0" * 32, "sha256": SHA}]
    return RemoteEntry(key, "", 1.0, "a", "host", f"{key}/a-0000000000000000/", files,
                       {"gpu": "sm_90"}).to_json()


def test_a_pointer_parses_as_its_own_key_s_only() -> None:
    assert RemoteEntry.from_json(pointer(), "etag", KEY).key == KEY
    other = "o" * 32
    with pytest.raises(ValueError, match=f"the pointer names key '{KEY}', not '{other}'"):
        RemoteEntry.from_json(pointer(), "etag", other)  # copied to another key's name


def test_a_pointer_naming_one_file_twice_is_damaged() -> None:
    f = {"name": "e0", "size": 10, "digest": "0" * 32, "sha256": SHA}
    with pytest.raises(ValueError, match="one name twice"):
        RemoteEntry.from_json(pointer(files=[f, dict(f, size=11)]), "etag", KEY)


@pytest.mark.parametrize("sha", ["A" * 64, "a" * 63, "g" * 64, "a" * 64 + "\n", 7])
def test_a_pointer_whose_sha256_is_not_a_lowercase_hex_digest_is_damaged(sha: Any) -> None:
    doc = json.loads(pointer())
    doc["files"][0]["sha256"] = sha
    with pytest.raises(ValueError, match="not a sha256 hex digest"):
        RemoteEntry.from_json(json.dumps(doc).encode(), "etag", KEY)


@pytest.mark.parametrize("timeout", [math.nan, -1.0, True, "5"])
def test_a_wait_timeout_that_is_not_a_number_of_seconds_is_refused(
        s3env: Any, tmp_path: Path, timeout: Any) -> None:
    tier = RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "j")
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
        tier.claim(KEY, timeout=timeout)
    assert "Contents" not in s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="c/")


def _objects(env: Any, prefix: str = "c/") -> list[str]:
    got = env.client.list_objects_v2(Bucket=env.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in got.get("Contents", []))


def test_delete_of_an_entry_whose_pointer_changed_since_deletes_nothing(s3env: Any,
                                                                        tmp_path: Path) -> None:
    from trtet_store.remote.errors import ObjectChangedError

    tier = RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "j")
    src = tmp_path / "e0"
    src.write_bytes(b"engine bytes " * 1000)
    assert tier.publish(KEY, [("e0", src)], {"gpu": "sm_90"}).published
    seen = tier.lookup(KEY)
    assert seen is not None
    before = _objects(s3env)
    # Another publisher's pointer since (here the bucket writer's, the same doc rewritten).
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=f"c/{KEY}.json")["Body"].read())
    doc["host"] = "republished"
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"c/{KEY}.json",
                            Body=json.dumps(doc).encode())
    with pytest.raises(ObjectChangedError):
        tier.delete(seen)
    assert _objects(s3env) == before
    now = tier.lookup(KEY)
    assert now is not None and now.host == "republished"
    tier.delete(now)  # the version read now goes, with its objects
    assert _objects(s3env) == []


def test_a_signed_publish_of_a_file_whose_handed_xxh3_is_not_its_bytes_publishes_nothing(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller hands a file over with an xxh3 (taken before it changed): the upload's own
    pass reads other bytes, so the sha256 it took is not of the described file; nothing is
    signed over the mix."""
    import xxhash
    from keyed import with_keys

    from trtet_store.io import SourceChangedError

    env = with_keys(s3env, tmp_path, monkeypatch)
    src = tmp_path / "e0"
    src.write_bytes(b"the bytes now " * 4096)
    stale = xxhash.xxh3_128_hexdigest(b"the bytes then" * 4096)  # same size, other bytes
    tier = RemoteTier(f"s3://{env.bucket}/c", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "j", signing_key=env.keys / "team.key")
    try:
        got = tier.publish(KEY, [("e0", src, stale)], {})
    except SourceChangedError as exc:
        assert "the upload read bytes with xxh3-128" in str(exc), exc
    else:
        assert not got.published, got
    assert tier.lookup(KEY) is None
    assert f"c/{KEY}.json" not in _objects(env)


def test_an_entry_published_between_the_look_and_the_lease_is_the_claim_s_answer(
        s3env: Any, tmp_path: Path) -> None:
    """The previous holder publishes (and releases) right after our look at the pointer and
    before our lease is written: the claim answers the entry, not a second build's lease."""
    from trtet_store.cache.tier import Lease

    def tier(origin: str) -> RemoteTier:
        return RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url,
                          origin=origin, journal_dir=tmp_path / origin)

    waiter, holder = tier("w"), tier("h")
    src = tmp_path / "e0"
    src.write_bytes(b"built by the holder " * 1000)
    real = waiter.lookup
    looks = []

    def barrier(key: str) -> Any:
        got = real(key)
        looks.append(got)
        if len(looks) == 1:  # after our look, before our lease: the holder publishes
            assert holder.publish(key, [("e0", src)], {}).published
        return got

    waiter.lookup = barrier  # type: ignore[method-assign]
    got = waiter.claim(KEY, timeout=5)
    assert not isinstance(got, Lease), got
    assert isinstance(got, RemoteEntry) and got.origin == "h"
    assert f"c/{KEY}.lease" not in _objects(s3env)  # our lease released at once


def test_a_wait_ends_at_its_deadline_exactly_never_one_poll_more(s3env: Any,
                                                                 tmp_path: Path) -> None:
    """A live holder's lease; the waiter's clock (a test's, moved only by its sleeps) reaches
    the deadline exactly: the wait ends there (LeaseWaitTimeout), not in a loop of zero sleeps."""
    from trtet_store.cache.tier import Lease, LeaseWaitTimeout
    from trtet_store.cache.tier.lease import Clock

    class StepClock(Clock):
        def __init__(self) -> None:
            self.t, self.sleeps = 0.0, []

        def monotonic(self) -> float:
            return self.t

        def time(self) -> float:
            return 1_800_000_000.0 + self.t

        def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            assert len(self.sleeps) < 20, f"a hot loop: {self.sleeps}"
            self.t += seconds

    def tier(origin: str) -> RemoteTier:
        return RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url,
                          origin=origin, journal_dir=tmp_path / origin, lease_ttl=300.0,
                          poll=75.0)

    held = tier("h").claim(KEY)
    assert isinstance(held, Lease)
    try:
        waiter = tier("w")
        waiter.clock = clock = StepClock()
        with pytest.raises(LeaseWaitTimeout):
            waiter.claim(KEY, timeout=150.0)
        assert clock.sleeps == [75.0, 75.0] and clock.t == 150.0
    finally:
        held.release()
