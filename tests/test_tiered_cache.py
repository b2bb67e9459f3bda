"""One behaviour suite for the two-level policy (cache/tiered.py), run once per caller.

Each case runs against :class:`~trtet_store.cache.TieredCache` as each of its
two callers builds it: the engine cache (its ``accept`` is
``engine_key.entry_problem``, an entry is ``record`` + ``e0``) and the
Torch-TensorRT adapter (its ``accept`` is ``_foreign``, an entry is one
``blob``), as object_store runs one suite per backend. Real SeaweedFS (the
``s3env`` fixture), real filesystems (``here_fs``); nothing is mocked.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from trtet_store import EngineCache
from trtet_store.cache.tier.health import SharedCacheWarning
from trtet_store.io.units import MiB

pytestmark = pytest.mark.filterwarnings("default::UserWarning")


class Caller:
    """One caller of the policy: how it opens its cache and what its entries are."""

    name = ""

    def __init__(self, directory: Path, s3: Any, max_bytes: int = 64 * MiB) -> None:
        self.cache = EngineCache(directory, max_bytes=max_bytes, min_free=0,
                                 remote=f"s3://{s3.bucket}/t", endpoint_url=s3.endpoint.url)
        self.tiered = self.tiered_of(self.cache)

    def tiered_of(self, cache: EngineCache) -> Any:
        raise NotImplementedError

    def files(self, directory: Path, seed: int) -> tuple[list[tuple[str, Path]], dict]:
        """An entry's files (written in ``directory``) and its metadata, accepted here."""
        raise NotImplementedError

    def foreign(self, metadata: dict) -> dict:
        """``metadata`` as another GPU's (what this caller's accept refuses)."""
        raise NotImplementedError

    def key(self, seed: int) -> str:
        return f"{self.name}-key-{seed}"


class Engines(Caller):
    name = "engine-cache"

    def tiered_of(self, cache: EngineCache) -> Any:
        return cache.tiered

    def files(self, directory, seed):
        from trtet_store.export import engine_reuse
        from trtet_store.export.engine_key import ENGINE_KIND, RECORD_KIND, compute_capability

        directory.mkdir(parents=True, exist_ok=True)
        cap = compute_capability()
        (directory / "e0").write_bytes(bytes([seed]) * MiB + os.urandom(16))
        (directory / "record").write_bytes(b"record %d " % seed + os.urandom(16))
        record = {"kind": RECORD_KIND, "fingerprint": f"f{seed}", "compute_capability": cap,
                  "versions": [list(v) for v in engine_reuse.build_versions()],
                  "engines": [{"engine_id": f"id{seed}"}]}
        engines = [{"kind": ENGINE_KIND, "engine_id": f"id{seed}", "compute_capability": cap}]
        return ([("record", directory / "record"), ("e0", directory / "e0")],
                {"record": record, "engines": engines})

    def foreign(self, metadata):
        metadata["record"]["compute_capability"] = "sm_10"
        return metadata


class Adapter(Caller):
    name = "torch-tensorrt"

    def tiered_of(self, cache: EngineCache) -> Any:
        from trtet_store.export import trt_engine_cache

        # The adapter's methods over this cache (for_torch_tensorrt makes them a subclass
        # of upstream's BaseEngineCache; the policy part is the same object).
        self.adapter = trt_engine_cache._Adapter(cache.blobs, tensorrt_version="10.0",  # noqa: SLF001
                                                 compute_capability="sm_90", remote=cache.remote)
        return self.adapter.tiered

    def files(self, directory, seed):
        from trtet_store.export.trt_engine_cache import KIND

        directory.mkdir(parents=True, exist_ok=True)
        (directory / "blob").write_bytes(bytes([seed]) * MiB + os.urandom(16))
        return ([("blob", directory / "blob")],
                {"kind": KIND, "torch_tensorrt_hash": f"h{seed}",
                 "versions": [["tensorrt", "10.0"]], "compute_capability": "sm_90"})

    def foreign(self, metadata):
        metadata["compute_capability"] = "sm_10"
        return metadata


