"""An export's builds through the engine cache: a hit staged, a miss built once and cached.

:func:`build_cached` is what the lowering calls for each TensorRT build when an
:class:`~trtet_store.export.engine_cache.EngineCache` is given: the local cache,
then the shared tier (:class:`~trtet_store.cache.tiered.TieredCache`), else the
build under the key's lease, cached before the consuming save and published.
A hit's engines are cloned into the staging store
(:func:`~.engine_staging.stage_hit`), else shared from the cache
(:func:`~.engine_staging.share_hit`). A miss's engines are cloned into the
cache; where the staging filesystem is the cache's and cannot clone (ext4) they
are hard linked in and the save copies them from there (2 copies in all: the
build's and the program's, issue 42 item 5).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.cache import PutResult
from trtet_store.export import engine_cache, engine_key
from trtet_store.export.engine_cache import CACHE_ERRNOS, log
from trtet_store.export.engine_record import (
    CachedBuild,
    EngineCacheEvent,
    Unplaced,
    tier_files,
)
from trtet_store.export.engine_staging import share_hit, stage_hit
from trtet_store.export.record_check import UnsafeRecordError
from trtet_store.io.units import MiB

if TYPE_CHECKING:
    from trtet_store.cache.tier import RemoteEntry
    from trtet_store.cache.tiered import TierGet
    from trtet_store.export.engine_cache import EngineCache
    from trtet_store.export.engine_refit import RefitSource
    from trtet_store.export.tensorrt import BuildResult
    from trtet_store.io import Blob, BlobStore

#: Why a refit from a local structure entry is not published: the tier's lease
#: answered with the entry (published before, or by the lease's holder meanwhile).
TIER_HOLDS_IT = "the shared cache holds an entry of this build already"

__all__ = ["build_cached", "build_from_cache", "save_reserve", "share_hit", "stage_hit"]

def build_from_cache(cached: CachedBuild, store: BlobStore, fingerprint: str, *,
                     verify: str = "seal") -> tuple[BuildResult, list[EngineCacheEvent]]:
    """The build a lowering needs, from a hit: engines staged in ``store``, none built.

    Engines are registered under their recorded ids (the recorded program's
    placeholders name them). A staged engine is checked against the record's
    digest: with the hit's sealed digests (no byte read, see
    :func:`stage_hit`), else by reading it once. One that differs raises
    :class:`ValueError` and nothing is left staged.
    """
    import torch

    from trtet_store.export import engine_reuse, tensorrt

    staged: dict[str, tuple[Blob, str]] = {}
    engines: list[tensorrt.Engine] = []
    events: list[EngineCacheEvent] = []
    record_blob = None
    try:
        for i, (entry, hit) in enumerate(zip(cached.entries, cached.engines, strict=True)):
            first = entry["digest"] not in staged
            if first:
                staged[entry["digest"]] = share_hit(store, hit, {
                    "kind": engine_reuse.ENGINE_KIND, "fingerprint": fingerprint},
                    verify=verify)
            blob, placement = staged[entry["digest"]]
            if first and blob.digest != entry["digest"]:
                raise ValueError(f"engine {i} of cache entry {cached.key}: staged bytes digest "
                                 f"{blob.digest}, recorded {entry['digest']}")
            engines.append(tensorrt.register_engine(
                blob, engine_reuse.entry_state(entry),
                [(tuple(shape), getattr(torch, dtype)) for shape, dtype in entry["outputs"]],
                engine_id=entry["engine_id"]))
            events.append(EngineCacheEvent(entry["engine_id"], engine_key.engine_key(cached.key, i),
                                           blob.size, "hit", placement if first else "shared"))
        with open(cached.record.path, "rb") as f:
            record_bytes = f.read()
        record_blob = store.put(record_bytes, metadata={
            "kind": engine_reuse.RECORD_KIND, "fingerprint": fingerprint,
            "engines": cached.entries})
        program = cached.exported_program()
    except BaseException:
        tensorrt.unregister_engines(engines)
        for blob, _ in staged.values():
            blob.close()
        if record_blob is not None:
            record_blob.close()
        raise
    for e in events:
        log.info("engine cache %s: hit %s, engine %s (%d bytes) placed by %s, not built",
                 cached.record.path.parent.parent, e.key, e.engine_id, e.size, e.placement)
    return tensorrt.BuildResult(program, engines, record_blob), events


def save_reserve(engines: list[Any]) -> int:
    """What a consuming save of ``engines`` may still need on the staging filesystem.

    The most any placement needs: a copy needs every engine's bytes, a move
    or an insert the writer's move budget (its ``chunk_size``, 64 MiB by
    default), a clone a block; plus 2 MiB for the program's headers and the
    writer's slack. A cache on that filesystem keeps this much free on top
    of ``min_free``, so that its copy never makes the save fail: the peak of a
    miss is then the staged engines, the cache's copy (none where it
    clones) and the program's headers, with this much left free.
    """
    from trtet_store.io.transaction import DEFAULT_CHUNK_SIZE

    engine_bytes = sum({e.blob.digest: e.blob.size for e in engines}.values())
    return max(engine_bytes, DEFAULT_CHUNK_SIZE) + 2 * MiB


def _clones(engines: list[Any], cache_dir: Path) -> bool:
    """Whether the cache's puts of ``engines`` will be clones (they take no room then)."""
    from trtet_store.io import fs
    from trtet_store.io.errors import PlacementUnavailable

    if not engines:
        return True
    try:
        fs.probe_clone(Path(engines[0].blob.path), cache_dir / "tmp")
    except (PlacementUnavailable, OSError):
        return False
    return True


