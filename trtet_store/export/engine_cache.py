"""EngineCache: TensorRT builds kept across processes, on :class:`trtet_store.cache.BlobCache`.

What an engine key is lives here (``cache/`` knows no TensorRT). A build is
cached as entries of one :class:`~trtet_store.cache.BlobCache`:

- ``<build key>.e<i>``: engine ``i``'s serialized bytes, raw (no pickle);
- ``<build key>``: the build record, written last (the entry that makes a
  build a hit): the program with its engine placeholders
  (``torch.export.save``) as the blob, and in its metadata each engine's
  id, digest, size, state and output specs (what
  :mod:`~trtet_store.export.engine_reuse` records), the fingerprint, the
  versions and the compute capability.

The build key is ``trt-<fingerprint>-<capability>``: ``fingerprint`` is
:func:`engine_reuse.build_fingerprint` (graph, range constraints, weights,
input specs, settings, torch / Torch-TensorRT / TensorRT versions, GPU name),
``capability`` is :func:`compute_capability` (``sm_90``, or ``no-gpu``).
Identical engine bytes of two builds are stored once (the blob cache is
content addressed).

Public API (stable; the CLI, the Torch-TensorRT adapter and the benchmark use it)::

    compute_capability() -> str                       # "sm_<major><minor>" or "no-gpu"
    build_key(fingerprint: str, capability: str | None = None) -> str

    class EngineCache:
        def __init__(self, directory: PathLike | str | None = None, *,
                     max_bytes: int = DEFAULT_MAX_BYTES,
                     min_free: int = DEFAULT_MIN_FREE) -> None
        directory: Path; max_bytes: int; min_free: int; blobs: BlobCache
        def key(self, fingerprint: str) -> str        # build_key with this GPU
        def lookup(self, key: str) -> CachedBuild | None        # pinned, complete, checked
        def put_build(self, key: str, built: BuildResult, fingerprint: str, *,
                      reserve: int = 0) -> list[PutResult]      # engines, then the record
        def single_flight(self, key: str, *, timeout: float | None = None)
            -> ContextManager[Claim]                   # one builder per key, across processes
        def entries(self) -> list[EntryInfo]; def stats(self) -> CacheStats
        def prune(self, max_bytes: int | None = None) -> list[str]
        def verify(self) -> VerifyReport; def clear(self) -> list[str]
        def recover(self) -> list[Path]

    class CachedBuild:                                 # a hit: every entry pinned until close()
        key: str; record: Hit; engines: list[Hit]; entries: list[dict]
        def exported_program(self) -> ExportedProgram
        def close(self) -> None                        # also a context manager

    @dataclass class EngineCacheEvent:                 # one per engine, in the export's report
        engine_id: str; key: str; size: int; outcome: "hit" | "miss"
        placement: str | None   # hit: "clone" | "copy" (cache -> staging);
                                # miss: the cache put's placement ("clone", "copy", "dedup")
        stored: bool | None; reason: str | None

``compile_and_save(..., engine_cache=cache)`` and ``export(...,
engine_cache=cache)`` take an :class:`EngineCache` (``True``: the default
one). A hit skips the build: each engine is cloned from the cache into the
staging store where the two share a reflink filesystem (no engine byte
written) and copied elsewhere, and the save then moves or clones it into the
program as always; the cache keeps its entry. A miss builds, and the new
engines enter the cache before the consuming save (``put`` without consume:
a clone where it can). Where the cache shares the staging filesystem, the
cache's copy must leave the save its room: each put keeps ``min_free`` plus
:func:`save_reserve` free (the most the save can need: every engine's bytes,
or the writer's 64 MiB move budget, plus 2 MiB), or is skipped with that
reason. A cache that cannot take an entry never fails the export.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.cache import (
    BlobCache,
    CacheStats,
    Claim,
    EntryInfo,
    Hit,
    PutResult,
    VerifyReport,
)
from trtet_store.io import clone_range
from trtet_store.io.units import GiB, MiB

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.export.tensorrt import BuildResult
    from trtet_store.io import Blob, BlobStore

log = logging.getLogger("trtet_store.engine_cache")

#: The default bound: what Torch-TensorRT's DiskEngineCache allows (5 GB) is two
#: engines of a 7B model; ours defaults to 20 GiB of distinct engine bytes.
DEFAULT_MAX_BYTES = 20 * GiB
#: Kept free on the cache's filesystem by default: the cache never fills a disk.
DEFAULT_MIN_FREE = 1 * GiB

ENGINE_KIND = "trtet_store.tensorrt.engine"
RECORD_KIND = "trtet_store.tensorrt.build"
NO_GPU = "no-gpu"

# clone_range "not here" errors (the copy follows).
# What a cache directory can answer that means "no cache here now", never a failed export.
_CACHE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                           errno.EDQUOT})
_NO_CLONE = frozenset({errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL,
                       errno.ENOSYS, errno.EPERM, errno.EBADF})


def compute_capability() -> str:
    """The GPU's compute capability as ``sm_<major><minor>`` (device 0), or ``"no-gpu"``.

    Part of every key: an engine is built for one GPU architecture, and a
    cache shared between machines must never hand it to another.
    """
    import torch

    if not torch.cuda.is_available():
        return NO_GPU
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def build_key(fingerprint: str, capability: str | None = None) -> str:
    """The cache key of a build: ``trt-<fingerprint>-<capability>``."""
    if capability is None:
        capability = compute_capability()
    return f"trt-{fingerprint}-{capability}"


def _engine_key(key: str, index: int) -> str:
    return f"{key}.e{index}"


@dataclass
class EngineCacheEvent:
    """What the cache did for one engine of an export (in its report and log).

    ``outcome`` is ``"hit"`` (not built: taken from the cache) or ``"miss"``
    (built). For a hit, ``placement`` is how the cached engine reached the
    staging store: ``"clone"`` (shared extents, no byte written) or
    ``"copy"``. For a miss, ``stored`` says whether the cache took it, with
    the put's ``placement`` (``"clone"``, ``"copy"``, ``"link"``, ``"dedup"``)
    or the ``reason`` it was skipped.
    """

    engine_id: str
    key: str
    size: int
    outcome: str
    placement: str | None = None
    stored: bool | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CachedBuild:
    """A complete cached build, every entry pinned (never evicted) until :meth:`close`.

    Attributes
    ----------
    key : str
        The build key.
    record : Hit
        The build record's entry (the program with its placeholders).
    engines : list of Hit
        Engine ``i``'s entry, in the record's order.
    entries : list of dict
        The record's engine entries: ``engine_id``, ``digest``, ``size``,
        ``state``, ``outputs``.
    """

    def __init__(self, key: str, record: Hit, engines: list[Hit]) -> None:
        self.key = key
        self.record = record
        self.engines = engines
        self.entries: list[dict[str, Any]] = list(record.metadata.get("engines", []))

    def exported_program(self) -> ExportedProgram:
        """The recorded program, its engine nodes naming the recorded engine ids."""
        import torch

        with open(self.record.path, "rb") as f:
            return torch.export.load(f)

    def close(self) -> None:
        for hit in (self.record, *self.engines):
            hit.close()

    def __enter__(self) -> CachedBuild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineCache:
    """A persistent, per-user cache of TensorRT builds: one build per key for the whole machine.

    Parameters
    ----------
    directory : path-like, optional
        Default ``$XDG_CACHE_HOME/trtet_store/engines`` (else
        ``~/.cache/trtet_store/engines``), mode 0700. A directory, or a file in
        it, owned by another user or writable by others is refused with
        ``PermissionError``. On a read-only filesystem the cache serves hits
        and skips every put (with the reason).
    max_bytes : int
        Bound on the distinct cached bytes (engines and records); least
        recently used entries are evicted to stay within it. Positive: to
        cache nothing, pass no cache.
    min_free : int
        Bytes every put leaves free on the cache's filesystem.

    Raises
    ------
    PermissionError
        The directory (or a file in it) is another user's, or writable by others.
    ValueError, TypeError
        ``max_bytes`` not a positive int, ``min_free`` negative.
    OSError
        The directory cannot be created (read-only parent): the message says so.
    """

    def __init__(self, directory: os.PathLike | str | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, min_free: int = DEFAULT_MIN_FREE) -> None:
        self.blobs = BlobCache(directory, max_bytes=max_bytes, min_free=min_free)

    @property
    def directory(self) -> Path:
        return self.blobs.directory

    @property
    def max_bytes(self) -> int:
        return self.blobs.max_bytes

    @property
    def min_free(self) -> int:
        return self.blobs.min_free

    def key(self, fingerprint: str) -> str:
        """The key of the build ``fingerprint`` on this machine's GPU (:func:`build_key`)."""
        return build_key(fingerprint)

    # -- hits ---------------------------------------------------------------------

    def lookup(self, key: str) -> CachedBuild | None:
        """The complete build under ``key``, every entry pinned and checked, or None.

        A record whose engines are missing, or whose engine entries hold other
        bytes than it recorded (size, digest), is a miss: never served.
        Damaged blobs are dropped by the blob cache (logged); the build is
        then rebuilt and put again.
        """
        record = self.blobs.get(key)
        if record is None:
            return None
        engines: list[Hit] = []
        try:
            meta = record.metadata
            wanted = meta.get("engines")
            if meta.get("kind") != RECORD_KIND or not isinstance(wanted, list):
                log.warning("engine cache %s: entry %s is not a build record; a miss",
                            self.directory, key)
                record.close()
                return None
            for i, entry in enumerate(wanted):
                hit = self.blobs.get(_engine_key(key, i))
                if hit is None:
                    log.warning("engine cache %s: engine %d of %s is gone (evicted or "
                                "damaged); the build is a miss", self.directory, i, key)
                    break
                engines.append(hit)
                if (hit.size, hit.digest) != (entry.get("size"), entry.get("digest")):
                    log.warning("engine cache %s: engine %d of %s holds other bytes than its "
                                "record names (%s bytes, digest %s; recorded %s, %s); a miss",
                                self.directory, i, key, hit.size, hit.digest,
                                entry.get("size"), entry.get("digest"))
                    break
            else:
                return CachedBuild(key, record, engines)
        except BaseException:
            for hit in (record, *engines):
                hit.close()
            raise
        for hit in (record, *engines):
            hit.close()
        return None

    # -- puts ---------------------------------------------------------------------

    def put_build(self, key: str, built: BuildResult, fingerprint: str, *,
                  reserve: int = 0) -> list[PutResult]:
        """Cache ``built``'s engines, then its record (the commit point of the build).

        Nothing is consumed: each staged engine is cloned into the cache where
        the filesystems allow, else copied. ``reserve`` bytes are kept free on
        top of ``min_free`` (the room the save still needs). A skipped engine
        skips the record (a record names every engine). Never raises for a
        bound, space or permission problem: the results say why.

        Returns
        -------
        list of PutResult
            One per engine, then the record's (when the engines were stored).
        """
        from trtet_store.export import engine_reuse

        cache = self.blobs
        if reserve:
            # A view with a higher floor, so that the cache's copy never takes the
            # save's room; the shared object is left as it is (other threads use it).
            cache = copy.copy(self.blobs)
            cache.min_free = self.blobs.min_free + reserve
        capability = compute_capability()
        results: list[PutResult] = []
        for i, engine in enumerate(built.engines):
            result = cache.put(_engine_key(key, i), engine.blob, {
                "kind": ENGINE_KIND, "build": key, "engine_id": engine.engine_id,
                "compute_capability": capability})
            results.append(result)
            if result.skipped:
                return results
        if built.record is None:
            return results
        results.append(cache.put(key, built.record, {
            "kind": RECORD_KIND, "fingerprint": fingerprint, "compute_capability": capability,
            "versions": [list(v) for v in engine_reuse.build_versions()],
            "engines": [engine_reuse._engine_entry(e) for e in built.engines]}))  # noqa: SLF001
        return results

    # -- single flight and maintenance -----------------------------------------------

    def single_flight(self, key: str, *, timeout: float | None = None
                      ) -> contextlib.AbstractContextManager[Claim]:
        """One builder of ``key`` at a time, across processes (:meth:`BlobCache.single_flight`)."""
        return self.blobs.single_flight(key, timeout=timeout)

    def entries(self) -> list[EntryInfo]:
        return self.blobs.entries()

    def stats(self) -> CacheStats:
        return self.blobs.stats()

    def prune(self, max_bytes: int | None = None) -> list[str]:
        return self.blobs.prune(max_bytes)

    def verify(self) -> VerifyReport:
        return self.blobs.verify()

    def clear(self) -> list[str]:
        return self.blobs.clear()

    def recover(self) -> list[Path]:
        return self.blobs.recover()

    def for_torch_tensorrt(self, **kwargs: Any) -> Any:
        """This cache as Torch-TensorRT's ``custom_engine_cache=``; see
        :func:`trtet_store.export.trt_engine_cache.for_torch_tensorrt` for ``kwargs``."""
        from trtet_store.export.trt_engine_cache import for_torch_tensorrt

        return for_torch_tensorrt(self, **kwargs)

    def __repr__(self) -> str:
        return f"EngineCache({os.fspath(self.directory)!r}, max_bytes={self.max_bytes})"


