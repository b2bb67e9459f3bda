"""A build into the engine cache: its engines, then its record (the commit point).

What :meth:`.engine_cache.EngineCache.put_build` does, on the cache's local
level (a :class:`~trtet_store.cache.BlobCache`): each engine an entry
``<key>.e<i>``, then the record ``<key>`` naming them all, each a skip (never
an error) when the bound, the space or a permission says no. Engines the
cache took by hard link are given back to the save through
:mod:`.engine_staging`. Imports neither :mod:`.engine_cache` nor
:mod:`.engine_build`, so no file circle.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from trtet_store.export import engine_key, engine_staging

if TYPE_CHECKING:
    from trtet_store.cache import BlobCache, Hit, PutResult
    from trtet_store.export.tensorrt import BuildResult

__all__ = ["put_build"]


def put_build(blobs: BlobCache, key: str, built: BuildResult, fingerprint: str,
              capability: str, *, reserve: int = 0, consume: bool = False,
              record_extra: dict[str, Any] | None = None) -> list[PutResult]:
    """Cache ``built``'s engines in ``blobs``, then its record (the commit point of the build).

    ``capability`` is the GPU's the build is for (recorded in its metadata).

    Without ``consume`` nothing is consumed: each staged engine is cloned
    into the cache where the filesystems allow, else copied. ``reserve``
    bytes are kept free on top of ``min_free`` (the room the save still
    needs). A skipped engine skips the record (a record names every
    engine). Never raises for a bound, space or permission problem: the
    results say why.

    ``consume=True`` (the staging store shares the cache's filesystem and
    cannot clone into it, e.g. ext4): each staged engine is hard linked
    into the cache (no byte written; the cache's entry is its own inode
    once the staged name is gone), and the engine's blob becomes the
    cache's file, pinned and shared (:func:`.engine_staging.share_hit`):
    the save copies it once and never consumes it, so the program's file
    is never the cache's. When the build is not cached whole (an engine
    or the record skipped, or an error), each engine already taken is
    staged again from the cache (:func:`.engine_staging.stage_hit`): the
    build stays the staging store's, kept for the next call if the save
    fails (DESIGN.md invariant 9), as without ``consume``.

    ``record_extra``: more fields of the record's metadata (a refit's
    ``refit_from``, the structure key it was refit from).

    Returns
    -------
    list of PutResult
        One per engine, then the record's (when the engines were stored).
    """
    cache = blobs
    if reserve:
        # A view with a higher floor, so that the cache's copy never takes the
        # save's room; the shared object is left as it is (other threads use it).
        cache = copy.copy(blobs)
        cache.min_free = blobs.min_free + reserve
    engine_meta, record_meta = engine_key.metadata(key, built, fingerprint, capability)
    record_meta.update(record_extra or {})
    if len({id(e.blob) for e in built.engines}) < len(built.engines):
        consume = False  # one blob for two engines: the first put would consume both
    results: list[PutResult] = []
    taken: list[tuple[Any, Hit]] = []  # (engine, its entry pinned), consumed into the cache
    try:
        for i, engine in enumerate(built.engines):
            result = cache.put(engine_key.engine_key(key, i), engine.blob, engine_meta[i],
                               consume=consume, pin=consume)
            if result.hit is not None:
                taken.append((engine, result.hit))
                result = dataclasses.replace(result, hit=None)
            results.append(result)
            if result.skipped:
                return results
        if built.record is None:
            return results
        results.append(cache.put(key, built.record, record_meta))
        return results
    finally:
        if taken:
            whole = len(results) == len(built.engines) + (built.record is not None) and \
                all(r.stored for r in results)
            engine_staging.place_taken(taken, whole)
