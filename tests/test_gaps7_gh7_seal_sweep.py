"""trtet_store.remote.sweep: plan_sweep's bounds and SweepPlan.execute's refusals.

- the grace is "younger than": an object exactly ``grace`` seconds old goes;
- an object listed with no age (``modified=None``: a replaced version's objects,
  judged by the ETag the old manifest recorded) is never kept as young;
- ``first(item)`` returning None keeps the object (a blob whose manifest names
  another version): nothing of it is deleted;
- a delete the server refuses (here NoSuchBucket, a real answer of the real
  server) keeps that object, says why, and the sweep goes on with the next.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from trtet_store.remote.s3 import S3
from trtet_store.remote.sweep import Listed, SweepPlan, plan_sweep


def test_an_object_exactly_as_old_as_the_grace_goes_one_younger_stays() -> None:
    now = 1_000_000.0
    listing = [Listed("p/old", "e1", now - 60.0), Listed("p/young", "e2", now - 59.5),
               Listed("p/named", "e3", now - 1e6)]
    plan = plan_sweep(listing, {"p/named": "the root names it"}, 60.0, now=now)
    assert [i.key for i in plan.doomed] == ["p/old"]
    assert plan.kept == {"p/named": "the root names it", "p/young": "younger than 60 s"}
    # A grace of 0 keeps nothing for its age, not even an object written this instant.
    zero = plan_sweep([Listed("p/now", "e", now)], (), 0, now=now)
    assert [i.key for i in zero.doomed] == ["p/now"] and zero.kept == {}


def test_an_object_with_no_age_is_judged_by_its_etag_alone_not_kept_as_young() -> None:
    plan = plan_sweep([Listed("p/a.ptd", "e1"), Listed("p/b.ptd", "e2")], ["p/b.ptd"], 3600.0,
                      now=5.0)
    assert [(i.key, i.etag) for i in plan.doomed] == [("p/a.ptd", "e1")]
    assert plan.kept == {"p/b.ptd": "named"}


def _put(s3env: Any, key: str) -> str:
    s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=f"bytes of {key}".encode())
    return s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"].strip('"')


def _state(s3env: Any, prefix: str) -> dict[str, str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=prefix)
    return {o["Key"]: hashlib.sha256(s3env.client.get_object(
        Bucket=s3env.bucket, Key=o["Key"])["Body"].read()).hexdigest()
        for o in listed.get("Contents", [])}


def test_first_saying_keep_deletes_nothing_of_that_object(s3env: Any) -> None:
    keys = ["s/blobs/a", "s/blobs/a.trtet.json", "s/blobs/b"]
    etags = {k: _put(s3env, k) for k in keys}
    before = _state(s3env, "s/")
    plan = SweepPlan(doomed=[Listed("s/blobs/a", etags["s/blobs/a"]),
                             Listed("s/blobs/b", etags["s/blobs/b"])])
    asked = []

    def first(item: Listed) -> list[tuple[str, str]] | None:
        asked.append(item.key)
        return None if item.key == "s/blobs/a" else []

    removed = plan.execute(S3(client=s3env.client), s3env.bucket, first=first)
    assert asked == ["s/blobs/a", "s/blobs/b"]
    assert removed == ["s/blobs/b"]
    assert plan.kept == {"s/blobs/a": "changed since it was listed"}
    assert _state(s3env, "s/") == {k: v for k, v in before.items() if k != "s/blobs/b"}


class RefusesDeleting(S3):
    """A client whose delete of ``refused`` goes to a bucket the server does not have: the
    server answers NoSuchBucket (a refusal that is not a changed precondition)."""

    def __init__(self, client: Any, refused: str) -> None:
        super().__init__(client=client)
        self.refused = refused

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        if key == self.refused:
            bucket = f"{bucket}-not-there"
        super().delete(bucket, key, if_match)


def test_a_delete_the_server_refuses_is_kept_said_and_the_sweep_goes_on(
        s3env: Any, caplog: Any) -> None:
    keys = ["r/one", "r/two", "r/three"]
    etags = {k: _put(s3env, k) for k in keys}
    before = _state(s3env, "r/")
    plan = plan_sweep([Listed(k, etags[k], 0.0) for k in keys], (), 10.0, now=100.0)
    assert [i.key for i in plan.doomed] == sorted(keys)
    with caplog.at_level(logging.INFO, logger="trtet_store.remote"):
        removed = plan.execute(RefusesDeleting(s3env.client, "r/three"), s3env.bucket)
    assert removed == ["r/one", "r/two"]
    assert list(plan.kept) == ["r/three"]
    assert plan.kept["r/three"].startswith("could not be removed (")
    assert "does not exist" in plan.kept["r/three"]
    assert _state(s3env, "r/") == {"r/three": before["r/three"]}
    assert any(f"s3://{s3env.bucket}/r/three is kept: could not be removed" in r.getMessage()
               for r in caplog.records)
