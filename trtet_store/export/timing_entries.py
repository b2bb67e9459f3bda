"""``trtet-store cache push``, ``pull`` and ``export-timing`` of timing entries (kind ``timing``).

:mod:`.timing_cache` says what a timing entry is and :mod:`.timing_tier` moves one
through the shared tier; :class:`~.engine_cache.EngineCache` calls these two for the
``trt-t-`` keys of a push or a pull, and :func:`export_entry` for
``export_timing_cache`` (a file for ``trtexec --timingCacheFile``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from trtet_store.cache import mergeable_tier
from trtet_store.export.timing_tier import TierSaid, _local, _scratch, pull
from trtet_store.io import read_fd_capped

if TYPE_CHECKING:
    from trtet_store.export.timing_tier import CacheLevels

__all__ = ["TimingExport", "export_entry", "pull_entry", "pull_facts", "push_entries"]


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


def pull_entry(cache: CacheLevels, key: str, facts: dict[str, Any] | None = None) -> int:
    """``cache pull`` of a timing entry: fetched, verified, merged into the local one.

    Refused (ValueError) when it was made for another GPU, TensorRT build,
    CUDA or driver than this machine's (its flags are the entry's own).
    ``facts``: what :func:`pull_facts` already gave for ``key`` (its pointer is not
    looked up again; the fetched entry is still checked against them).
    Returns the bytes downloaded.
    """
    from trtet_store.export import timing_cache

    if facts is None:
        facts = pull_facts(cache, key)
    said = TierSaid()
    pull(cache, key, _entry_check(facts), timing_cache._combined,
         timing_cache._metadata(facts), limit=timing_cache.MAX_TIMING_BYTES, said=said)
    if said.fetched_reason:
        raise ValueError(f"the shared entry {key!r} was not taken in: {said.fetched_reason}")
    return said.downloaded


def pull_facts(cache: CacheLevels, key: str) -> dict[str, Any]:
    """The facts a pull of ``key`` checks the tier's entry against: ValueError when the tier
    has no such entry or it was made for another machine (checked before any download)."""
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
    return facts


@dataclass
class TimingExport:
    """What :func:`export_entry` wrote: ``path`` holds the entry ``key``'s bytes, whole."""

    key: str
    path: Path
    size: int
    entries: int | None  # tactic entries, as the entry's metadata counts them
    digest: str  # xxh3-128 of the bytes written (the entry's sealed digest)
    facts: dict[str, Any]  # the GPU, TensorRT, CUDA, driver and flags it was made for


def _this_machine(cache: CacheLevels) -> str:
    """The one local timing entry made for this machine's GPU, TensorRT, CUDA and driver."""
    from trtet_store.export import timing_cache

    facts = timing_cache.gpu_facts()
    mine = sorted(e.key for e in cache.blobs.entries()
                  if e.metadata.get("kind") == timing_cache.TIMING_KIND
                  and isinstance(e.metadata.get("timing"), dict)
                  and all(e.metadata["timing"].get(k) == v for k, v in facts.items()))
    if not mine:
        raise ValueError(
            f"no timing cache for this machine ({facts.get('gpu')}, "
            f"{facts.get('compute_capability')}, {', '.join(facts.get('tensorrt') or [])}, "
            f"CUDA {facts.get('cuda')}, driver {facts.get('driver')}) in the engine cache "
            f"{cache.directory}: a TensorRT build with the engine cache makes one "
            "(`trtet-store cache list` shows kind timing)")
    if len(mine) > 1:
        raise ValueError(f"{len(mine)} timing caches for this machine in the engine cache "
                         f"{cache.directory} (one per builder flag set): {', '.join(mine)}; "
                         "name one (key=...)")
    return mine[0]


def _named(cache: CacheLevels, key: str) -> str:
    """``key`` whole, or a prefix of one local timing entry's key (as git takes a commit's)."""
    from trtet_store.export import timing_cache

    if re.fullmatch(r"trt-t-[0-9a-f]{32}-.+", key):
        return key
    found = sorted(e.key for e in cache.blobs.entries() if e.key.startswith(key)
                   and e.metadata.get("kind") == timing_cache.TIMING_KIND)
    if len(found) > 1:
        raise ValueError(f"{key!r} names {len(found)} timing caches of the engine cache "
                         f"{cache.directory}: {', '.join(found)}; give more of the key")
    return found[0] if found else key


def export_entry(cache: CacheLevels, destination: os.PathLike | str, key: str | None = None,
                 *, replace: bool = False) -> TimingExport:
    """Write the merged timing cache of ``key`` (default: this machine's) to ``destination``.

    The file is TensorRT's serialized timing cache, as ``trtexec
    --timingCacheFile`` and TensorRT-LLM's ``--input_timing_cache`` load it.
    The entry is read from its pinned blob and its bytes are checked against
    the entry's seal (size, xxh3-128) before anything is written: a damaged
    entry is dropped and nothing is written. ``destination`` is written
    atomically (a temp file beside it, fsynced, renamed; mode 0644), in a
    directory of ours (not a link, not writable by others unless sticky),
    never through a link; an existing ``destination`` is left alone unless
    ``replace``.

    Raises
    ------
    ValueError
        ``key`` is not in the cache, or is not a timing cache; no key given
        and this machine has none (or several: one per flag set); damaged.
    FileExistsError
        ``destination`` exists and not ``replace``.
    """
    from trtet_store.export import timing_cache
    from trtet_store.io import SafeDir

    destination = Path(destination)
    key = _this_machine(cache) if key is None else _named(cache, key)
    if not replace and os.path.lexists(destination):
        raise FileExistsError(f"{destination} exists: left as it was (pass replace=True "
                              "(--replace) to overwrite it)")
    hit = cache.blobs.get(key)
    if hit is None:
        why = cache.blobs.dropped.get(key)
        raise ValueError(f"no entry {key!r} in the engine cache {cache.directory}"
                         + (f" (it was damaged and dropped: {why})" if why else "")
                         + ": `trtet-store cache list` shows its timing caches (kind timing)")
    with hit:
        meta = dict(hit.metadata)
        if meta.get("kind") != timing_cache.TIMING_KIND:
            raise ValueError(f"{key!r} is not a timing cache (kind {meta.get('kind')!r}) in the "
                             f"engine cache {cache.directory}: nothing written")
        limit = timing_cache.MAX_TIMING_BYTES
        if hit.size > limit:
            raise ValueError(f"the timing cache {key!r} holds {hit.size} bytes, over the "
                             f"{limit} allowed: nothing written")
        data = read_fd_capped(hit.fileno(), limit, hit.path, "cache entry")
        digest = xxhash.xxh3_128_hexdigest(data)
        if len(data) != hit.size or digest != hit.digest:
            why = (f"its bytes ({len(data)}, xxh3-128 {digest}) are not the sealed ones "
                   f"({hit.size}, {hit.digest})")
            cache.blobs.drop(key, f"damaged: {why}")
            raise ValueError(f"the timing cache {key!r} is damaged ({why}): dropped, nothing "
                             "written")
    with SafeDir.open(destination.parent, what="directory to export into",
                      todo="export into a directory of yours") as where:
        try:
            where.write_atomic(destination.name, data, mode=0o644, replace=replace)
        except FileExistsError:  # made meanwhile: still never overwritten
            raise FileExistsError(f"{destination} exists: left as it was (pass replace=True "
                                  "(--replace) to overwrite it)") from None
    facts = meta.get("timing") if isinstance(meta.get("timing"), dict) else {}
    entries = meta.get("entries")
    return TimingExport(key, destination, len(data),
                        int(entries) if isinstance(entries, int) else None, digest, facts)
