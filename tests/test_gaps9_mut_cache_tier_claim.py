"""The shared tier's claim (``trtet_store.cache.tier.claim``: ``claim`` and its
``_acquired``) when the previous holder publishes between our look at the pointer and our
lease: the lease just written is released and the entry is the answer (never a second
build); a server that fails that second look releases the lease too, then raises.

On the real SeaweedFS fixture; the race is a ``lookup`` that answers None on the first look
and the entry (or a RemoteError) on the one after the lease's put.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import Lease, RemoteTier
from trtet_store.cache.tier.claim import claim
from trtet_store.cache.tier.entry import RemoteEntry
from trtet_store.remote.errors import RemoteError

KEY = "k" * 32
LKEY = f"cache/{KEY}.lease"


@pytest.fixture
def tier(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RemoteTier:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "TRTET_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    t = RemoteTier(f"s3://{s3env.bucket}/cache", endpoint_url=s3env.endpoint.url,
                   origin="me", journal_dir=s3env.journal_dir, lease_ttl=60.0, poll=15.0)
    t.env = s3env
    return t


def _objects(env: Any) -> list[str]:
    got = env.client.list_objects_v2(Bucket=env.bucket)
    return sorted(o["Key"] for o in got.get("Contents", []))


def _published() -> RemoteEntry:
    return RemoteEntry(KEY, "etag", 1.0, "other", "host", f"{KEY}/other-0000000000000000/",
                       [{"name": "e0", "size": 1, "digest": "0" * 32}], {})


def test_an_entry_published_while_we_took_the_lease_is_the_answer_and_the_lease_goes(tier):
    looks: list[str] = []
    theirs = _published()

    def lookup(key: str) -> RemoteEntry | None:
        looks.append(key)
        return None if len(looks) == 1 else theirs

    got = claim(tier.where, lookup, KEY, timeout=30)
    assert got is theirs, got
    assert looks == [KEY, KEY]
    assert LKEY not in _objects(tier.env)  # released: nobody waits on a build never made


def test_a_failed_second_look_releases_the_lease_then_raises(tier):
    looks: list[str] = []

    def lookup(key: str) -> RemoteEntry | None:
        looks.append(key)
        if len(looks) == 1:
            return None
        raise RemoteError("the server went away")

    with pytest.raises(RemoteError, match="the server went away"):
        claim(tier.where, lookup, KEY, timeout=30)
    assert LKEY not in _objects(tier.env)


def test_nothing_published_meanwhile_is_our_lease(tier):
    got = claim(tier.where, lambda key: None, KEY, timeout=30)
    try:
        assert isinstance(got, Lease)
        assert LKEY in _objects(tier.env)
    finally:
        got.release()
    assert LKEY not in _objects(tier.env)