def resolve(engine_cache: EngineCache | bool | None) -> EngineCache | None:
    """``engine_cache=`` as the export functions take it: a cache, True (the default), or off."""
    if engine_cache is None or engine_cache is False:
        return None
    if engine_cache is True:
        return EngineCache()
    if isinstance(engine_cache, EngineCache):
        return engine_cache
    raise TypeError(f"engine_cache must be an EngineCache, True (the default cache) or "
                    f"None/False, got {type(engine_cache).__name__}")


# -- export's side: a hit becomes staged engines, a miss enters the cache -----------------

def stage_hit(store: BlobStore, hit: Hit, metadata: dict[str, Any]) -> tuple[Blob, str]:
    """A staged blob holding ``hit``'s bytes: cloned where the filesystem allows, else copied.

    Written as a ``.blob.part`` of ``store``'s own token (so a kill mid-copy
    leaves what the next open of the store removes), then adopted by rename,
    never given back anywhere. Returns the blob and ``"clone"`` or ``"copy"``.
    """
    from trtet_store.io.names import BLOB_PART_SUFFIX

    tmp = store.directory / f"{store.token}-cache{uuid.uuid4().hex[:12]}{BLOB_PART_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        placement = "copy"
        if hit.size:
            try:
                clone_range(hit.fileno(), 0, 0, fd, 0)  # length 0: to the source's end
                if os.fstat(fd).st_size == hit.size:
                    placement = "clone"
            except OSError as exc:
                if exc.errno not in _NO_CLONE:
                    raise
        if placement == "copy":
            os.ftruncate(fd, 0)
            _copy(hit.fileno(), fd, hit.size)
        os.close(fd)
        fd = -1
        blob = store.adopt(tmp, metadata=metadata, give_back=False)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return blob, placement


