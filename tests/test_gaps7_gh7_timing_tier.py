"""timing_tier.pull / push, mergeable_tier.fetch / publish_merged and timing_entries
push_entries / pull_entry: the states their checks exist for, one at a time.

- timing_tier: a tier marked down is not asked (pull or push; counted at the proxy); a
  tier entry refused, or whose merge TensorRT refuses, is said; a push to a tier that
  holds all of it already sends nothing and says nothing; a server gone mid-push is said;
- mergeable_tier.fetch: an entry whose files are not one ``timing`` is refused from its
  pointer; a fetch leaves no scratch behind;
- mergeable_tier.publish_merged: a merge TensorRT refuses publishes nothing; a lost race
  (another machine's publish between our read and our write, by a bucket writer) is read,
  merged and retried, and given up after ``attempts``; a damaged tier entry is replaced
  by ours (If-Match its ETag);
- timing_entries: push of a key that is no timing cache, pull of a key not in the tier,
  of an entry keyed for other facts, or of one refused, are refused in one line; a push
  never publishes the local ``tier_etag``.

A real S3 server (SeaweedFS) behind the counting proxy; the stub TensorRT seam.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# _facts, _key, _check, _meta: timing_cache.timing_facts, timing_key, entry_problem and an
# entry's metadata, on the machine tests/timing_machine.py pins.
from timing_machine import check as _check
from timing_machine import entries as _entries
from timing_machine import facts as _facts
from timing_machine import key as _key
from timing_machine import machine  # noqa: F401 - the autouse fixture
from timing_machine import meta as _meta
from timing_machine import tiered as _tiered

import trtet_store
from trtet_store.cache import mergeable_tier
from trtet_store.cache.mergeable import MergeRefused
from trtet_store.export import timing_cache, timing_entries, timing_tier
from trtet_store.export.timing_tier import TierSaid
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    parse_timing_cache,
    write_timing_cache,
)

MiB = 1 << 20


def _publish(here: Path, s3: Any, data: bytes, name: str = "A") -> None:
    tier = _tiered(here, name, s3, s3.endpoint.url).remote
    pub, why, _ = mergeable_tier.publish_merged(tier, _key(), data, FakeBuilder.combine,
                                                _check, _meta, here / f"scratch-{name}",
                                                limit=MiB)
    assert pub is not None and pub.published, why


def _tier_bytes(here: Path, s3: Any) -> bytes | None:
    tier = _tiered(here, "reader", s3, s3.endpoint.url).remote
    got = mergeable_tier.fetch(tier, _key(), here / "reader-in", lambda m: None, limit=MiB)
    return got.data


def _put_local(cache: trtet_store.EngineCache, here: Path, data: bytes, meta: dict) -> None:
    src = here / "src"
    src.write_bytes(data)
    assert cache.blobs.put(_key(), src, meta).stored
    src.unlink()


def _local_bytes(cache: trtet_store.EngineCache) -> bytes | None:
    hit = cache.blobs.get(_key())
    if hit is None:
        return None
    with hit:
        return Path(hit.path).read_bytes()


@pytest.fixture(autouse=True)
def _private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scratch directories are counted in a temp directory of this test's own: the other
    lane (or any process) runs timing tests beside it and makes its own in /tmp."""
    import tempfile

    private = tmp_path / "tempdir"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))


def _scratches() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("trtet-timing-*")}


# -- timing_tier ---------------------------------------------------------------------------


def test_timing_tier_does_not_ask_a_tier_marked_down(here_fs, s3env, proxy):
    _publish(here_fs, s3env, write_timing_cache(_key(), _entries(50, "t")))
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url)
    data = write_timing_cache(_key(), _entries(5, "b"))
    _put_local(b, here_fs, data, _meta(data))
    b.tiered.health.failed("the bucket did not answer", cause=None)
    proxy.reset()
    pulled, pushed = TierSaid(), TierSaid()
    with installed(FakeBuilder()):
        timing_tier.pull(b, _key(), _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=pulled)
        timing_tier.push(b, _key(), _check, FakeBuilder.combine, timing_cache._combined,
                         _meta, limit=MiB, said=pushed)
    assert pulled.fetched_reason == "the shared cache is not usable now", pulled
    assert pulled.downloaded == 0
    assert (pushed.published, pushed.publish_reason) == \
        (False, "the shared cache is not usable now"), pushed
    assert proxy.upstream == 0 and proxy.downstream == 0  # not a request sent
    assert _local_bytes(b) == data
    assert parse_timing_cache(_tier_bytes(here_fs, s3env))[1] == _entries(50, "t")


