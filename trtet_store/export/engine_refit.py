"""New weights, same engine: a refit from the engine cache's structure entry (issue 46).

A build whose settings make a refittable engine (:func:`~.tensorrt.refittable`:
``immutable_weights=False`` and not ``refit_identical_engine_weights=True``)
is kept twice in the engine cache: under its full key (a clone on the next
identical export) and under its *structure key*
``trt-s-<structure>-<capability>`` (every part of the key but the weight
bytes, :attr:`~.engine_reuse.KeyParts.structure`), as a *structure entry*:
the refittable engines (``<skey>.e<i>``) and a record (``<skey>``, kind
:data:`STRUCTURE_KIND`) holding the program with its engine placeholders and
what a refit needs (each engine's id, state and outputs, the settings that
made it refittable, whether it is weight-stripped).

The policy of an export (:func:`~.engine_build.build_cached` calls this module):

1. a full-key hit: clone, as before;
2. else a structure entry of a refittable build: refit each engine from the
   export's weights (:func:`~.tensorrt.refit_engine`, streamed into the
   staging store through its digesting writer: no second copy, no re-read),
   check it (:func:`~.tensorrt.check_refit`), and cache the result under the
   full key, so the next identical export is a clone (where the cache cannot
   clone, by hard link, the save then copying from the cache's file, as a
   build's engines: :meth:`~.engine_cache.EngineCache.put_build`);
3. else build (and keep the structure entry when the settings allow a refit).

All of it runs under the full key's single-flight claim, the one a build
runs under: eight processes exporting one fine-tune make one refit, and the
seven others hit the full key it cached. A refit that raises, or whose
engine fails its check, is dropped (its staged engine released) and the
export builds, with the reason in its events. A kill during a refit leaves a
staging ``.part`` file that the next open of the store removes, and nothing
under the full key (the put comes after the refit): the next run refits.

What is never refit: an engine built with immutable weights (no structure
entry is kept, and an export with such settings never refits) or with
``refit_identical_engine_weights=True`` (TensorRT calls a refit with other
weights "unpredictable"); a structure whose program keeps weights outside
its engines (a partial compile's CPU operators: those weights would be the
old ones; such a build keeps no structure entry).

Stripping: a structure entry holds the engine as built. Where Torch-TensorRT
strips it (``strip_engine_weights=True``: serialized with ``EXCLUDE_WEIGHTS``)
it is the stripped engine; otherwise it is the same bytes as the full entry's
engine, which the blob cache stores once (a ``dedup`` put: no byte on disk),
so stripping it again would cost a file, not save one. The stub never strips
(its engines are random bytes). The record says which (``stripped``); the
real refit needs no weight name map (Torch-TensorRT >= #4342 rebuilds the
mapping from the program), so none is kept.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtet_store.export import engine_key
from trtet_store.export.engine_key import ENGINE_KIND

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.cache import PutResult
    from trtet_store.export.engine_cache import EngineCache
    from trtet_store.export.engine_record import CachedBuild
    from trtet_store.export.tensorrt import BuildResult
    from trtet_store.io import BlobStore

__all__ = ["STRUCTURE_KIND", "Refitted", "RefitSource", "has_structure", "keep_structure",
           "refit_cached", "source", "structure_key", "structure_uses"]

log = logging.getLogger("trtet_store.engine_cache")

#: The record kind of a structure entry (a build's is :data:`~.engine_key.RECORD_KIND`).
STRUCTURE_KIND = engine_key.STRUCTURE_RECORD_KIND

#: The settings that decide whether (and how) a build's engine may be refit.
REFIT_SETTINGS = ("immutable_weights", "refit_identical_engine_weights", "strip_engine_weights")


@dataclass(frozen=True)
class RefitSource:
    """What a refit of one method's build needs: its program (the new weights), inputs, settings."""

    program: ExportedProgram
    args: tuple
    kwargs: dict | None
    settings: dict[str, Any]


@dataclass
class Refitted:
    """A refit's build (staged engines, program, record) and what it cost."""

    built: BuildResult
    written: list[int]  # bytes each engine's refit wrote into the staging store
    seconds: list[float]  # seconds each engine's refit took
    structure: str  # the structure key it was refit from


def source(program: ExportedProgram, args: tuple, kwargs: dict | None,
           settings: dict[str, Any]) -> RefitSource | None:
    """The refit source of a method, or None when its settings make no refittable engine."""
    from trtet_store.export import tensorrt

    if not tensorrt.refittable(settings):
        return None
    return RefitSource(program, tuple(args), dict(kwargs or {}), dict(settings))


