"""The two-level policy's "not yet published" marks (``trtet_store.cache.tiered``:
``TieredCache.push``, ``pending``, ``mark_pending``): a build cached here and not yet in the
shared tier is marked in ``<directory>/remote-pending/<key>``; a push settles it when the tier
holds an entry of the key, whether ours was published or another machine's was there first
(nothing is left to retry); a push that fails (the tier down) keeps the mark for the next
try. Real SeaweedFS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trtet_store import EngineCache
from trtet_store.cache.tier import RemoteTier
from trtet_store.io.units import MiB


def _files(directory: Path, seed: int) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "record").write_bytes(b"record %d " % seed * 50)
    return [("record", directory / "record")]


def _cache(env: Any, path: Path) -> EngineCache:
    return EngineCache(path, max_bytes=64 * MiB, min_free=0, remote=f"s3://{env.bucket}/t",
                       endpoint_url=env.endpoint.url)


@pytest.fixture(autouse=True)
def _no_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", str(tmp_path / "no-config"))


def test_a_push_that_finds_another_machines_entry_settles_the_mark(s3env, tmp_path):
    tiered = _cache(s3env, tmp_path / "c").tiered
    tiered.mark_pending("k")
    assert tiered.pending("k")
    other = RemoteTier(f"s3://{s3env.bucket}/t", endpoint_url=s3env.endpoint.url,
                       origin="other", journal_dir=tmp_path / "jo")
    assert other.publish("k", _files(tmp_path / "o", 1), {}).published
    result = tiered.push("k", _files(tmp_path / "m", 2), {})
    assert not result.published and result.entry is not None, result
    assert not tiered.pending("k")  # settled: the tier holds an entry of the key


def test_a_published_push_settles_the_mark_and_a_failed_one_keeps_it(s3env, tmp_path):
    tiered = _cache(s3env, tmp_path / "c").tiered
    tiered.mark_pending("a")
    assert tiered.push("a", _files(tmp_path / "a", 3), {}).published
    assert not tiered.pending("a")
    tiered.mark_pending("b")
    s3env.server.stop()
    try:
        outcome, result = tiered.publish("b", _files(tmp_path / "b", 4), {})
    finally:
        s3env.server.start()
    assert outcome.action == "error" and result is None, outcome
    assert tiered.pending("b")  # kept for the next try