def test_timing_tier_pull_says_a_refused_entry_and_takes_nothing(here_fs, s3env):
    # Machine A's entry under this key names another GPU in its facts: refused from its
    # pointer (never downloaded), said, the local entry untouched.
    tier = _tiered(here_fs, "A", s3env, s3env.endpoint.url).remote
    theirs = write_timing_cache(_key(), _entries(20, "x"))
    other = {**_meta(theirs), "timing": {**_facts(), "gpu": "NVIDIA H100"}}
    pub, why, _ = mergeable_tier.publish_merged(tier, _key(), theirs, FakeBuilder.combine,
                                                lambda m: None, lambda out: other,
                                                here_fs / "s", limit=MiB)
    assert pub is not None and pub.published, why
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    said = TierSaid()
    with installed(FakeBuilder()):
        timing_tier.pull(b, _key(), _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=said)
    assert said.downloaded == 0
    assert said.fetched_reason == ("the shared entry is refused: it was made for another gpu "
                                   "'NVIDIA H100' (here 'NVIDIA L4')"), said
    assert b.blobs.get(_key()) is None


def test_timing_tier_pull_says_a_merge_tensorrt_refuses(here_fs, s3env):
    # The tier's bytes carry another header under facts that match: TensorRT's combine
    # refuses them; the local entry is left as it was, and the line says why.
    _publish(here_fs, s3env, write_timing_cache("trt-t-another-header", _entries(20, "y")))
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    mine = write_timing_cache(_key(), _entries(5, "b"))
    _put_local(b, here_fs, mine, _meta(mine))
    said = TierSaid()
    with installed(FakeBuilder()):
        timing_tier.pull(b, _key(), _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=said)
    assert said.fetched_reason is not None and said.fetched_reason.startswith(
        "the merge was refused, the entry is left as it was: timing cache header mismatch"), \
        said
    assert _local_bytes(b) == mine


def test_timing_tier_push_to_a_tier_holding_all_of_it_sends_nothing(here_fs, s3env, proxy):
    data = write_timing_cache(_key(), _entries(4000, "z"))
    _publish(here_fs, s3env, data)
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url)
    _put_local(b, here_fs, data, _meta(data))
    proxy.reset()
    said = TierSaid()
    with installed(FakeBuilder()):
        timing_tier.push(b, _key(), _check, FakeBuilder.combine, timing_cache._combined,
                         _meta, limit=MiB, said=said)
    assert (said.published, said.publish_reason, said.sent) == (None, None, 0), said
    assert proxy.upstream < len(data) // 4, proxy.upstream  # no upload of the entry


def test_timing_tier_push_of_a_gone_server_is_said_and_never_raised(here_fs, s3env):
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    data = write_timing_cache(_key(), _entries(5, "g"))
    _put_local(b, here_fs, data, _meta(data))
    before = _scratches()
    s3env.server.stop()
    try:
        pushed, pulled = TierSaid(), TierSaid()
        with installed(FakeBuilder()):
            timing_tier.push(b, _key(), _check, FakeBuilder.combine, timing_cache._combined,
                             _meta, limit=MiB, said=pushed)
            timing_tier.pull(b, _key(), _check, timing_cache._combined,
                             timing_cache._metadata(_facts()), limit=MiB, said=pulled)
    finally:
        s3env.server.start()
    assert pushed.published is False
    assert pushed.publish_reason.startswith("the shared cache was not usable ("), pushed
    assert pulled.fetched_reason.startswith("the shared cache was not usable ("), pulled
    assert _local_bytes(b) == data
    assert _scratches() == before