def _same_filesystem(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return True  # unknown: assume they compete for the same room


def build_cached(cache: EngineCache, build: Any, store: BlobStore, fingerprint: str, *,
                 timeout: float | None = None, refit: RefitSource | None = None,
                 settings: dict[str, Any] | None = None,
                 ) -> tuple[BuildResult, list[EngineCacheEvent]]:
    """A lowering's build through the cache: a hit, or ``build()`` then a put, one per key.

    ``build`` is called with no argument and returns the staged
    :class:`~trtet_store.export.tensorrt.BuildResult` (with its record). The
    key's single-flight lock is held over the lookup, the build and the put,
    so concurrent exports of one model build it once and the others hit.
    A cache problem while putting never fails the export: it is logged and
    reported (``stored=False`` with the reason). With a shared tier, a local
    miss asks it (:meth:`TieredCache.get`), else builds under the key's lease
    (:meth:`TieredCache.claim`) and publishes (:meth:`TieredCache.publish`);
    a build cached here but not published is published by the next export
    that hits it.

    ``refit`` (:func:`.engine_refit.source`, given when the settings make a
    refittable engine): a local miss with a structure entry of the same
    structure key is refit from it instead of built (under the same claim,
    before the shared tier is asked), and a build is kept as the structure
    entry of later fine-tunes (:mod:`.engine_refit`). With a shared tier
    (issue 46 item 5) the order is: a local hit; a local structure entry
    (refit under the key's lease too, published under it as a build is); the
    tier's full entry; the tier's structure entry (downloaded into the local
    cache, checked as a build entry, then refit under the lease); the build,
    which publishes its full entry, then its structure entry.

    ``settings`` (the build's compile settings): a build starts from this
    machine's timing cache for them and merges what it learned back
    (:func:`.timing_cache.build_warm`; ``build`` then takes ``timing_cache_path=``).
    """
    from trtet_store.export import engine_refit, timing_cache

    key = cache.key(fingerprint)
    tiered = cache.tiered
    with contextlib.ExitStack() as stack:
        waited = 0.0
        try:
            waited = stack.enter_context(cache.single_flight(key, timeout=timeout)).waited
        except OSError as exc:
            if isinstance(exc, TimeoutError) or \
                    exc.errno not in CACHE_ERRNOS | {errno.ENOENT}:
                raise
            # e.g. a read-only cache: it can still serve hits, with no lock to share.
            log.warning("engine cache %s: no single-flight lock for %s (%s); going on "
                        "without it", cache.directory, key, exc)
        try:
            cached = cache.lookup(key)
        except OSError as exc:
            if exc.errno not in CACHE_ERRNOS and exc.errno != errno.EIO:
                raise
            log.warning("engine cache %s: lookup of %s failed (%s); a miss",
                        cache.directory, key, exc)
            cached = None
        damage = cache.damage(key)
        if cached is not None:
            with cached:
                try:
                    built, events = build_from_cache(cached, store, fingerprint,
                                                     verify=cache.hit_verify)
                except (ValueError, OSError) as exc:
                    # Bytes that are not what the record names (a second check behind
                    # the blob cache's seal), or an entry that cannot be read: a miss,
                    # never an exception and never served. Nothing was left staged.
                    log.warning("engine cache %s: %s; building it again", cache.directory, exc)
                    damage = f"the cached entry was damaged ({exc})"
                else:
                    _touch_structure(cache, fingerprint, refit, len(cached.entries))
                    if cache.remote is not None and tiered.pending(key):
                        log.info("engine cache %s: %s is cached here but not yet in the shared "
                                 "cache %s; publishing it", cache.directory, key,
                                 cache.remote.url)
                        published, why = _publish(cache, cached)
                        for e in events:
                            e.published, e.publish_reason = published, why
                    return built, events
        remote_why: str | None = None  # why this build cannot be published
        remote_reason: str | None = None  # why the tier's entry was not served
        downloaded: int | None = None  # the tier's structure entry's bytes, when refit from it
        if cache.remote is None:
            # Issue 46 item 4: new weights of a cached refittable structure are refit.
            refitted, refit_why = engine_refit.refit_cached(cache, fingerprint, refit, store)
        elif engine_refit.has_structure(cache, fingerprint, refit):
            # A local structure entry: refit (before the tier's full entry is asked), under
            # the full key's lease, as a build: its entry is published under it.
            entry, remote_why = tiered.claim(key, stack, timeout=cache.wait_timeout,
                                             on_wait=cache.on_wait)
            refitted, refit_why = engine_refit.refit_cached(cache, fingerprint, refit, store)
            if entry is not None:
                if refitted is None:  # the tier's entry, published meanwhile: served
                    served, remote_why, remote_reason, shared_damage = _served(
                        cache, key, tiered.take(key, entry, lambda: cache.lookup(key)),
                        store, fingerprint)
                    if served is not None:
                        return served
                    damage = shared_damage or damage
                else:
                    remote_why = TIER_HOLDS_IT
        else:
            refitted, refit_why = None, None
            served, remote_why, remote_reason, shared_damage = _from_tier(
                cache, key, store, fingerprint, stack)
            if served is not None:
                return served
            damage = shared_damage or damage
            if refit is not None and remote_why is None:
                # Issue 46 item 5: no build of it anywhere; the team's structure entry
                # (downloaded into the local cache) is refit, under the lease just taken.
                refitted, refit_why, downloaded = _refit_from_tier(cache, fingerprint, refit,
                                                                   store)
        if waited > 0.5 and refitted is None:
            log.info("engine cache %s: waited %.1f s for another build of %s, which did not "
                     "cache it; building it here", cache.directory, waited, key)
        # Issue 46 item 6: what differs from the closest cached build (metadata only);
        # a damaged entry of this very key says why itself (the rebuild's reason).
        because = _missed_because(cache, key, fingerprint) if damage is None else None
        timing = None
        if refitted is not None:
            built = refitted.built
        else:
            built, timing = timing_cache.build_warm(cache, build, settings)
        reserve = 0
        link = False
        if _same_filesystem(cache.directory, Path(store.directory)) and \
                not _clones(built.engines, cache.directory):
            # No clone (ext4): a copy into the cache and the save's insert or move
            # would write 1.5 copies more. The cache takes the staged engines by hard
            # link instead (0 bytes), and the save copies them once from its files:
            # the build's copy and the program's, the floor (issue 42 item 5).
            reserve = save_reserve(built.engines)
            link = True
        try:
            # A refit's record says which structure it was refit from.
            extra = {"refit_from": refitted.structure} if refitted is not None else None
            results = cache.put_build(key, built, fingerprint, reserve=reserve, consume=link,
                                      record_extra=extra)
        except Exception as exc:  # the cache is an optimisation: never the export's failure
            log.warning("engine cache %s: the build %s was not cached: %s",
                        cache.directory, key, exc)
            results = [PutResult(key=key, stored=False, size=0,
                                 reason=f"{type(exc).__name__}: {exc}")]
        complete = len(results) == len(built.engines) + 1 and all(r.stored for r in results)
        kept = None
        if refitted is None and refit is not None:
            kept = engine_refit.keep_structure(cache, key, built, fingerprint, refit,
                                               reserve=reserve)
        _touch_structure(cache, fingerprint, refit, len(built.engines))
        published: bool | None = None
        publish_reason: str | None = None
        if cache.remote is not None:
            # Under the lease still (the stack releases it after this): waiters see the
            # entry appear before the lease goes.
            if complete and remote_why != TIER_HOLDS_IT:
                tiered.mark_pending(key)  # until the tier holds an entry for it
            if remote_why is not None:
                published, publish_reason = False, remote_why
            elif built.record is None:
                published, publish_reason = False, "the build has no record to publish"
            elif complete:
                published, publish_reason = _publish(cache, None, key=key)
            else:
                published, publish_reason = _publish(cache, None, key=key, staged=(
                    built, fingerprint))
            if isinstance(kept, list) and remote_why is None:
                # The structure entry kept now, for the team's fine-tunes (first writer
                # wins; a damaged or refused one there is replaced).
                _publish_structure(cache, engine_refit.structure_key(fingerprint))
    why = next((r.reason for r in results if r.skipped), None)
    events = []
    made = "refit" if refitted is not None else "built"
    for i, engine in enumerate(built.engines):
        r = results[i] if i < len(results) else None
        events.append(EngineCacheEvent(
            engine.engine_id, engine_key.engine_key(key, i), engine.blob.size,
            "refit" if refitted is not None else "miss",
            r.placement if r is not None and r.stored else None, complete,
            "; ".join(filter(None, [refit_why and f"{refit_why}; built instead",
                                    damage and f"rebuilt: {damage}",
                                    None if complete else why or "not cached"])) or None,
            None, published, publish_reason, remote_reason, because,
            refitted.written[i] if refitted is not None else None,
            refitted.seconds[i] if refitted is not None else None))
        if timing is not None:
            events[-1].timing_cache = timing.line()
        if downloaded is not None:  # the structure entry's download, on the first engine
            events[-1].downloaded = downloaded if i == 0 else 0
        if complete:
            log.info("engine cache %s: engine %s of %s %s and cached (%s)",
                     cache.directory, engine.engine_id, key, made, r.placement)
        else:
            log.warning("engine cache %s: engine %s of %s %s and not cached: %s",
                        cache.directory, engine.engine_id, key, made, why)
    return built, events


def _touch_structure(cache: EngineCache, fingerprint: str, refit: RefitSource | None,
                     engines: int) -> None:
    """The structure entry of a refittable build just used or cached, made more recent
    than it: a tight bound evicts the full entries before the structure entry their
    fine-tunes refit from (the structure entry goes once none of them is used)."""
    from trtet_store.export import engine_refit

    skey = engine_refit.structure_key(fingerprint) if refit is not None else None
    if skey is not None:
        cache.touch_build(skey, engines)


def _missed_because(cache: EngineCache, key: str, fingerprint: str) -> str | None:
    """Why ``key`` missed (:func:`engine_key.missed_because`); None when the cache can't say."""
    try:
        return engine_key.missed_because(cache.entries(), key, fingerprint)
    except OSError as exc:
        log.warning("engine cache %s: cannot say why %s missed: %s", cache.directory, key, exc)
        return None


def _from_tier(cache: EngineCache, key: str, store: BlobStore, fingerprint: str,
               stack: contextlib.ExitStack,
               ) -> tuple[tuple[BuildResult, list[EngineCacheEvent]] | None, str | None,
                          str | None, str | None]:
    """A local miss asks the tier: ``(served, why not publishable, why the tier's entry
    was not served, the shared entry's damage)``; a lease taken is released by ``stack``."""
    from trtet_store.export import remote_miss

    def no_room(entry: RemoteEntry, exc: BaseException) -> None:
        # No room for the download: none for the build either, when the entry's own
        # sizes say so (refused now, not after hours of building).
        remote_miss.refuse_build_without_room(key, entry, Path(store.directory), exc)

    got = cache.tiered.get(key, local=lambda: cache.lookup(key),
                           no_room=no_room)
    if got.outcome is not None and got.outcome.action == "miss" and got.entry is None:
        # No entry: claim the key's lease; one another machine publishes while we wait
        # is taken as a remote hit.
        entry, why = cache.tiered.claim(key, stack, timeout=cache.wait_timeout,
                                        on_wait=cache.on_wait)
        if entry is None:
            return None, why, None, None
        got = cache.tiered.take(key, entry, lambda: cache.lookup(key),
                                no_room=no_room)
    return _served(cache, key, got, store, fingerprint)


def _refit_from_tier(cache: EngineCache, fingerprint: str, refit: RefitSource,
                     store: BlobStore) -> tuple[Any, str | None, int | None]:
    """The tier's structure entry of ``fingerprint`` downloaded and refit from:
    ``(refitted or None, why not, bytes downloaded or None)``.

    The entry is checked as a build's is (signature, :func:`.engine_key.entry_problem`,
    each file verified as it arrives) and entered into the local cache, so the
    next fine-tune refits from it with no download. A damaged, refused or not
    accepted entry is never refit from (the reason is said), and the build that
    follows replaces it (:attr:`TieredCache.replace`); so is one whose refit failed.
    """
    from trtet_store.export import engine_refit

    skey = engine_refit.structure_key(fingerprint)
    if skey is None:
        return None, None, None
    kind = engine_refit.STRUCTURE_KIND
    got = cache.tiered.get(skey, local=lambda: cache.lookup(skey, kind=kind))
    outcome = got.outcome
    downloaded = outcome.downloaded if outcome is not None and outcome.action == "hit" else None
    if got.hit is None and got.download is None:
        if outcome is None or (outcome.action == "miss" and got.entry is None):
            return None, None, None  # no structure entry on the tier either: a build
        why = got.why or outcome.reason
        log.warning("engine cache %s: the shared structure entry %s is not refit from: %s; "
                    "building it", cache.directory, skey, why)
        return None, f"the shared structure entry {skey} was not used ({why})", downloaded
    try:
        structure = got.hit if got.hit is not None else Unplaced(got.download, cache.blobs)
    except OSError as exc:
        if got.download is not None:
            got.download.close()
        return None, f"the shared structure entry {skey} was not used ({exc})", downloaded
    refitted, why = engine_refit.refit_cached(cache, fingerprint, refit, store,
                                              structure=structure)
    if refitted is None and got.entry is not None:
        cache.tiered.replace[skey] = got.entry  # the build's structure entry replaces it
    if why is not None:
        why = f"{why} (the shared structure entry)"
    return refitted, why, downloaded


def _publish_structure(cache: EngineCache, skey: str | None) -> None:
    """Publish the local structure entry ``skey`` (first writer wins); never raises."""
    from trtet_store.export import engine_refit

    if skey is None:
        return
    try:
        cached = cache.lookup(skey, kind=engine_refit.STRUCTURE_KIND)
    except OSError as exc:
        log.warning("engine cache %s: the structure entry %s is not published (%s)",
                    cache.directory, skey, exc)
        return
    if cached is None:
        return
    with cached:
        cache.tiered.publish(cached.key, *tier_files(cached))


def _served(cache: EngineCache, key: str, got: TierGet, store: BlobStore, fingerprint: str,
            ) -> tuple[tuple[BuildResult, list[EngineCacheEvent]] | None, str | None,
                       str | None, str | None]:
    """The tier's answer made a remote hit, or why it is a miss (see :func:`_from_tier`)."""
    outcome = got.outcome
    reason = outcome.reason if outcome is not None and outcome.action == "miss" else None
    damage = None
    if reason is not None and reason.startswith("damaged: "):
        damage = f"the shared cache's entry was damaged ({reason.removeprefix('damaged: ')})"
    if got.hit is None and got.download is None:
        if got.why is not None:
            log.warning("engine cache %s: the shared entry %s is not usable here: %s; "
                        "building it", cache.directory, key, got.why)
            reason = got.why
        if outcome is not None and outcome.action == "miss" and got.entry is None:
            reason = None  # nothing there: nothing to say
        return None, got.unpublishable, reason, damage
    try:
        cached = got.hit if got.hit is not None else Unplaced(got.download, cache.blobs)
    except OSError as exc:
        if got.download is not None:
            got.download.close()
        return None, None, f"{got.why}; and {exc}", None
    downloaded = outcome.downloaded if outcome is not None else 0
    with cached:
        try:
            built, events = build_from_cache(cached, store, fingerprint, verify=cache.hit_verify)
        except (ValueError, OSError) as exc:
            log.warning("engine cache %s: %s; building it again", cache.directory, exc)
            if isinstance(exc, UnsafeRecordError):
                # Never loaded, and never again: out of the local cache, and replaced in
                # the tier (If-Match that entry) by the build that follows.
                if got.entry is not None:
                    cache.tiered.replace[key] = got.entry
                if got.hit is not None:
                    cache.drop_build(key, len(cached.entries), exc.problem)
            return None, None, str(exc), None
    for i, e in enumerate(events):
        e.outcome = "remote-hit"
        e.downloaded = downloaded if i == 0 else 0
        if got.why is not None:
            e.stored, e.reason = False, got.why
    return (built, events), None, None, None


def _publish(cache: EngineCache, cached: CachedBuild | None, *, key: str | None = None,
             staged: tuple[BuildResult, str] | None = None) -> tuple[bool, str | None]:
    """Publish a build (first writer wins): cached here (pinned files) or only staged."""
    tiered = cache.tiered
    if staged is not None:
        built, fingerprint = staged
        engine_meta, record_meta = engine_key.metadata(key, built, fingerprint,
                                                       engine_cache.compute_capability())
        record = built.record
        files = [("record", Path(record.path), record.digest)]
        files += [(f"e{i}", Path(e.blob.path), e.blob.digest)
                  for i, e in enumerate(built.engines)]
        outcome, _ = tiered.publish(key, files, {"record": record_meta, "engines": engine_meta})
    else:
        if cached is None:
            cached = cache.lookup(key)
            if cached is None:
                exc = OSError(errno.ENOENT, f"the build {key} left the local cache at once")
                return False, tiered.failed("publish", key, exc)
        with cached:
            outcome, _ = tiered.publish(cached.key, *tier_files(cached))
    return outcome.action == "published", outcome.reason