@pytest.fixture(params=[Engines, Adapter], ids=["engine-cache", "torch-tensorrt"])
def caller(request):
    return request.param


def _bytes(files: list[tuple[str, Path]]) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in files}


def _local(tiered: Any, key: str, names: list[str]) -> dict[str, bytes]:
    """What the local cache holds for an entry of ``names`` under ``key``, by file name."""
    entry_keys = {"record": key, "blob": key, "e0": f"{key}.e0"}
    out = {}
    for name in names:
        hit = tiered.local.get(entry_keys[name])
        if hit is not None:
            with hit:
                out[name] = hit.path.read_bytes()
    return out


def _downloads_empty(tiered: Any) -> bool:
    d = tiered.directory / "downloads"
    return not d.exists() or not any(p.is_file() for p in d.rglob("*"))


def _said(recorded: list) -> list[str]:
    return [str(w.message) for w in recorded if issubclass(w.category, SharedCacheWarning)]


def test_a_local_hit_never_asks_the_tier(caller, here_fs, s3env):
    a = caller(here_fs / "a", s3env)
    files, meta = a.files(here_fs / "src", 1)
    key = a.key(1)
    outcome, _ = a.tiered.publish(key, files, meta)
    assert outcome.action == "published", outcome
    got = a.tiered.get(key)  # entered in a's cache from the tier
    assert got.hit is not None and got.outcome.action == "hit"
    got.hit.close()
    s3env.server.stop()  # the tier is gone: a local hit must not notice
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            again = a.tiered.get(key)
        assert again.hit is not None and again.outcome is None, again.outcome
        again.hit.close()
        assert _said(recorded) == []
    finally:
        s3env.server.start()


def test_a_remote_hit_is_downloaded_linked_in_and_served(caller, here_fs, s3env):
    a, b = caller(here_fs / "a", s3env), caller(here_fs / "b", s3env)
    files, meta = a.files(here_fs / "src", 2)
    key = a.key(2)
    assert a.tiered.publish(key, files, meta)[0].action == "published"
    got = b.tiered.get(key)
    assert got.hit is not None, got
    got.hit.close()
    want = _bytes(files)
    assert got.outcome.action == "hit" and got.outcome.downloaded == sum(map(len, want.values()))
    assert got.outcome.placement == "link", got.outcome  # put(consume=True): no second copy
    assert _local(b.tiered, key, list(want)) == want
    assert _downloads_empty(b.tiered)


def test_a_remote_entry_the_caller_does_not_accept_is_a_miss_and_replaced(
        caller, here_fs, s3env):
    a, b, c = (caller(here_fs / n, s3env) for n in "abc")
    files, meta = a.files(here_fs / "src", 3)
    key = a.key(3)
    assert a.tiered.publish(key, files, a.foreign(meta))[0].action == "published"
    got = b.tiered.get(key)
    assert got.hit is None and got.download is None
    assert got.outcome.action == "miss" and "sm_10" in got.outcome.reason, got.outcome
    assert _local(b.tiered, key, [n for n, _ in files]) == {}  # nothing entered
    assert _downloads_empty(b.tiered)
    # b's build replaces that entry (If-Match it), and a third machine gets b's.
    mine, meta2 = b.files(here_fs / "mine", 30)
    assert b.tiered.publish(key, mine, meta2)[0].action == "published"
    hit = c.tiered.get(key)
    assert hit.hit is not None and hit.outcome.action == "hit", hit.outcome
    hit.hit.close()
    assert _local(c.tiered, key, [n for n, _ in mine]) == _bytes(mine)