def test_timing_tier_pull_leaves_no_scratch_directory(here_fs, s3env):
    _publish(here_fs, s3env, write_timing_cache(_key(), _entries(50, "s")))
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    before = _scratches()
    said = TierSaid()
    with installed(FakeBuilder()):
        timing_tier.pull(b, _key(), _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=said)
    assert said.downloaded > 0 and said.fetched_reason is None, said
    assert _scratches() == before


# -- mergeable_tier.fetch ------------------------------------------------------------------


def test_mergeable_tier_fetch_refuses_an_entry_whose_files_are_not_one_timing(
        here_fs, s3env, proxy):
    tier = _tiered(here_fs, "A", s3env, s3env.endpoint.url).remote
    data = write_timing_cache(_key(), _entries(3000, "f"))
    (here_fs / "timing").write_bytes(data)
    (here_fs / "other").write_bytes(data)
    pub = tier.publish(_key(), [("timing", here_fs / "timing"), ("other", here_fs / "other")],
                       _meta(data))
    assert pub.published, pub.reason
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url).remote
    proxy.reset()
    got = mergeable_tier.fetch(b, _key(), here_fs / "in", _check, limit=MiB)
    assert got.data is None and got.entry is not None and got.downloaded == 0
    assert got.reason == ("the shared entry is refused: its files are ['timing', 'other'], "
                          f"not one 'timing' of at most {MiB} bytes"), got.reason
    assert proxy.downstream < len(data) // 4, proxy.downstream
    assert not (here_fs / "in").exists()


def test_mergeable_tier_fetch_leaves_no_scratch_behind(here_fs, s3env):
    data = write_timing_cache(_key(), _entries(40, "h"))
    _publish(here_fs, s3env, data)
    tier = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    got = mergeable_tier.fetch(tier, _key(), here_fs / "in", _check, limit=MiB)
    assert got.data == data and got.reason is None and got.downloaded == len(data)
    assert not (here_fs / "in").exists()


# -- mergeable_tier.publish_merged -------------------------------------------------------


def test_publish_merged_of_a_merge_that_is_refused_publishes_nothing(here_fs, s3env):
    theirs = write_timing_cache(_key(), _entries(30, "r"))
    _publish(here_fs, s3env, theirs)
    tier = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    etag = tier.lookup(_key()).etag
    mine = write_timing_cache(_key(), _entries(3, "m"))

    def refuse(a: bytes, b: bytes) -> bytes:
        raise MergeRefused("headers differ")

    pub, why, out = mergeable_tier.publish_merged(tier, _key(), mine, refuse, _check, _meta,
                                                  here_fs / "s", limit=MiB)
    assert pub is None and out == mine
    assert why == "the shared entry was not merged (left as it was): headers differ"
    assert tier.lookup(_key()).etag == etag
    assert _tier_bytes(here_fs, s3env) == theirs


def test_publish_merged_retries_a_lost_race_and_keeps_both(here_fs, s3env):
    _publish(here_fs, s3env, write_timing_cache(_key(), _entries(10, "a")))
    tier = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    mine = write_timing_cache(_key(), _entries(10, "b"))
    raced = []

    def combine(theirs: bytes, ours: bytes) -> bytes:
        if not raced:  # machine C publishes between our read and our write
            raced.append(True)
            _publish(here_fs, s3env, write_timing_cache(_key(), _entries(10, "c")), "C")
        return FakeBuilder.combine(theirs, ours)

    pub, why, out = mergeable_tier.publish_merged(tier, _key(), mine, combine, _check, _meta,
                                                  here_fs / "s", limit=MiB)
    assert why is None and pub is not None and pub.published, (pub, why)
    got = parse_timing_cache(_tier_bytes(here_fs, s3env))[1]
    assert got == {**_entries(10, "a"), **_entries(10, "b"), **_entries(10, "c")}
    assert parse_timing_cache(out)[1] == got
    assert sorted((here_fs / "s").iterdir()) == []  # no in-N, no out-N left in the scratch


