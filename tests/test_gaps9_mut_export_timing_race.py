"""export/timing_tier.py pull: the shared entry replaced between pull's own lookup and the
fetch's (gap hunt 3). Another machine publishes a newer timing entry in that window: the
local entry must remember the ETag of what it actually took in (``got.entry.etag``), so
the next pull downloads nothing; remembering the first lookup's ETag downloads the same
entry again at every build. Real S3 (SeaweedFS), the stub TensorRT seam.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from timing_machine import check as _check
from timing_machine import entries as _entries
from timing_machine import facts as _facts
from timing_machine import key as _key
from timing_machine import machine  # noqa: F401 - the autouse fixture
from timing_machine import meta as _meta
from timing_machine import tiered as _tiered

from trtet_store.cache import mergeable_tier
from trtet_store.export import timing_cache, timing_tier
from trtet_store.export.timing_tier import TierSaid
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, write_timing_cache

MiB = 1 << 20


def _publish(here: Path, s3: Any, data: bytes, name: str) -> None:
    tier = _tiered(here, name, s3, s3.endpoint.url).remote
    pub, why, _ = mergeable_tier.publish_merged(tier, _key(), data, FakeBuilder.combine,
                                                _check, _meta, here / f"scratch-{name}",
                                                limit=MiB)
    assert pub is not None and pub.published, why


def _pull(cache: Any) -> TierSaid:
    said = TierSaid()
    timing_tier.pull(cache, _key(), _check, timing_cache._combined,
                     timing_cache._metadata(_facts()), limit=MiB, said=said)
    return said


def test_timing_tier_pull_remembers_the_etag_of_what_it_fetched(here_fs, s3env, monkeypatch):
    with installed(FakeBuilder()):
        _publish(here_fs, s3env, write_timing_cache(_key(), _entries(5, "a")), "A")
        b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
        real = b.remote.lookup
        calls = []

        def lookup(key: str) -> Any:
            entry = real(key)
            calls.append(entry.etag if entry is not None else None)
            if len(calls) == 1:  # between pull's lookup and the fetch's: C publishes more
                _publish(here_fs, s3env, write_timing_cache(_key(), _entries(3, "c")), "C")
            return entry

        monkeypatch.setattr(b.remote, "lookup", lookup)
        first = _pull(b)
        monkeypatch.setattr(b.remote, "lookup", real)
        assert first.fetched_reason is None and first.downloaded > 0, first
        assert len(calls) >= 2 and calls[0] != calls[1], calls  # the race happened
        now = b.remote.lookup(_key())
        hit = b.blobs.get(_key())
        with hit:
            assert dict(hit.metadata)["tier_etag"] == now.etag == calls[-1]
        again = _pull(b)
        assert again.downloaded == 0 and again.fetched_reason is None, again