def test_a_damaged_entry_is_never_served_and_the_rebuild_replaces_it(caller, here_fs, s3env):
    a, b, c = (caller(here_fs / n, s3env) for n in "abc")
    files, meta = a.files(here_fs / "src", 4)
    key = a.key(4)
    assert a.tiered.publish(key, files, meta)[0].action == "published"
    name = files[-1][0]  # an engine's (or the blob's) bytes, changed in the bucket
    [obj] = [o["Key"] for o in s3env.client.list_objects_v2(
        Bucket=s3env.bucket, Prefix=f"t/{key}/")["Contents"] if o["Key"].endswith(f"/{name}")]
    size = len(s3env.client.get_object(Bucket=s3env.bucket, Key=obj)["Body"].read())
    s3env.client.put_object(Bucket=s3env.bucket, Key=obj, Body=os.urandom(size))
    got = b.tiered.get(key)
    assert got.hit is None and got.download is None
    assert got.outcome.action == "miss" and got.outcome.reason.startswith("damaged: ")
    assert _local(b.tiered, key, [name]) == {} and _downloads_empty(b.tiered)
    mine, meta2 = b.files(here_fs / "mine", 40)
    done, _ = b.tiered.publish(key, mine, meta2)
    assert done.action == "published", done  # replaced, If-Match the damaged pointer
    hit = c.tiered.get(key)
    assert hit.hit is not None, hit.outcome
    hit.hit.close()
    assert _local(c.tiered, key, [n for n, _ in mine]) == _bytes(mine)


def test_of_two_writers_the_first_wins_and_the_loser_serves_the_winners_bytes(
        caller, here_fs, s3env):
    a, b = caller(here_fs / "a", s3env), caller(here_fs / "b", s3env)
    key = a.key(5)
    first, meta1 = a.files(here_fs / "first", 5)
    second, meta2 = b.files(here_fs / "second", 50)
    assert a.tiered.publish(key, first, meta1)[0].action == "published"
    lost, _ = b.tiered.publish(key, second, meta2)
    assert lost.action == "not-published" and "already in the shared cache" in lost.reason, lost
    got = b.tiered.get(key)  # the loser's next miss gets the winner's entry
    assert got.hit is not None and got.outcome.action == "hit", got.outcome
    got.hit.close()
    assert _local(b.tiered, key, [n for n, _ in first]) == _bytes(first)


def test_a_tier_down_is_warned_once_then_works_again_once(caller, here_fs, s3env):
    a = caller(here_fs / "a", s3env)
    files, meta = a.files(here_fs / "src", 6)
    s3env.server.stop()
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            for seed in (6, 7, 8):
                got = a.tiered.get(a.key(seed))
                assert got.hit is None and got.outcome.action == "error", got.outcome
            assert a.tiered.publish(a.key(6), files, meta)[0].action == "error"
        down = _said(recorded)
        assert len(down) == 1, down
        assert a.tiered.health.down is not None
    finally:
        s3env.server.start()
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        assert a.tiered.publish(a.key(6), files, meta)[0].action == "published"
        assert a.tiered.get(a.key(9)).outcome.action == "miss"
    back = _said(recorded)
    assert len(back) == 1 and back[0].endswith("works again"), back
    assert a.tiered.health.down is None


def test_a_download_the_local_cache_skips_is_served_once_from_the_download(
        caller, here_fs, s3env):
    a = caller(here_fs / "a", s3env)
    b = caller(here_fs / "b", s3env, max_bytes=MiB // 2)  # every entry is over its bound
    files, meta = a.files(here_fs / "src", 9)
    key = a.key(9)
    assert a.tiered.publish(key, files, meta)[0].action == "published"
    got = b.tiered.get(key)
    assert got.hit is None and got.download is not None, got
    assert got.outcome.action == "hit" and got.outcome.placement is None
    assert "bound" in got.why, got.why
    want = _bytes(files)
    with got.download:
        served = {n: got.download.paths[n].read_bytes() for n in want
                  if got.download.paths[n].exists()}
    assert served == {n: b for n, b in want.items() if n in served} and served
    assert _downloads_empty(b.tiered)  # served once, then removed
    assert b.tiered.local.entries() == []  # nothing entered: the first file was skipped