def structure_key(fingerprint: str, capability: str | None = None) -> str | None:
    """``trt-s-<structure>-<capability>`` of the build ``fingerprint``; None when this
    process did not compute its key parts (:func:`~.engine_reuse.key_parts_of`)."""
    from trtet_store.export import engine_cache, engine_reuse

    parts = engine_reuse.key_parts_of(fingerprint)
    if parts is None:
        return None
    return f"{engine_key.STRUCTURE_PREFIX}{parts.structure}-" \
        f"{capability or engine_cache.compute_capability()}"


def _weights_outside_engines(program: ExportedProgram) -> bool:
    import torch

    return any(isinstance(v, torch.Tensor)
               for v in (*program.state_dict.values(), *program.constants.values()))


def _refuse(record_meta: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """Why the structure entry ``record_meta`` must not be refit for these settings."""
    from trtet_store.export import tensorrt

    if not tensorrt.refittable(settings):
        return "the export's settings make no refittable engine"
    refit = record_meta.get("refit")
    if not isinstance(refit, dict) or refit.get("refittable") is not True or \
            not tensorrt.refittable(refit.get("settings") or {}):
        return "the structure entry is not a refittable build"
    return None


def structure_uses(entries: Any) -> dict[str, list[str]]:
    """Each structure entry of ``entries`` (the cache's, metadata only) and the full
    entries that came from it: the build it was kept from (``built_as``), then the
    refits (``refit_from``), those still cached. A full entry never needs its
    structure entry to be served (its engines are its own): this is what
    ``cache list`` shows and what ``cache prune`` says when it drops one."""
    entries = list(entries)
    builds = {e.key for e in entries if e.metadata.get("kind") == engine_key.RECORD_KIND}
    uses: dict[str, list[str]] = {}
    for e in entries:
        if e.metadata.get("kind") == STRUCTURE_KIND:
            built_as = e.metadata.get("built_as")
            uses.setdefault(e.key, []).extend([built_as] if built_as in builds else [])
    for e in entries:
        source = e.metadata.get("refit_from")
        if e.key in builds and isinstance(source, str):
            uses.setdefault(source, []).append(e.key)
    return uses


# -- keeping a structure entry ------------------------------------------------------------

def keep_structure(cache: EngineCache, key: str, built: BuildResult, fingerprint: str,
                   refit: RefitSource, *, reserve: int = 0) -> list[PutResult] | str:
    """Cache ``built`` (a refittable build just made) under its structure key.

    Skipped (a string says why) when the build is not refittable, its program
    keeps weights outside its engines, or the structure key already has an
    entry (the first build of a structure is the one every fine-tune refits
    from). Under the structure key's single-flight lock (taken inside the
    full key's: the order is always full, then structure). Never raises for
    a cache problem: it is logged, and the string says it.
    """
    from trtet_store.export import engine_cache, tensorrt

    skey = structure_key(fingerprint)
    if skey is None or not tensorrt.refittable(refit.settings):
        return "not a refittable build"
    if built.record is None:
        return "the build has no record"
    if _weights_outside_engines(built.exported_program):
        return "its program keeps weights outside its engines (a refit would leave them stale)"
    try:
        with cache.single_flight(skey):
            there = cache.lookup(skey, kind=STRUCTURE_KIND)
            if there is not None:
                there.close()
                return f"the structure entry {skey} is cached already"
            blobs = cache.blobs
            if reserve:  # a view with a higher floor (see EngineCache.put_build)
                blobs = copy.copy(cache.blobs)
                blobs.min_free = cache.blobs.min_free + reserve
            engine_meta, record_meta = engine_key.metadata(
                skey, built, fingerprint, engine_cache.compute_capability())
            settings = {k: refit.settings[k] for k in REFIT_SETTINGS if k in refit.settings}
            record_meta = {**record_meta, "kind": STRUCTURE_KIND, "built_as": key, "refit": {
                "refittable": True, "settings": settings,
                "stripped": refit.settings.get("strip_engine_weights", False) is True}}
            results = []
            for i, engine in enumerate(built.engines):
                result = blobs.put(engine_key.engine_key(skey, i), engine.blob,
                                   {**engine_meta[i], "kind": ENGINE_KIND, "structure": skey})
                results.append(result)
                if result.skipped:
                    return results
            results.append(blobs.put(skey, built.record, record_meta))
    except Exception as exc:  # the cache is an optimisation: never the export's failure
        log.warning("engine cache %s: the structure entry %s was not cached: %s",
                    cache.directory, skey, exc)
        return f"{type(exc).__name__}: {exc}"
    log.info("engine cache %s: %s kept as the structure entry %s (refittable)",
             cache.directory, key, skey)
    return results


# -- a refit --------------------------------------------------------------------------------

def has_structure(cache: EngineCache, fingerprint: str, refit: RefitSource | None) -> bool:
    """Whether the local cache holds a structure entry a refit of ``fingerprint`` would try."""
    skey = structure_key(fingerprint) if refit is not None else None
    if skey is None:
        return False
    try:
        structure = cache.lookup(skey, kind=STRUCTURE_KIND)
    except OSError:
        return False
    if structure is None:
        return False
    structure.close()
    return True


def refit_cached(cache: EngineCache, fingerprint: str, refit: RefitSource | None,
                 store: BlobStore, *, structure: CachedBuild | None = None,
                 ) -> tuple[Refitted | None, str | None]:
    """The build of ``fingerprint`` refit from its structure entry: ``(refitted, why not)``.

    ``(None, None)``: no structure entry to refit from (a plain miss).
    ``(None, why)``: there was one, and the refit was refused or failed
    (raised, or its engine failed :func:`~.tensorrt.check_refit`); nothing
    it wrote is left staged, and the structure entry is dropped from the
    local cache (every later fine-tune would fail the same way: the build
    that follows keeps a fresh one). The caller holds the full key's
    single-flight claim and puts the result under the full key.

    ``structure``: the entry to refit from (a shared tier's download the
    local cache did not take, closed here); default: the local cache's.
    """
    if refit is None:
        return None, None
    skey = structure_key(fingerprint)
    if skey is None:
        return None, None
    if structure is None:
        try:
            structure = cache.lookup(skey, kind=STRUCTURE_KIND)
        except OSError as exc:
            log.warning("engine cache %s: lookup of %s failed (%s); no refit",
                        cache.directory, skey, exc)
            return None, None
    if structure is None:
        return None, None
    with structure:
        why = _refuse(structure.record.metadata, refit.settings)
        if why is not None:
            log.warning("engine cache %s: %s not refit from %s: %s; building it",
                        cache.directory, fingerprint, skey, why)
            return None, f"not refit: {why}"
        try:
            return _refit(structure, store, fingerprint, refit, skey), None
        except Exception as exc:
            from trtet_store.io import InsufficientSpaceError

            if isinstance(exc, InsufficientSpaceError):
                raise  # no room for the refit's engine: none for a build's either
            log.warning("engine cache %s: the refit of %s from %s failed (%s: %s); building it",
                        cache.directory, fingerprint, skey, type(exc).__name__, exc)
            why = f"refit failed: {type(exc).__name__}: {exc}"
    # A structure entry whose refit failed fails every fine-tune of it: dropped, so the
    # next export builds at once and the build keeps a fresh one (after the hits closed).
    if cache.drop_build(skey, len(structure.entries), why):
        why += f"; the structure entry {skey} was dropped"
    return None, why


def _refit(structure: CachedBuild, store: BlobStore, fingerprint: str, refit: RefitSource,
           skey: str) -> Refitted:
    """Refit every engine of ``structure`` into ``store``; released again on any failure."""
    import torch

    from trtet_store.export import engine_reuse, tensorrt

    tagging = engine_reuse._TaggingStore(store, fingerprint)
    engines: list[tensorrt.Engine] = []
    blobs: list[Any] = []
    written: list[int] = []
    seconds: list[float] = []
    try:
        # The record first: one that is not data (record_check) is refused before any refit.
        program = structure.exported_program()
        for i, (entry, hit) in enumerate(zip(structure.entries, structure.engines,
                                             strict=True)):
            start = time.monotonic()
            with tagging.writer() as w:
                tensorrt.refit_engine(hit.path, refit.program, refit.args, refit.kwargs,
                                      refit.settings, w)
            blob = w.blob
            blobs.append(blob)
            problem = tensorrt.check_refit(blob.path, refit.program)
            if problem is not None:
                raise tensorrt.RefitError(f"engine {i}'s refit fails its check: {problem}")
            seconds.append(time.monotonic() - start)
            written.append(blob.size)
            engines.append(tensorrt.register_engine(
                blob, engine_reuse.entry_state(entry),
                [(tuple(shape), getattr(torch, dtype)) for shape, dtype in entry["outputs"]],
                engine_id=entry["engine_id"]))
        built = tensorrt.BuildResult(program, engines)
        built.record = engine_reuse._record(store, fingerprint, built)
    except BaseException:
        tensorrt.unregister_engines(engines)
        for blob in blobs:
            blob.close()
        raise
    for i, engine in enumerate(engines):
        log.info("engine %s refit from %s engine %d (%d bytes, %.2f s), not built",
                 engine.engine_id, skey, i, written[i], seconds[i])
    return Refitted(built, written, seconds, skey)
