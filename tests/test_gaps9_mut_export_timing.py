"""export/timing_cache.py _canonical / timing_facts / build_warm / _merge: states no test set
up (gap hunt 3, a mutation sweep of the round's lines).

- ``_canonical``: a setting of ``None`` stays JSON null in the facts (never the string
  ``"None"``: an entry's facts say what the build was given), numbers and bools stay
  themselves;
- ``_merge``: the warning "was replaced, not merged" is logged when (and only when) the
  entry that was there was refused (another device's) and replaced by the build's.

Real filesystem (``here_fs``), the stub TensorRT seam, no torch export, no S3.
"""

from __future__ import annotations

import logging
from pathlib import Path

from timing_machine import (
    SM89,
    machine,  # noqa: F401 - the autouse fixture
)
from timing_machine import entries as _entries
from timing_machine import facts as _facts
from timing_machine import key as _key

import trtet_store
from trtet_store.export import timing_cache
from trtet_store.export.timing_cache import build_warm
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, write_timing_cache


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _put(cache: trtet_store.EngineCache, here: Path, data: bytes, meta: dict) -> None:
    src = here / "entry-src"
    src.write_bytes(data)
    assert cache.blobs.put(_key(), src, meta).stored
    src.unlink()


def test_timing_facts_keep_none_numbers_and_bools_as_json():
    """timing_cache._canonical: ``value is None or isinstance(value, (bool, int, float,
    str))``: None is null, 3 is 3, False is False (str() only for other objects)."""
    assert timing_cache._canonical(None) is None
    flags = timing_cache.timing_facts({"l2_limit_for_tiling": None,
                                       "tiling_optimization_level": 3,
                                       "disable_tf32": False,
                                       "enabled_precisions": [None, 1.5]})["flags"]
    assert flags == {"l2_limit_for_tiling": None, "tiling_optimization_level": 3,
                     "disable_tf32": False, "enabled_precisions": [None, 1.5]}, flags
    assert timing_cache.timing_key(timing_cache.timing_facts({"l2_limit_for_tiling": None})) \
        != timing_cache.timing_key(timing_cache.timing_facts({"l2_limit_for_tiling": "None"}))


def _learned(more: dict) -> object:
    def build(timing_cache_path: str | None = None) -> str:
        Path(timing_cache_path).write_bytes(write_timing_cache(_key(), more))
        return "built"
    return build


def test_build_warm_warns_replaced_only_for_an_entry_it_replaced(here_fs, caplog):
    """timing_cache._merge: ``if done.replaced:``: a plain merge logs no "replaced"; an
    entry at the key made for another driver is replaced by the build's, and said so."""
    caplog.set_level(logging.INFO, logger="trtet_store.engine_cache")
    cache = _cache(here_fs)
    mine = _entries(4, "m")
    _put(cache, here_fs, write_timing_cache(_key(), mine),
         {**timing_cache._metadata(_facts()), "entries": 4})
    with installed(FakeBuilder()):
        _, said = build_warm(cache, _learned({**mine, **_entries(2, "n")}), {})
    assert said is not None and said.merged is True and said.after == 6, said
    assert not [r for r in caplog.records if "was replaced" in r.getMessage()], caplog.text
    caplog.clear()

    other = {**SM89, "driver": "535.54.03", "flags": {}}
    cache2 = trtet_store.EngineCache(here_fs / "cache2", max_bytes=1 << 30, min_free=0)
    _put(cache2, here_fs, write_timing_cache(_key(), _entries(3, "o")),
         {**timing_cache._metadata(other), "entries": 3})
    with installed(FakeBuilder()):
        _, said = build_warm(cache2, _learned(_entries(2, "p")), {})
    assert said is not None and not said.warm and said.merged is True and said.after == 2, said
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "was replaced, not merged" in r.getMessage()]
    assert len(warned) == 1 and "driver '535.54.03' (here '570.124.06')" in warned[0], warned



def test_build_warm_merges_a_build_that_wrote_back_the_unreadable_entry(here_fs):
    """timing_cache._merge: ``if copied.warm and <digest> == copied.digest``: "nothing
    learned" only for a copy the build started warm from. An entry the seam cannot read
    is handed over emptied (not warm); a build that writes those very bytes back has
    learned something to merge, and the merge's refusal is said (never a silent skip)."""
    cache = _cache(here_fs)
    bad = b"not a timing cache at all\n"
    _put(cache, here_fs, bad, timing_cache._metadata(_facts()))

    def build(timing_cache_path: str | None = None) -> str:
        assert Path(timing_cache_path).read_bytes() == b""  # handed over emptied
        Path(timing_cache_path).write_bytes(bad)
        return "built"

    with installed(FakeBuilder()):
        _, said = build_warm(cache, build, {})
    assert said is not None and not said.warm and said.reason.startswith("unreadable ("), said
    assert said.merged is False and said.merge_reason, said


def test_timing_tier_push_without_a_local_entry_publishes_nothing(here_fs, s3env):
    """timing_tier.push: ``if mine is None: return``: no local entry (or none that passes
    its seal) is nothing to publish: said as nothing (None), no error, the bucket empty."""
    from timing_machine import meta as _meta
    from timing_machine import tiered as _tiered

    from trtet_store.export import timing_tier
    from trtet_store.export.timing_tier import TierSaid

    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    said = TierSaid()
    with installed(FakeBuilder()):
        timing_tier.push(b, _key(), lambda m: timing_cache.entry_problem(m, _facts()),
                         FakeBuilder.combine, timing_cache._combined, _meta, limit=1 << 20,
                         said=said)
    assert (said.published, said.publish_reason, said.sent) == (None, None, 0), said
    assert b.remote.lookup(_key()) is None