def _copy(src: int, dst: int, size: int) -> None:
    offset = 0
    while offset < size:
        try:
            n = os.copy_file_range(src, dst, min(size - offset, 64 * MiB), offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = os.pwrite(dst, os.pread(src, min(size - offset, 8 * MiB), offset), offset)
        if n <= 0:
            raise OSError(errno.EIO, f"the cached engine ended at {offset} of {size} bytes")
        offset += n


def build_from_cache(cached: CachedBuild, store: BlobStore, fingerprint: str,
                     ) -> tuple[BuildResult, list[EngineCacheEvent]]:
    """The build a lowering needs, from a hit: engines staged in ``store``, none built.

    Engines are registered under their recorded ids (the recorded program's
    placeholders name them). A staged copy is checked against the record's
    digest (it is read once to digest it): one that differs raises
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
                staged[entry["digest"]] = stage_hit(store, hit, {
                    "kind": engine_reuse.ENGINE_KIND, "fingerprint": fingerprint})
            blob, placement = staged[entry["digest"]]
            if first and blob.digest != entry["digest"]:
                raise ValueError(f"engine {i} of cache entry {cached.key}: staged bytes digest "
                                 f"{blob.digest}, recorded {entry['digest']}")
            engines.append(tensorrt.register_engine(
                blob, engine_reuse._state(entry),  # noqa: SLF001
                [(tuple(shape), getattr(torch, dtype)) for shape, dtype in entry["outputs"]],
                engine_id=entry["engine_id"]))
            events.append(EngineCacheEvent(entry["engine_id"], _engine_key(cached.key, i),
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
                 timeout: float | None = None) -> tuple[BuildResult, list[EngineCacheEvent]]:
    """A lowering's build through the cache: a hit, or ``build()`` then a put, one per key.

    ``build`` is called with no argument and returns the staged
    :class:`~trtet_store.export.tensorrt.BuildResult` (with its record). The
    key's single-flight lock is held over the lookup, the build and the put,
    so concurrent exports of one model build it once and the others hit.
    A cache problem while putting never fails the export: it is logged and
    reported (``stored=False`` with the reason).
    """
    key = cache.key(fingerprint)
    with contextlib.ExitStack() as stack:
        waited = 0.0
        try:
            waited = stack.enter_context(cache.single_flight(key, timeout=timeout)).waited
        except OSError as exc:
            if isinstance(exc, TimeoutError) or \
                    exc.errno not in _CACHE_ERRNOS | {errno.ENOENT}:
                raise
            # e.g. a read-only cache: it can still serve hits, with no lock to share.
            log.warning("engine cache %s: no single-flight lock for %s (%s); going on "
                        "without it", cache.directory, key, exc)
        try:
            cached = cache.lookup(key)
        except OSError as exc:
            if exc.errno not in _CACHE_ERRNOS and exc.errno != errno.EIO:
                raise
            log.warning("engine cache %s: lookup of %s failed (%s); a miss",
                        cache.directory, key, exc)
            cached = None
        if cached is not None:
            with cached:
                try:
                    return build_from_cache(cached, store, fingerprint)
                except (ValueError, OSError) as exc:
                    # Bytes that are not what the record names (a second check behind
                    # the blob cache's seal), or an entry that cannot be read: a miss,
                    # never an exception and never served. Nothing was left staged.
                    log.warning("engine cache %s: %s; building it again", cache.directory, exc)
        if waited > 0.5:
            log.info("engine cache %s: waited %.1f s for another build of %s, which did not "
                     "cache it; building it here", cache.directory, waited, key)
        built = build()
        reserve = 0
        if _same_filesystem(cache.directory, Path(store.directory)) and \
                not _clones(built.engines, cache.directory):
            reserve = save_reserve(built.engines)
        try:
            results = cache.put_build(key, built, fingerprint, reserve=reserve)
        except Exception as exc:  # the cache is an optimisation: never the export's failure
            log.warning("engine cache %s: the build %s was not cached: %s",
                        cache.directory, key, exc)
            results = [PutResult(key=key, stored=False, size=0,
                                 reason=f"{type(exc).__name__}: {exc}")]
    complete = len(results) == len(built.engines) + 1 and all(r.stored for r in results)
    why = next((r.reason for r in results if r.skipped), None)
    events = []
    for i, engine in enumerate(built.engines):
        r = results[i] if i < len(results) else None
        events.append(EngineCacheEvent(
            engine.engine_id, _engine_key(key, i), engine.blob.size, "miss",
            r.placement if r is not None and r.stored else None, complete,
            None if complete else why or "not cached"))
        if complete:
            log.info("engine cache %s: engine %s of %s built and cached (%s)",
                     cache.directory, engine.engine_id, key, r.placement)
        else:
            log.warning("engine cache %s: engine %s of %s built and not cached: %s",
                        cache.directory, engine.engine_id, key, why)
    return built, events


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MIN_FREE",
    "CachedBuild",
    "EngineCache",
    "EngineCacheEvent",
    "build_key",
    "compute_capability",
]