def test_publish_merged_gives_up_after_attempts_of_lost_races(here_fs, s3env):
    _publish(here_fs, s3env, write_timing_cache(_key(), _entries(10, "a")))
    tier = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    mine = write_timing_cache(_key(), _entries(10, "b"))
    n = []

    def combine(theirs: bytes, ours: bytes) -> bytes:  # every read loses its race
        n.append(True)
        _publish(here_fs, s3env, write_timing_cache(_key(), _entries(2, f"c{len(n)}")), "C")
        return FakeBuilder.combine(theirs, ours)

    pub, why, out = mergeable_tier.publish_merged(tier, _key(), mine, combine, _check, _meta,
                                                  here_fs / "s", limit=MiB, attempts=2)
    assert len(n) == 2
    assert pub is not None and not pub.published
    assert why is not None and why.startswith("gave up after 2 tries (the entry kept changing: ")
    assert out == mine
    got = parse_timing_cache(_tier_bytes(here_fs, s3env))[1]
    assert not set(_entries(10, "b")) & set(got)  # ours never written over theirs


def test_publish_merged_replaces_a_tier_entry_refused_by_check(here_fs, s3env):
    tier = _tiered(here_fs, "A", s3env, s3env.endpoint.url).remote
    theirs = write_timing_cache(_key(), _entries(20, "x"))
    other = {**_meta(theirs), "timing": {**_facts(), "driver": "535.0"}}
    pub, why, _ = mergeable_tier.publish_merged(tier, _key(), theirs, FakeBuilder.combine,
                                                lambda m: None, lambda out: other,
                                                here_fs / "s0", limit=MiB)
    assert pub.published, why
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    mine = write_timing_cache(_key(), _entries(4, "m"))
    seen = []

    def combine(t: bytes, o: bytes) -> bytes:
        seen.append(t)
        return FakeBuilder.combine(t, o)

    pub, why, out = mergeable_tier.publish_merged(b, _key(), mine, combine, _check, _meta,
                                                  here_fs / "s1", limit=MiB)
    assert pub is not None and pub.published and why is None, why
    assert seen == [] and out == mine  # never merged with the refused entry
    assert _tier_bytes(here_fs, s3env) == mine
    assert b.lookup(_key()).metadata["timing"]["driver"] == _facts()["driver"]


# -- timing_entries ------------------------------------------------------------------------


def test_timing_entries_push_of_a_key_that_is_no_timing_cache_is_refused(here_fs, s3env):
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    data = b"an engine, not a timing cache"
    _put_local(b, here_fs, data, {"kind": "trtet_store.tensorrt.engine"})
    with pytest.raises(ValueError, match="is not a timing cache in the engine cache"):
        timing_entries.push_entries(b, [_key()])
    with pytest.raises(ValueError, match="is not a timing cache in the engine cache"):
        b.push([_key()])
    assert b.remote.lookup(_key()) is None


def test_timing_entries_push_never_publishes_the_local_tier_etag(here_fs, s3env):
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    data = write_timing_cache(_key(), _entries(6, "p"))
    _put_local(b, here_fs, data, {**_meta(data), "tier_etag": '"an-etag-of-this-machine"'})
    with installed(FakeBuilder()):
        [pub] = timing_entries.push_entries(b, [_key()])
    assert pub.published, pub.reason
    meta = b.remote.lookup(_key()).metadata
    assert "tier_etag" not in meta
    assert meta["entries"] == 6 and meta["kind"] == timing_cache.TIMING_KIND


