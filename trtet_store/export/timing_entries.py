"""``trtet-store cache push`` and ``pull`` of timing entries (kind ``timing``).

:mod:`.timing_cache` says what a timing entry is and :mod:`.timing_tier` moves one
through the shared tier; :class:`~.engine_cache.EngineCache` calls these two for the
``trt-t-`` keys of a push or a pull.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trtet_store.cache import mergeable_tier
from trtet_store.export.timing_tier import TierSaid, _local, _scratch, pull

if TYPE_CHECKING:
    from trtet_store.export.timing_tier import CacheLevels

__all__ = ["pull_entry", "push_entries"]



def _entry_check(facts: dict[str, Any] | None) -> Callable[[dict[str, Any]], str | None]:
    from trtet_store.export import timing_cache

    def check(meta: dict[str, Any]) -> str | None:
        if facts is None:  # push: the local entry's own facts
            return None if meta.get("kind") == timing_cache.TIMING_KIND else \
                "not a timing cache"
        return timing_cache.entry_problem(meta, facts)
    return check


def push_entries(cache: CacheLevels, keys: list[str]) -> list[Any]:
    """``cache push`` of timing entries: each merged into the tier's (If-Match, retried).

    Returns a :class:`~trtet_store.cache.tier.TierPublish` per key
    (``published=False`` with the reason when the tier held it all already,
    or refused the merge).
    """
    from trtet_store.cache.tier import TierPublish
    from trtet_store.export import timing_cache

    out = []
    for key in keys:
        limit = timing_cache.MAX_TIMING_BYTES
        mine, meta = _local(cache, key, limit)
        if mine is None or meta.get("kind") != timing_cache.TIMING_KIND:
            raise ValueError(f"{key!r} is not a timing cache in the engine cache "
                             f"{cache.directory}")
        facts = meta.get("timing")
        scratch = _scratch(cache)
        try:
            pub, why, _ = mergeable_tier.publish_merged(
                cache.remote, key, mine,
                lambda theirs, ours: timing_cache.combine(theirs, ours, ignore_mismatch=False),
                _entry_check(facts if isinstance(facts, dict) else {}),
                lambda data, meta=meta: {**{k: v for k, v in meta.items() if k != "tier_etag"},
                                         "entries": timing_cache._count(data)},
                scratch, limit=limit)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        out.append(pub if pub is not None else TierPublish(
            key, False, why or "the shared cache holds all of it already", 0, None))
    return out


def pull_entry(cache: CacheLevels, key: str, settings: dict[str, Any] | None = None) -> int:
    """``cache pull`` of a timing entry: fetched, verified, merged into the local one.

    Refused (ValueError) when it was made for another GPU, TensorRT build,
    CUDA or driver than this machine's (its flags are the entry's own).
    Returns the bytes downloaded.
    """
    from trtet_store.export import timing_cache

    entry = cache.remote.lookup(key)
    if entry is None:
        raise ValueError(f"{key!r} is not in the shared tier {cache.remote.url}")
    theirs = entry.metadata.get("timing") if isinstance(entry.metadata, dict) else None
    flags = theirs.get("flags") if isinstance(theirs, dict) else None
    facts = {**timing_cache.gpu_facts(), "flags": flags if isinstance(flags, dict) else {}}
    if timing_cache.timing_key(facts) != key:
        why = timing_cache.entry_problem(entry.metadata, facts) or "its key is not its facts'"
        raise ValueError(f"the shared entry {key!r} cannot be used here: {why}")
    said = TierSaid()
    pull(cache, key, _entry_check(facts), timing_cache._combined,
         timing_cache._metadata(facts), limit=timing_cache.MAX_TIMING_BYTES, said=said)
    if said.fetched_reason:
        raise ValueError(f"the shared entry {key!r} was not taken in: {said.fetched_reason}")
    return said.downloaded
