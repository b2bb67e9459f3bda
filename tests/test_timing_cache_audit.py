"""Timing-cache checks that only a state set up for them proves (the blind audit's batch X).

- timing_tier.pull: the tier's entry whose ETag the local entry took in last is not
  downloaded again (bytes counted by the counting proxy, not by the client's report);
- mergeable_tier.fetch: a shared entry over the limit is refused from its pointer,
  before a byte of its file is downloaded;
- timing_cache.entry_problem: a fact the entry names and this machine does not is a
  difference (the entry was made for another device);
- cache.mergeable copy_out / merge_in: a local entry over the limit is refused from its
  size, never read (not even up to the cap), and left as it was.

Real filesystems (``here_fs``), a real S3 server (SeaweedFS) behind the counting proxy,
the stub TensorRT seam (``installed(FakeBuilder())``); no torch export, no children.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

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
from trtet_store.cache.mergeable import copy_out, merge_in
from trtet_store.export import timing_cache, timing_tier
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    parse_timing_cache,
    write_timing_cache,
)

MiB = 1 << 20


def _published(here: Path, s3: Any, data: bytes) -> None:
    """Machine A publishes ``data`` as the key's shared timing entry (straight to the server)."""
    tier = _tiered(here, "A", s3, s3.endpoint.url).remote
    pub, why, _ = mergeable_tier.publish_merged(tier, _key(), data, FakeBuilder.combine,
                                                _check, _meta, here / "scratch-A", limit=MiB)
    assert pub is not None and pub.published, why


def _digests(cache: trtet_store.EngineCache) -> dict[str, str]:
    out = {}
    for path in sorted(Path(cache.directory).rglob("*")):
        if path.is_file() and not path.is_symlink() and "tmp" not in path.parts:
            out[str(path)] = xxhash.xxh3_128_hexdigest(path.read_bytes())
    return out


# -- timing_tier.pull: an entry taken in once is not downloaded again --------------------


def test_timing_tier_pull_does_not_download_the_entry_whose_etag_it_took_in(here_fs, s3env,
                                                                            proxy):
    key = _key()
    data = write_timing_cache(key, _entries(4000, "a"))  # ~70 KB: far above any pointer
    _published(here_fs, s3env, data)
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url)
    with installed(FakeBuilder()):
        first = timing_tier.TierSaid()
        timing_tier.pull(b, key, _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=first)
        assert first.fetched_reason is None and first.downloaded == len(data)
        assert proxy.downstream > len(data)
        hit = b.blobs.get(key)
        with hit:
            assert parse_timing_cache(Path(hit.path).read_bytes())[1] == \
                parse_timing_cache(data)[1]
            taken = dict(hit.metadata)["tier_etag"]
        before = _digests(b)

        proxy.reset()
        again = timing_tier.pull(b, key, _check, timing_cache._combined,
                                 timing_cache._metadata(_facts()), limit=MiB,
                                 said=(second := timing_tier.TierSaid()))
    assert again is None
    assert second.downloaded == 0 and second.fetched_reason is None, second
    # The pointer is read (its ETag compared), the file is not: the proxy's count, not
    # the client's, is under the file's size.
    assert proxy.downstream < len(data) // 4, proxy.downstream
    assert _digests(b) == before
    hit = b.blobs.get(key)
    with hit:
        assert dict(hit.metadata)["tier_etag"] == taken


# -- mergeable_tier.fetch: a shared entry over the limit is refused before downloading ----


def test_mergeable_tier_fetch_refuses_an_entry_over_the_limit_before_downloading_it(
        here_fs, s3env, proxy):
    key = _key()
    data = write_timing_cache(key, _entries(4000, "big"))
    _published(here_fs, s3env, data)
    tier = _tiered(here_fs, "B", s3env, proxy.endpoint_url).remote
    proxy.reset()
    limit = len(data) // 2
    got = mergeable_tier.fetch(tier, key, here_fs / "in", _check, limit=limit)
    assert got.data is None and got.entry is not None
    assert got.reason.startswith("the shared entry is refused"), got.reason
    assert f"of at most {limit} bytes" in got.reason
    assert got.downloaded == 0
    assert proxy.downstream < len(data) // 4, proxy.downstream  # only the pointer came
    assert not (here_fs / "in").exists()


def test_timing_tier_pull_of_an_entry_over_the_limit_downloads_nothing_and_caches_nothing(
        here_fs, s3env, proxy):
    key = _key()
    data = write_timing_cache(key, _entries(4000, "big"))
    _published(here_fs, s3env, data)
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url)
    proxy.reset()
    said = timing_tier.TierSaid()
    with installed(FakeBuilder()):
        timing_tier.pull(b, key, _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=len(data) - 1, said=said)
    assert said.downloaded == 0
    assert said.fetched_reason is not None and \
        said.fetched_reason.startswith("the shared entry is refused"), said.fetched_reason
    assert proxy.downstream < len(data) // 4, proxy.downstream
    assert b.blobs.get(key) is None


# -- timing_cache.entry_problem: every fact either side names is compared ----------------


def test_entry_problem_refuses_an_entry_naming_a_fact_this_machine_lacks():
    facts = _facts()
    same = {"kind": timing_cache.TIMING_KIND, "timing": dict(facts)}
    assert timing_cache.entry_problem(same, facts) is None
    extra = {"kind": timing_cache.TIMING_KIND, "timing": {**facts, "mig_profile": "1g.10gb"}}
    why = timing_cache.entry_problem(extra, facts)
    assert why == "it was made for another mig_profile '1g.10gb' (here None)", why
    # And the other way round: a fact here the entry does not name.
    fewer = {k: v for k, v in facts.items() if k != "driver"}
    why = timing_cache.entry_problem({"kind": timing_cache.TIMING_KIND, "timing": fewer}, facts)
    assert why is not None and "driver None" in why, why