def test_timing_entries_pull_entry_refusals(here_fs, s3env):
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    with pytest.raises(ValueError, match=r"is not in the shared tier s3://"):
        timing_entries.pull_entry(b, _key())
    # An entry keyed for other facts (another GPU) under a key of its own: refused.
    tier = _tiered(here_fs, "A", s3env, s3env.endpoint.url).remote
    other_facts = {**_facts(), "gpu": "NVIDIA H100"}
    other_key = timing_cache.timing_key(other_facts)
    data = write_timing_cache(other_key, _entries(6, "o"))
    (here_fs / "t").write_bytes(data)
    assert tier.publish(other_key, [("timing", here_fs / "t")],
                        {**_meta(data), "timing": other_facts}).published
    with pytest.raises(ValueError, match="cannot be used here: it was made for another gpu"):
        timing_entries.pull_entry(b, other_key)
    # An entry under this machine's key whose files are wrong: not taken in, said.
    (here_fs / "x").write_bytes(data)
    assert tier.publish(_key(), [("timing", here_fs / "t"), ("x", here_fs / "x")],
                        _meta(data)).published
    with installed(FakeBuilder()), pytest.raises(
            ValueError, match="was not taken in: the shared entry is refused: its files are"):
        timing_entries.pull_entry(b, _key())
    assert b.blobs.get(_key()) is None and b.blobs.get(other_key) is None


# -- timing_cache.build_warm with a tier: only what a build learned is pushed ---------------


def test_build_warm_with_a_tier_pushes_nothing_when_the_build_learned_nothing(here_fs, s3env):
    from trtet_store.export.timing_cache import build_warm

    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    data = write_timing_cache(_key(), _entries(8, "offline"))  # made here, never pushed
    _put_local(b, here_fs, data, _meta(data))
    seen = []

    def build(timing_cache_path: str) -> str:  # reads its copy, learns nothing
        seen.append(Path(timing_cache_path).read_bytes())
        return "built"

    with installed(FakeBuilder()):
        built, said = build_warm(b, build, {})
    assert built == "built" and seen == [data]
    assert said is not None and said.warm and said.merged is None, said
    assert said.tier is not None and said.tier.published is None and said.tier.sent == 0
    assert b.remote.lookup(_key()) is None  # nothing learned: nothing sent to the team

    def learn(timing_cache_path: str) -> str:  # learns two tactics: merged, then pushed
        more = {**_entries(8, "offline"), **_entries(2, "new")}
        Path(timing_cache_path).write_bytes(write_timing_cache(_key(), more))
        return "built"

    with installed(FakeBuilder()):
        _, said = build_warm(b, learn, {})
    assert said.merged is True and said.tier.published is True, said
    assert parse_timing_cache(_tier_bytes(here_fs, s3env))[1] == \
        {**_entries(8, "offline"), **_entries(2, "new")}


def test_mergeable_tier_fetch_takes_an_entry_of_exactly_the_limit(here_fs, s3env):
    data = write_timing_cache(_key(), _entries(40, "lim"))
    _publish(here_fs, s3env, data)
    tier = _tiered(here_fs, "B", s3env, s3env.endpoint.url).remote
    got = mergeable_tier.fetch(tier, _key(), here_fs / "in", _check, limit=len(data))
    assert got.data == data and got.reason is None, got.reason
    got = mergeable_tier.fetch(tier, _key(), here_fs / "in", _check, limit=len(data) - 1)
    assert got.data is None and got.reason.startswith("the shared entry is refused")


def test_engine_cache_pull_of_timing_and_build_keys_pulls_both(here_fs, s3env):
    # timing_entries.pull_entry takes the trt-t- keys; the rest go the builds' way (here: a
    # build key in neither cache is refused, before the timing entry is taken in: every key
    # is looked up before anything is downloaded).
    data = write_timing_cache(_key(), _entries(12, "pull"))
    _publish(here_fs, s3env, data)
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    build = "trt-" + "ab" * 16 + "-sm_89"
    with installed(FakeBuilder()):
        with pytest.raises(ValueError, match="is in neither the engine cache"):
            b.pull([_key(), build])
        assert _local_bytes(b) is None
        [(key, got)] = b.pull([_key()])
        assert key == _key() and got > 0 and _local_bytes(b) == data
        [(key, got)] = b.pull([_key()])  # taken in already: nothing downloaded
    assert key == _key() and got == 0