def test_a_local_entry_naming_an_extra_fact_is_never_copied_out(here_fs):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    key = _key()
    data = write_timing_cache(key, _entries(10, "x"))
    src = here_fs / "entry"
    src.write_bytes(data)
    meta = {**timing_cache._metadata(_facts())}
    meta["timing"] = {**_facts(), "mig_profile": "1g.10gb"}  # made under another MIG profile
    assert cache.blobs.put(key, src, meta).stored
    with copy_out(cache.blobs, key, _check, limit=MiB) as copied:
        assert not copied.warm and copied.digest is None
        assert copied.reason == "it was made for another mig_profile '1g.10gb' (here None)"
        assert copied.path.read_bytes() == b""


# -- cache.mergeable: a local entry over the limit is refused from its size, never read ----


def test_copy_out_refuses_an_entry_over_the_limit_without_reading_it(here_fs):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    key = _key()
    data = write_timing_cache(key, _entries(200, "y"))
    src = here_fs / "entry"
    src.write_bytes(data)
    assert cache.blobs.put(key, src, _meta(data)).stored
    before = _digests(cache)
    limit = len(data) - 1
    with copy_out(cache.blobs, key, _check, limit=limit) as copied:
        assert not copied.warm and copied.digest is None
        assert copied.reason == f"the entry holds {len(data)} bytes, over the {limit} allowed"
        assert copied.path.read_bytes() == b""
    # Refused, not dropped as damaged: the entry is there, byte-identical.
    assert _digests(cache) == before
    hit = cache.blobs.get(key)
    with hit:
        assert Path(hit.path).read_bytes() == data


def test_merge_in_replaces_an_entry_over_the_limit_and_says_why(here_fs):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    key = _key()
    big = write_timing_cache(key, _entries(200, "y"))
    src = here_fs / "entry"
    src.write_bytes(big)
    assert cache.blobs.put(key, src, _meta(big)).stored
    small = write_timing_cache(key, _entries(3, "z"))
    learned = here_fs / "learned"
    learned.write_bytes(small)
    seen = []

    def combined(current: bytes | None, new: bytes) -> tuple[bytes, dict]:
        seen.append(current)
        return new, {}

    done = merge_in(cache.blobs, key, learned, combined, _check, _meta(small),
                    limit=len(big) - 1)
    assert done.merged, done.reason
    assert done.replaced == f"the entry holds {len(big)} bytes, over the {len(big) - 1} allowed"
    assert seen == [None]
    hit = cache.blobs.get(key)
    with hit:
        assert Path(hit.path).read_bytes() == small


def test_timing_tier_push_takes_in_the_etag_it_published_so_the_next_pull_downloads_nothing(
        here_fs, s3env, proxy):
    # The first machine to publish holds all it published already: the merge back of what
    # it published is the same bytes, and must still record the ETag taken in.
    key = _key()
    a = _tiered(here_fs, "A", s3env, proxy.endpoint_url)
    data = write_timing_cache(key, _entries(4000, "mine"))
    src = here_fs / "entry"
    src.write_bytes(data)
    assert a.blobs.put(key, src, {**timing_cache._metadata(_facts()), "entries": 4000}).stored
    with installed(FakeBuilder()):
        pushed = timing_tier.TierSaid()
        timing_tier.push(a, key, _check, FakeBuilder.combine, timing_cache._combined,
                         lambda out: {**timing_cache._metadata(_facts()),
                                      "entries": FakeBuilder.count_entries(out)},
                         limit=MiB, said=pushed)
        assert pushed.published and pushed.sent >= len(data), pushed
        hit = a.blobs.get(key)
        with hit:
            assert Path(hit.path).read_bytes() == data
            assert dict(hit.metadata).get("tier_etag") == a.remote.lookup(key).etag
        proxy.reset()
        pulled = timing_tier.TierSaid()
        timing_tier.pull(a, key, _check, timing_cache._combined,
                         timing_cache._metadata(_facts()), limit=MiB, said=pulled)
    assert pulled.downloaded == 0 and pulled.fetched_reason is None, pulled
    assert proxy.downstream < len(data) // 4, proxy.downstream


def test_timing_tier_pull_of_an_entry_this_machine_holds_all_of_is_downloaded_once(
        here_fs, s3env, proxy):
    # Merged in, the tier's entry changes nothing here (same bytes): its ETag is taken in
    # all the same, so the next build downloads nothing.
    key = _key()
    theirs = _entries(4000, "t")
    _published(here_fs, s3env, write_timing_cache(key, theirs))
    b = _tiered(here_fs, "B", s3env, proxy.endpoint_url)
    mine = write_timing_cache(key, {**theirs, **_entries(10, "b")})
    src = here_fs / "entry"
    src.write_bytes(mine)
    assert b.blobs.put(key, src, {**timing_cache._metadata(_facts()), "entries": 4010}).stored
    with installed(FakeBuilder()):
        for n in range(2):
            proxy.reset()
            said = timing_tier.TierSaid()
            timing_tier.pull(b, key, _check, timing_cache._combined,
                             timing_cache._metadata(_facts()), limit=MiB, said=said)
            assert said.fetched_reason is None, said
            assert (said.downloaded > 0) == (n == 0), (n, said)
    assert proxy.downstream < len(mine) // 4, proxy.downstream
    hit = b.blobs.get(key)
    with hit:
        assert Path(hit.path).read_bytes() == mine
