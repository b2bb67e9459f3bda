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
                     min_free: int = DEFAULT_MIN_FREE,
                     remote: str | RemoteTier | None = None,   # "s3://bucket/prefix"
                     endpoint_url: str | None = None, lease_ttl: float = 300.0,
                     wait_timeout: float | None = 3600.0,
                     signing_key: PathLike | None = None,           # TRTET_SIGNING_KEY
                     trusted_keys: Sequence[PathLike] | None = None  # TRTET_TRUSTED_KEYS
                     ) -> None
        directory: Path; max_bytes: int; min_free: int; blobs: BlobCache
        remote: RemoteTier | None; lease_ttl: float; wait_timeout: float | None
        def origin(self) -> str                        # <directory>/remote-origin
        def push(self, keys: Sequence[str] | None = None, *,
                 progress: Callable[[Progress], Any] | None = None) -> list[TierPublish]
        def pull(self, keys: Sequence[str], *, progress: Callable[[Progress], Any] | None = None
                 ) -> list[tuple[str, int]]             # (key, bytes downloaded)
        def remote_entries(self) -> list[RemoteEntry]
        def prune_remote(self, older_than: float, *, dry_run: bool = False) -> list[str]
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
        engine_id: str; key: str; size: int; outcome: "hit" | "remote-hit" | "miss"
        placement: str | None   # hit: "clone" | "copy" (cache -> staging);
                                # miss: the cache put's placement ("clone", "copy", "dedup")
        stored: bool | None; reason: str | None
        downloaded: int | None; published: bool | None; publish_reason: str | None
        remote_reason: str | None   # why the shared entry was not served (refused, damaged)

The shared tier (``remote=``, :mod:`trtet_store.cache.tier`): a build's
entry is its files ``record`` and ``e0``, ``e1``... with the pointer metadata
``{"record": <the record's metadata>, "engines": [<engine i's metadata>]}``,
exactly what the local cache records. A local miss looks the key up there; a
remote entry is placed only when its compute capability and versions are
this machine's, after the tier verified every file (size, xxh3-128), then
served as a local hit ("remote-hit"). Else the key's lease is claimed (one
build across machines), the build is cached locally and published (first
writer wins), the lease released. A damaged or inconsistent entry is never
served: rebuilt, and replaced (``If-Match`` that entry only). A tier that
cannot be used is a warning (once, until it works again): the export goes on
locally, its events say why nothing was published, and a build cached but
not published (``<directory>/remote-pending/<key>``) is published by the next
export that hits it. With ``signing_key=`` every entry published is signed;
with ``trusted_keys=`` an entry not signed by one of them (unsigned, another
signer, a pointer changed after signing) is a miss whose ``remote_reason``
says why, never served, and replaced (``If-Match``) by this cache's signed
build when it has a signing key (without one, left as it is: our own
unsigned entry would be refused too). Downloads go to ``<directory>/downloads/<key>/``
(resumable, on the cache's filesystem) and enter the blob cache by a hard
link (``put(consume=True)``: no second copy of a downloaded engine).

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
import math
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
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
from trtet_store.io import Progress, clone_or_copy
from trtet_store.io.units import GiB, MiB

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.cache.tier import Lease, RemoteEntry, RemoteTier, TierPublish
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

#: The shared tier's lease on a key: renewed every third of it while the build runs.
DEFAULT_LEASE_TTL = 300.0
#: Seconds an export waits at most for another machine's build of its key, then builds
#: itself. An hour outlasts most TensorRT builds (waiting is cheaper than building
#: twice) and bounds what a holder that renews but never publishes (a hung build, or a
#: bucket writer renewing a lease of its own) can cost: an hour, not forever.
DEFAULT_WAIT_TIMEOUT = 3600.0
#: In the cache directory: this machine's id in the shared tier (random hex, made once).
ORIGIN_FILE = "remote-origin"
#: Remote entries are downloaded into <cache>/downloads/<key>/ (resumable), then cached.
DOWNLOADS = "downloads"
#: Publish journals (a killed publish resumes from its journal).
REMOTE_JOURNAL = "remote-journal"
#: <cache>/remote-pending/<key>: a build cached here and not yet in the shared tier
#: (the publish was cut or the server was down); the next hit of the key publishes it.
PENDING = "remote-pending"

# What a cache directory can answer that means "no cache here now", never a failed export.
_CACHE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                           errno.EDQUOT})


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


def _metadata(key: str, built: BuildResult, fingerprint: str
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What a build's entries carry: each engine's metadata, and the record's.

    The same dicts go into the local cache and into a shared entry's pointer
    (``{"record": ..., "engines": [...]}``), so a downloaded entry is cached
    exactly as a local build is.
    """
    from trtet_store.export import engine_reuse

    capability = compute_capability()
    engines = [{"kind": ENGINE_KIND, "build": key, "engine_id": engine.engine_id,
                "compute_capability": capability} for engine in built.engines]
    record = {"kind": RECORD_KIND, "fingerprint": fingerprint, "compute_capability": capability,
              "versions": [list(v) for v in engine_reuse.build_versions()],
              "engines": [engine_reuse._engine_entry(e) for e in built.engines]}  # noqa: SLF001
    return engines, record


def _is_origin(text: str) -> bool:
    return 8 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


def _key_list(keys: Sequence[str], what: str) -> list[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"{what}() takes a sequence of keys, got {type(keys).__name__} "
                        "(a single key: [key])")
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad:
        raise TypeError(f"{what}() keys must be non-empty strings, got {bad!r}")
    if not keys:
        raise ValueError(f"{what}() needs at least one key")
    return list(dict.fromkeys(keys))


class _Tally:
    """One :class:`~trtet_store.io.Progress` across the keys of a push or pull.

    The tier reports each key's transfer on its own (publish's
    ``PublishProgress``, fetch's ``FetchProgress``: ``.done`` of that key's
    files), from several threads and not always in order; the caller is given
    bytes across every key of the call, never going back.
    """

    def __init__(self, callback: Callable[[Progress], Any] | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.base = 0  # the bytes of the keys settled so far
        self.done = 0
        self._lock = threading.Lock()
        if callback is not None:
            callback(Progress(0, total))  # the bar appears (and knows its size) at once

    def key(self, size: int) -> Callable[[Any], None] | None:
        """The tier's progress callback for the next key (``size`` bytes), or None."""
        if self.callback is None:
            return None
        base = self.base
        return lambda update: self._report(base + min(max(int(update.done), 0), size))

    def settled(self, size: int) -> None:
        """The key is done, whatever was sent (an entry already there sends nothing)."""
        self.base += size
        self._report(self.base)

    def _report(self, done: int) -> None:
        if self.callback is None:
            return
        with self._lock:  # in order: a later update never shows fewer bytes
            if done <= self.done:
                return
            self.done = done
            self.callback(Progress(done, self.total))


def _check_progress(progress: Any, what: str) -> None:
    if progress is not None and not callable(progress):
        raise TypeError(f"{what}(): progress must be a callable taking a "
                        f"trtet_store.Progress(done, total), got {type(progress).__name__}")


@dataclass
class EngineCacheEvent:
    """What the cache did for one engine of an export (in its report and log).

    ``outcome`` is ``"hit"`` (not built: taken from the local cache),
    ``"remote-hit"`` (not built: downloaded from the shared tier, then placed
    as a local hit) or ``"miss"`` (built). For a hit, ``placement`` is how the
    cached engine reached the staging store: ``"clone"`` (shared extents, no
    byte written) or ``"copy"``. For a miss, ``stored`` says whether the cache
    took it, with the put's ``placement`` (``"clone"``, ``"copy"``, ``"link"``,
    ``"dedup"``) or the ``reason`` it was skipped. A miss that rebuilt a
    damaged entry says so in ``reason`` (``"rebuilt: the cached entry was
    damaged (engine 0: digest mismatch ...)"``, or the shared entry's damage).

    With a shared tier (``EngineCache(remote=...)``): ``downloaded`` is the
    bytes received from the server for the build's entry (every engine and
    the record), counted on the build's first engine (0 on the others, so a
    sum over events is the total); ``published`` says whether this build
    (a miss, or a local hit still waiting to be published) entered the
    shared tier, and ``publish_reason`` why not (another machine published
    it first, the server was unreachable, ...). All three are None without
    a shared tier.
    """

    engine_id: str
    key: str
    size: int
    outcome: str
    placement: str | None = None
    stored: bool | None = None
    reason: str | None = None
    # The shared tier's part, at the end so that positional construction keeps its meaning.
    downloaded: int | None = None
    published: bool | None = None
    publish_reason: str | None = None
    #: Why the shared tier's entry of this key was not served (refused by the trusted
    #: keys, damaged, built for another GPU), or None (none there, or served).
    remote_reason: str | None = None

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


class _FileHit:
    """A downloaded, verified file standing in for a cache :class:`Hit` (for build_from_cache)."""

    def __init__(self, path: Path, metadata: dict[str, Any], digest: str) -> None:
        self.path = path
        self.metadata = metadata
        self.digest = digest
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self._fd).st_size

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Unplaced(CachedBuild):
    """A remote entry's download the local cache did not take: served once, then removed."""

    def __init__(self, key: str, entry: RemoteEntry, paths: dict[str, Path],
                 directory: Path, cache: BlobCache) -> None:
        digests = {f["name"]: f["digest"] for f in entry.files}
        hits: list[Any] = []
        try:
            for i, meta in enumerate(entry.metadata["engines"]):
                if paths[f"e{i}"].exists():
                    hits.append(_FileHit(paths[f"e{i}"], meta, digests[f"e{i}"]))
                    continue
                # Consumed by the cache before a later put was skipped: its entry, pinned.
                hit = cache.get(_engine_key(key, i))
                if hit is None or hit.digest != digests[f"e{i}"]:
                    if hit is not None:
                        hit.close()
                    raise FileNotFoundError(errno.ENOENT, f"engine {i} of {key} is neither "
                                            "downloaded nor cached any more")
                hits.append(hit)
            record = _FileHit(paths["record"], entry.metadata["record"], digests["record"])
        except BaseException:
            for h in hits:
                h.close()
            raise
        super().__init__(key, record, hits)  # type: ignore[arg-type]
        self.directory = directory

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.directory, ignore_errors=True)


class EngineCache:
    """A persistent, per-user cache of TensorRT builds: one build per key for the whole machine.

    Parameters
    ----------
    directory : path-like, optional
        Default ``$XDG_CACHE_HOME/trtet_store/engines`` (else
        ``~/.cache/trtet_store/engines``), mode 0700. A directory, or a file in
        it, owned by another user or writable by others is refused with
        ``PermissionError``; a symbolic link, or a directory that is neither
        empty nor a trtet_store cache (no ``CACHEDIR.TAG``), with
        :class:`~trtet_store.CacheDirectoryError`, before anything in it is
        touched. On a read-only filesystem the cache serves hits and skips
        every put (with the reason).
    max_bytes : int
        Bound on the distinct cached bytes (engines and records); least
        recently used entries are evicted to stay within it. Positive: to
        cache nothing, pass no cache.
    min_free : int
        Bytes every put leaves free on the cache's filesystem.
    remote : str or RemoteTier, optional
        The shared tier, ``"s3://bucket/prefix"`` (or a
        :class:`~trtet_store.cache.tier.RemoteTier` made by the caller, used
        with its own settings). The URL is checked at once, with no network;
        the server is first asked by the first lookup, and a server that
        cannot be used never fails an export (a warning).
    endpoint_url : str, optional
        The S3 server of ``remote=`` URL (default: boto3's configuration).
    lease_ttl : float
        Seconds a build lease of this cache stays live without its renewal
        (renewed every third while the build runs); another machine builds
        when it has not changed for that long.
    read_only : bool
        Open to look only (``entries``, ``stats``, hits): nothing in the
        directory is created or removed, puts are skipped. A missing
        directory is ``FileNotFoundError``.
    wait_timeout : float or None
        Seconds to wait at most for another machine's build (default
        :data:`DEFAULT_WAIT_TIMEOUT`, an hour); then this machine builds too,
        and says so (a warning). None waits as long as the lease is renewed.
        A lease that is not renewed is taken over after its ttl, at most twice
        this cache's ``lease_ttl`` whatever ttl the lease claims.
    signing_key : path-like, optional
        With ``remote=``: an ed25519 private key file (``trtet-store cache
        keygen``); every entry this cache publishes is signed with it.
        Default: ``TRTET_SIGNING_KEY``, else the config file's
        (:mod:`trtet_store.cache.tier.keyconfig`).
    trusted_keys : sequence of path-like, optional
        With ``remote=``: public key files; a shared entry not signed by one
        of them is a miss (``remote_reason`` in its events), never served,
        and, when this cache signs, replaced by its own signed build
        (``If-Match`` that entry). Default: ``TRTET_TRUSTED_KEYS``, else the
        config file's, else none (every entry accepted).

    Raises
    ------
    RemoteURLError
        ``remote`` is not an ``s3://bucket[/prefix]`` URL.
    PermissionError
        The directory (or a file in it) is another user's, or writable by others.
    ValueError, TypeError
        ``max_bytes`` not a positive int, ``min_free`` negative; ``lease_ttl``
        not > 0, ``wait_timeout`` negative; ``endpoint_url`` without a URL.
    OSError
        The directory cannot be created (read-only parent): the message says so.
    """

    def __init__(self, directory: os.PathLike | str | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, min_free: int = DEFAULT_MIN_FREE,
                 remote: str | RemoteTier | None = None, endpoint_url: str | None = None,
                 lease_ttl: float = DEFAULT_LEASE_TTL,
                 wait_timeout: float | None = DEFAULT_WAIT_TIMEOUT, signing_key: Any = None,
                 trusted_keys: Any = None, read_only: bool = False) -> None:
        # Every argument is checked before the directory is touched or a tier is made.
        if (signing_key is not None or trusted_keys is not None) and not isinstance(remote, str):
            raise ValueError("signing_key= and trusted_keys= are for remote='s3://...'; " + (
                "pass remote= too" if remote is None else
                "the RemoteTier given has its own (RemoteTier(..., signing_key=, trusted_keys=))"))
        if remote is not None and not isinstance(remote, str):
            from trtet_store.cache.tier import RemoteTier

            if not isinstance(remote, RemoteTier):
                raise TypeError(f"remote must be an s3:// URL, a RemoteTier or None, got "
                                f"{type(remote).__name__}")
        if endpoint_url is not None and not isinstance(remote, str):
            raise ValueError("endpoint_url is for remote='s3://...'; "
                             + ("pass remote= too" if remote is None else
                                "the RemoteTier given has its own endpoint"))
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, (int, float)):
            raise TypeError(f"lease_ttl must be seconds (a number), got "
                            f"{type(lease_ttl).__name__}")
        if not math.isfinite(lease_ttl) or lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be > 0 seconds, got {lease_ttl}")
        if wait_timeout is not None:
            if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
                raise TypeError(f"wait_timeout must be seconds or None, got "
                                f"{type(wait_timeout).__name__}")
            if math.isnan(wait_timeout) or wait_timeout < 0:
                raise ValueError(f"wait_timeout must be >= 0 seconds or None, got "
                                 f"{wait_timeout}")
        tier: RemoteTier | None = None
        if isinstance(remote, str):
            from trtet_store.cache.tier import RemoteTier

            # Made before the directory: a bad URL raises here (RemoteURLError), with no
            # network and nothing created. A waiter looks at another machine's lease every
            # 2 s, or a quarter of a short ttl (a takeover is not late by a whole poll).
            tier = RemoteTier(remote, endpoint_url=endpoint_url, lease_ttl=float(lease_ttl),
                              poll=min(2.0, lease_ttl / 4), signing_key=signing_key,
                              trusted_keys=trusted_keys)
        self.blobs = BlobCache(directory, max_bytes=max_bytes, min_free=min_free,
                               read_only=read_only)
        self.lease_ttl = float(lease_ttl)
        self.wait_timeout = wait_timeout
        # The tier's trouble, warned once (a SharedCacheWarning too) until it works again.
        from trtet_store.cache.tier.health import TierHealth

        self._health = TierHealth(log)
        # Why the last lookup of a key missed an entry it had (damaged), for its events.
        self._damaged: dict[str, str] = {}
        self.remote: RemoteTier | None = None
        if tier is not None:
            # This cache's own id and journals: a killed publish's next run resumes.
            tier.origin = self.origin()
            tier.journal_dir = self.directory / REMOTE_JOURNAL
            self.remote = tier
        elif remote is not None:
            self.remote = remote  # its own origin, lease_ttl, journal: the caller's choice

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
        self._damaged.pop(key, None)
        record = self.blobs.get(key)
        if record is None:
            if key in self.blobs.dropped:
                self._damaged[key] = f"the cached entry was damaged (its record: " \
                                     f"{self.blobs.dropped.pop(key)})"
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
                    why = self.blobs.dropped.pop(_engine_key(key, i), None)
                    if why is not None:
                        self._damaged[key] = f"the cached entry was damaged (engine {i}: {why})"
                    break
                engines.append(hit)
                if (hit.size, hit.digest) != (entry.get("size"), entry.get("digest")):
                    differs = ("digest mismatch with its record" if hit.size == entry.get("size")
                               else f"size {hit.size}, its record says {entry.get('size')}")
                    self._damaged[key] = f"the cached entry was damaged (engine {i}: {differs})"
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
        cache = self.blobs
        if reserve:
            # A view with a higher floor, so that the cache's copy never takes the
            # save's room; the shared object is left as it is (other threads use it).
            cache = copy.copy(self.blobs)
            cache.min_free = self.blobs.min_free + reserve
        engine_meta, record_meta = _metadata(key, built, fingerprint)
        results: list[PutResult] = []
        for i, engine in enumerate(built.engines):
            result = cache.put(_engine_key(key, i), engine.blob, engine_meta[i])
            results.append(result)
            if result.skipped:
                return results
        if built.record is None:
            return results
        results.append(cache.put(key, built.record, record_meta))
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

    # -- the shared tier (remote=) ----------------------------------------------------

    def origin(self) -> str:
        """This cache's id in the shared tier: random hex kept in ``<directory>/remote-origin``.

        Made once, atomically (a complete file linked into place: of two
        processes making it at once, both read the winner's). It names the
        attempt directories this cache publishes to, so that a killed
        publish's next run resumes its own upload. A cache that cannot keep
        it (read-only) gets a fresh one per process (logged): its publishes
        then never resume, they start again.
        """
        path = self.directory / ORIGIN_FILE
        made = None
        for _ in range(2):
            try:
                text = path.read_text(encoding="ascii").strip()
            except FileNotFoundError:
                text = None
            except (OSError, UnicodeDecodeError) as exc:
                log.warning("engine cache %s: cannot read %s (%s); a new origin for this "
                            "process", self.directory, path, exc)
                return uuid.uuid4().hex
            if text is not None and _is_origin(text):
                return text
            made = uuid.uuid4().hex
            tmp = self.directory / f".{ORIGIN_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, made.encode("ascii") + b"\n")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if text is None:
                    try:
                        os.link(tmp, path)  # never replaces another process's origin
                    except FileExistsError:
                        continue  # read the winner's
                else:  # a damaged file (not hex): replaced, once
                    log.warning("engine cache %s: %s held %r, not an origin id; replaced",
                                self.directory, path, text[:40])
                    os.replace(tmp, path)
                    tmp = None
                return made
            except OSError as exc:
                log.warning("engine cache %s: cannot keep an origin id in %s (%s); a new one "
                            "for this process (its publishes will not resume)",
                            self.directory, path, exc)
                return made
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        return made or uuid.uuid4().hex

    def _tier(self, what: str) -> RemoteTier:
        if self.remote is None:
            raise ValueError(f"{what} needs a shared tier: "
                             f"EngineCache({os.fspath(self.directory)!r}, "
                             "remote='s3://bucket/prefix')")
        return self.remote

    def remote_entries(self) -> list[RemoteEntry]:
        """Every entry of the shared tier (its pointers): :meth:`RemoteTier.entries`."""
        return self._tier("remote_entries()").entries()

    def prune_remote(self, older_than: float, *, dry_run: bool = False) -> list[str]:
        """Remove shared entries (and abandoned attempts) older than ``older_than`` seconds.

        For buckets without a lifecycle rule; see :meth:`RemoteTier.prune`.
        Returns what was removed (or would be, with ``dry_run``).
        """
        return self._tier("prune_remote()").prune(older_than, dry_run=dry_run)

    def push(self, keys: Sequence[str] | None = None, *,
             progress: Callable[[Progress], Any] | None = None) -> list[TierPublish]:
        """Publish local builds to the shared tier (default: every complete build cached here).

        Each is published from the cache's own files (pinned, checked), with
        its entry's metadata, first writer wins: a key already in the tier is
        reported (``published=False`` with the reason), not replaced. Every
        named key is checked before anything is sent.

        Parameters
        ----------
        keys : sequence of str, optional
            Build keys (default: every complete build cached here).
        progress : callable, optional
            Called with a :class:`~trtet_store.io.Progress`: ``total`` is the
            bytes of every key's files, ``done`` those handled so far (sent,
            or found already in the tier), never decreasing, ``total`` at the
            end.

        Raises
        ------
        ValueError
            No shared tier, or a key that is not a complete build here.
        RemoteError
            The server's refusal (unreachable, credentials, bucket).
        """
        tier = self._tier("push()")
        _check_progress(progress, "push")
        if keys is None:
            wanted = sorted(e.key for e in self.entries()
                            if e.metadata.get("kind") == RECORD_KIND)
        else:
            wanted = _key_list(keys, "push")
        missing = []
        sizes: dict[str, int] = {}
        for key in wanted:
            cached = self.lookup(key)
            if cached is None:
                missing.append(key)
            else:
                with cached:
                    sizes[key] = sum(h.size for h in (cached.record, *cached.engines))
        if missing:
            raise ValueError(f"not a complete build in the engine cache {self.directory}: "
                             f"{missing} (list what it holds with `trtet-store cache list`)")
        tally = _Tally(progress, sum(sizes.values()))
        out = []
        for key in wanted:
            with self.single_flight(key):
                cached = self.lookup(key)
                if cached is None:  # evicted since the check
                    raise ValueError(f"{key!r} left the engine cache {self.directory} (evicted) "
                                     "before it was pushed")
                with cached:
                    result = self._publish_cached(tier, cached, progress=tally.key(sizes[key]))
            tally.settled(sizes[key])
            out.append(result)
        return out

    def pull(self, keys: Sequence[str], *,
             progress: Callable[[Progress], Any] | None = None) -> list[tuple[str, int]]:
        """Download shared entries into the local cache; ``(key, bytes downloaded)`` each.

        A key already cached here downloads nothing (0). Every key is looked
        up before anything is downloaded. Each entry is verified (sizes,
        digests) before it enters the cache.

        Parameters
        ----------
        keys : sequence of str
            Build keys of the shared tier.
        progress : callable, optional
            Called with a :class:`~trtet_store.io.Progress`: ``total`` is the
            bytes of the entries to download (keys already cached here count
            nothing), ``done`` those received so far (a resumed download's
            staged bytes included), never decreasing, ``total`` at the end.

        Raises
        ------
        ValueError
            No shared tier, a key in neither cache, or an entry built for
            another GPU or other versions (both values named).
        TierEntryError
            An entry whose files fail their checks, or (TierSignatureError) one
            the trusted keys refuse: nothing of it is cached.
        RuntimeError
            The entry was downloaded but the local cache did not take it (the reason).
        """
        tier = self._tier("pull()")
        _check_progress(progress, "pull")
        wanted = _key_list(keys, "pull")
        entries: dict[str, RemoteEntry | None] = {}
        for key in wanted:
            cached = self.lookup(key)
            if cached is not None:
                cached.close()
                entries[key] = None
                continue
            entry = tier.lookup(key)
            if entry is None:
                raise ValueError(f"{key!r} is in neither the engine cache {self.directory} nor "
                                 f"the shared tier {tier.url} (list it with `trtet-store cache "
                                 "list --remote`)")
            tier.check_signature(entry)  # every key's, before anything is downloaded
            problem = self._entry_problem(key, entry)
            if problem is not None:
                raise ValueError(f"the shared entry {key!r} cannot be used here: {problem}")
            entries[key] = entry
        tally = _Tally(progress, sum(e.size for e in entries.values() if e is not None))
        out = []
        for key in wanted:
            entry = entries[key]
            if entry is None:
                out.append((key, 0))
                continue
            with self.single_flight(key):
                cached, downloaded, why = self._download(tier, key, entry,
                                                         progress=tally.key(entry.size))
                if cached is not None:
                    cached.close()  # an unplaced download is removed
                if why is not None:
                    raise RuntimeError(f"{key!r}: {downloaded} bytes downloaded from {tier.url}, "
                                       f"but not cached in {self.directory}: {why}")
            tally.settled(entry.size)
            out.append((key, downloaded))
        return out

    # The steps build_cached takes with a tier. Each raises what the tier raises: the
    # caller turns remote problems into warnings (the export never fails for them).

    def _entry_problem(self, key: str, entry: RemoteEntry) -> str | None:
        """Why ``entry`` must not be placed on this machine (None: it may).

        Its metadata must be an engine build's, its files those of that build,
        and its compute capability and versions this machine's: an engine is
        never placed on a GPU (or a TensorRT) it was not built for.
        """
        meta = entry.metadata if isinstance(entry.metadata, dict) else {}
        record, engines = meta.get("record"), meta.get("engines")
        if not isinstance(record, dict) or record.get("kind") != RECORD_KIND or \
                not isinstance(engines, list) or \
                not all(isinstance(e, dict) and e.get("kind") == ENGINE_KIND for e in engines) \
                or not isinstance(record.get("engines"), list) \
                or len(record["engines"]) != len(engines):
            return "its metadata is not an engine build's (record and engines)"
        names = sorted(str(f.get("name")) for f in entry.files)
        want = sorted(["record", *(f"e{i}" for i in range(len(engines)))])
        if names != want:
            return f"its files are {names}, a build of {len(engines)} engine(s) has {want}"
        here = compute_capability()
        for what, value in [("the record", record.get("compute_capability")),
                            *((f"engine {i}", e.get("compute_capability"))
                              for i, e in enumerate(engines))]:
            if value != here:
                return (f"{what} was built for compute capability {value!r}; this machine's "
                        f"GPU is {here!r}")
        from trtet_store.export import engine_reuse

        mine = {str(n): str(v) for n, v in engine_reuse.build_versions()}
        try:
            theirs = {str(n): str(v) for n, v in record.get("versions") or []}
        except (TypeError, ValueError):
            return f"its versions {record.get('versions')!r} cannot be read"
        if theirs != mine:
            differ = sorted(set(mine) | set(theirs))
            shown = [f"{n} {theirs.get(n, '(none)')} (here {mine.get(n, '(none)')})"
                     for n in differ if theirs.get(n) != mine.get(n)]
            return "it was built with other versions: " + ", ".join(shown)
        return None

    def _download(self, tier: RemoteTier, key: str, entry: RemoteEntry, *,
                  progress: Callable[[Any], Any] | None = None
                  ) -> tuple[CachedBuild | None, int, str | None]:
        """Download ``entry`` (verified by the tier), cache it, look it up.

        Returns ``(cached build, bytes received, None)``; or, when the local
        cache did not take it (its bound, its room, read-only), ``(the
        downloaded files as a build, bytes, why)``: they are still verified
        bytes, served once and removed when the build is closed (a download
        is never thrown away for a rebuild). ``(None, 0, why)`` when there is
        nowhere to download to. Raises the tier's errors:
        :class:`TierEntryError` for damaged files (never cached). The
        download directory is kept on a cut transfer (the next one resumes
        it) and removed otherwise.
        """
        from trtet_store.cache.tier import TierEntryError

        directory = self.directory / DOWNLOADS / key
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return None, 0, f"cannot download into {directory}: {exc}"
        try:
            got = tier.download(entry, directory, progress=progress)
        except TierEntryError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        try:
            why = self._place(key, entry, got.paths)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        if why is not None:
            try:
                return (_Unplaced(key, entry, got.paths, directory, self.blobs), got.downloaded,
                        why)
            except OSError as exc:
                shutil.rmtree(directory, ignore_errors=True)
                return None, got.downloaded, f"{why}; and {exc}"
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
        # Placed (each file linked into the cache): the download directory is not kept.
        shutil.rmtree(directory, ignore_errors=True)
        cached = self.lookup(key)
        if cached is None:
            return None, got.downloaded, "cached, then not found again (evicted at once?)"
        return cached, got.downloaded, None

    def _place(self, key: str, entry: RemoteEntry, paths: dict[str, Path]) -> str | None:
        """Each downloaded file into the blob cache: engines first, the record last."""
        engines = entry.metadata["engines"]
        for i, meta in enumerate(engines):
            # consume=True: downloads/ is on the cache's filesystem, so the put links the
            # file in (no second copy of a downloaded engine, on any filesystem); a
            # skipped put leaves the file where it is.
            result = self.blobs.put(_engine_key(key, i), paths[f"e{i}"], meta, consume=True)
            if result.skipped:
                return f"engine {i}: {result.reason}"
            log.info("engine cache %s: downloaded engine %d of %s (%d bytes) cached by %s",
                     self.directory, i, key, result.size, result.placement)
        result = self.blobs.put(key, paths["record"], entry.metadata["record"], consume=True)
        if result.skipped:
            return f"the record: {result.reason}"
        return None

    def _publish_cached(self, tier: RemoteTier, cached: CachedBuild, *,
                        replace: RemoteEntry | None = None,
                        progress: Callable[[Any], Any] | None = None) -> TierPublish:
        """Publish a cached build from the cache's own (pinned) files, with their metadata."""
        files = [("record", cached.record.path, cached.record.digest)]
        files += [(f"e{i}", hit.path, hit.digest) for i, hit in enumerate(cached.engines)]
        metadata = {"record": dict(cached.record.metadata),
                    "engines": [dict(hit.metadata) for hit in cached.engines]}
        result = tier.publish(cached.key, files, metadata, replace=replace, progress=progress)
        self._settled(cached.key, result)
        return result

    def _publish_staged(self, tier: RemoteTier, key: str, built: BuildResult, fingerprint: str,
                        *, replace: RemoteEntry | None = None) -> TierPublish:
        """Publish a build from its staged blobs (the local cache did not take it)."""
        engine_meta, record_meta = _metadata(key, built, fingerprint)
        record = built.record
        files = [("record", Path(record.path), record.digest)]
        files += [(f"e{i}", Path(e.blob.path), e.blob.digest) for i, e in enumerate(built.engines)]
        return tier.publish(key, files, {"record": record_meta, "engines": engine_meta},
                            replace=replace)

    def _pending(self, key: str) -> Path:
        return self.directory / PENDING / key

    def _mark_pending(self, key: str) -> None:
        """Remember that ``key`` is cached here and not yet in the shared tier."""
        try:
            (self.directory / PENDING).mkdir(mode=0o700, exist_ok=True)
            self._pending(key).touch(mode=0o600)
        except OSError as exc:  # costs only the automatic retry of the publish
            log.debug("engine cache %s: cannot mark %s as not yet published: %s",
                      self.directory, key, exc)

    def _settled(self, key: str, result: TierPublish) -> None:
        """The tier holds an entry for ``key`` (ours or another's): nothing left to publish."""
        if result.published or result.entry is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._pending(key))

    def _remote_failed(self, what: str, exc: BaseException, *, said: str | None = None) -> str:
        """Say a tier problem (warned once, until the tier works again); the reason.

        ``said`` replaces the whole warning (a failed download says what happens next).
        """
        # Named by its public class (EndpointUnreachableError, AccessDeniedError,
        # BucketNotFoundError...), not the transport's internal subclass.
        name = next((c.__name__ for c in type(exc).__mro__
                     if c.__module__ == "trtet_store.remote.errors"), type(exc).__name__)
        why = f"the shared cache {self.remote.url if self.remote else ''} was not usable " \
              f"({what}: {name}: {exc})"
        known = isinstance(exc, OSError) or type(exc).__module__.startswith("trtet_store.remote")
        self._health.failed(f"engine cache {self.directory}: "
                            + (said or f"{why}; going on with the local cache only"),
                            exc_info=None if known else exc)
        return said or why

    def _remote_ok(self) -> None:
        self._health.worked(f"engine cache {self.directory}: the shared cache "
                            f"{self.remote.url if self.remote else ''} works again")

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
        placement = clone_or_copy(hit.fileno(), fd, hit.size, what="the cached engine")
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

    With a shared tier (``cache.remote``), a local miss then:

    1. looks the key up in the tier: an entry built for this GPU and these
       versions is downloaded (verified by the tier), cached, and served as
       a hit (``"remote-hit"``); a damaged one is never served, it is
       rebuilt and replaced (only that entry: ``replace=``);
    2. else claims the key's lease: an entry another machine publishes while
       we wait is taken as in 1; the lease is built under, the build cached
       locally, published (first writer wins: a loser keeps its engine
       locally and says so) and the lease released, also on failure;
    3. a tier that cannot be reached, refuses the credentials or has no
       bucket is a warning: the export goes on locally, and the events say
       why nothing was published. A build cached here but not published is
       published by the next export that hits it.
    """
    key = cache.key(fingerprint)
    tier = cache.remote
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
        damage = cache._damaged.pop(key, None)  # noqa: SLF001 - said in the events
        if cached is not None:
            with cached:
                try:
                    built, events = build_from_cache(cached, store, fingerprint)
                except (ValueError, OSError) as exc:
                    # Bytes that are not what the record names (a second check behind
                    # the blob cache's seal), or an entry that cannot be read: a miss,
                    # never an exception and never served. Nothing was left staged.
                    log.warning("engine cache %s: %s; building it again", cache.directory, exc)
                    damage = f"the cached entry was damaged ({exc})"
                else:
                    if tier is not None and os.path.exists(cache._pending(key)):  # noqa: SLF001
                        published, why = _publish_pending(cache, tier, cached)
                        for e in events:
                            e.published, e.publish_reason = published, why
                    return built, events
        replace: RemoteEntry | None = None
        remote_why: str | None = None  # why this build cannot be published
        remote_reason: str | None = None  # why the tier's entry was not served
        if tier is not None:
            served, replace, remote_why, remote_reason = _from_remote(
                cache, tier, key, store, fingerprint, stack)
            if served is not None:
                return served
            damage = cache._damaged.pop(key, None) or damage  # noqa: SLF001 - the shared entry's
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
        published: bool | None = None
        publish_reason: str | None = None
        if tier is not None:
            # Under the lease still (the stack releases it after this): waiters see the
            # entry appear before the lease goes.
            published, publish_reason = _publish_built(cache, tier, key, built, fingerprint,
                                                       complete, replace, remote_why)
    why = next((r.reason for r in results if r.skipped), None)
    events = []
    for i, engine in enumerate(built.engines):
        r = results[i] if i < len(results) else None
        events.append(EngineCacheEvent(
            engine.engine_id, _engine_key(key, i), engine.blob.size, "miss",
            r.placement if r is not None and r.stored else None, complete,
            "; ".join(filter(None, [damage and f"rebuilt: {damage}",
                                    None if complete else why or "not cached"])) or None,
            None, published, publish_reason, remote_reason))
        if complete:
            log.info("engine cache %s: engine %s of %s built and cached (%s)",
                     cache.directory, engine.engine_id, key, r.placement)
        else:
            log.warning("engine cache %s: engine %s of %s built and not cached: %s",
                        cache.directory, engine.engine_id, key, why)
    return built, events


def _from_remote(cache: EngineCache, tier: RemoteTier, key: str, store: BlobStore,
                 fingerprint: str, stack: contextlib.ExitStack,
                 ) -> tuple[tuple[BuildResult, list[EngineCacheEvent]] | None,
                            RemoteEntry | None, str | None, str | None]:
    """Steps 1 and 2 of :func:`build_cached`: ``(served, replace, why not publishable,
    why the tier's entry was not served)``.

    ``served`` is the remote hit (None: build). ``replace`` is the damaged or
    unusable entry a publish may replace. A lease taken is released by
    ``stack`` (after the build's publish).
    """
    from trtet_store.cache.tier import Lease, LeaseWaitTimeout

    try:
        entry = tier.lookup(key)
    except Exception as exc:  # noqa: BLE001 - the remote never fails an export
        return None, None, cache._remote_failed("lookup", exc), None  # noqa: SLF001
    cache._remote_ok()  # noqa: SLF001
    if entry is not None:
        # A damaged entry is not claimed around (its pointer is there: claim would hand
        # it back): this machine builds, and replaces only that entry.
        return _take(cache, tier, key, entry, store, fingerprint)
    try:
        # The tier says (WARNING) when the wait starts and when it outlasts the lease's ttl.
        got = tier.claim(key, timeout=cache.wait_timeout)
    except LeaseWaitTimeout as exc:
        log.warning("engine cache %s: %s; building %s here (the first machine to publish "
                    "it wins)", cache.directory, exc, key)
        return None, None, None, None
    except Exception as exc:  # noqa: BLE001
        return None, None, cache._remote_failed("claim", exc), None  # noqa: SLF001
    if isinstance(got, Lease):
        stack.callback(_release, cache, got)
        return None, None, None, None
    # Another machine published it while we waited.
    return _take(cache, tier, key, got, store, fingerprint)


def _release(cache: EngineCache, lease: Lease) -> None:
    try:
        if lease.lost:
            log.warning("engine cache %s: the lease on %s was taken over by another machine "
                        "during the build", cache.directory, lease.key)
        lease.release()
    except Exception as exc:  # noqa: BLE001 - it expires by itself
        log.warning("engine cache %s: the lease on %s was not released (%s: %s); it expires "
                    "after its ttl", cache.directory, lease.key, type(exc).__name__, exc)


def _take(cache: EngineCache, tier: RemoteTier, key: str, entry: RemoteEntry, store: BlobStore,
          fingerprint: str) -> tuple[tuple[BuildResult, list[EngineCacheEvent]] | None,
                                     RemoteEntry | None, str | None, str | None]:
    """A remote entry made a hit: ``(served, None, None, None)``; else why it is a miss."""
    from trtet_store.cache.tier import TierEntryError
    from trtet_store.export import remote_miss
    from trtet_store.io import InsufficientSpaceError

    # The signature first: nothing else of an entry its keys refuse is believed.
    refused = tier.signature_problem(entry)
    if refused is not None:
        log.warning("engine cache %s: the shared entry %s (from %s, origin %s) is refused, "
                    "never served: %s; building it here", cache.directory, key, entry.host,
                    entry.origin, refused)
        if tier.signing_key is None:  # our replacement would be refused as well
            return None, None, (f"the shared entry is refused ({refused}) and this cache "
                                "has no signing key to replace it"), f"refused: {refused}"
        return None, entry, None, f"refused: {refused}"  # replaced by our signed build
    problem = cache._entry_problem(key, entry)  # noqa: SLF001
    if problem is not None:
        log.warning("engine cache %s: the shared entry %s (from %s, origin %s) is a miss: %s; "
                    "building it here", cache.directory, key, entry.host, entry.origin, problem)
        return None, entry, None, problem
    seen = remote_miss.LastProgress()
    try:
        cached, downloaded, why = cache._download(tier, key, entry, progress=seen)  # noqa: SLF001
    except TierEntryError as exc:
        cache._damaged[key] = f"the shared cache's entry was damaged ({exc})"  # noqa: SLF001
        cache._health.notice(  # noqa: SLF001
            f"engine cache {cache.directory}: the shared entry {key} is damaged, never "
            f"served: {exc}; building it here and replacing it")
        return None, entry, None, f"damaged: {exc}"
    except InsufficientSpaceError as exc:
        # No room for the download: none for the build either, when the entry's own
        # sizes say so (refused now, not after hours of building).
        remote_miss.refuse_build_without_room(key, entry, Path(store.directory), exc)
        return None, None, cache._remote_failed("download", exc), None  # noqa: SLF001
    except Exception as exc:  # noqa: BLE001
        said = remote_miss.download_failed(key, exc, seen, cache.directory / DOWNLOADS / key)
        return None, None, cache._remote_failed("download", exc, said=said), None  # noqa: SLF001
    if cached is None:
        log.warning("engine cache %s: the shared entry %s is not usable here: %s; building it",
                    cache.directory, key, why)
        return None, None, None, why
    if why is not None:
        log.warning("engine cache %s: the shared entry %s was downloaded (%d bytes) but not "
                    "cached here: %s; served from the download", cache.directory, key,
                    downloaded, why)
    with cached:
        try:
            built, events = build_from_cache(cached, store, fingerprint)
        except (ValueError, OSError) as exc:
            log.warning("engine cache %s: %s; building it again", cache.directory, exc)
            return None, None, None, str(exc)
    for i, e in enumerate(events):
        e.outcome = "remote-hit"
        e.downloaded = downloaded if i == 0 else 0
        if why is not None:
            e.stored, e.reason = False, why
    log.info("engine cache %s: remote hit %s from %s (host %s): %d bytes downloaded, not built",
             cache.directory, key, tier.url, entry.host, downloaded)
    return (built, events), None, None, None


def _publish_built(cache: EngineCache, tier: RemoteTier, key: str, built: BuildResult,
                   fingerprint: str, complete: bool, replace: RemoteEntry | None,
                   remote_why: str | None) -> tuple[bool, str | None]:
    """Step 3 of :func:`build_cached`: publish a fresh build; ``(published, why not)``."""
    if complete:
        cache._mark_pending(key)  # noqa: SLF001 - until the tier holds an entry for it
    if remote_why is not None:
        return False, remote_why
    if built.record is None:
        return False, "the build has no record to publish"
    try:
        if complete:
            cached = cache.lookup(key)
            if cached is None:
                raise OSError(errno.ENOENT, f"the build {key} left the local cache at once")
            with cached:
                result = cache._publish_cached(tier, cached, replace=replace)  # noqa: SLF001
        else:
            result = cache._publish_staged(tier, key, built, fingerprint,  # noqa: SLF001
                                           replace=replace)
    except Exception as exc:  # noqa: BLE001 - the remote never fails an export
        return False, cache._remote_failed("publish", exc)  # noqa: SLF001
    cache._remote_ok()  # noqa: SLF001
    return _said(cache, key, result)


def _publish_pending(cache: EngineCache, tier: RemoteTier, cached: CachedBuild,
                     ) -> tuple[bool, str | None]:
    """A local hit whose publish was cut (a kill, a server down): publish it now."""
    log.info("engine cache %s: %s is cached here but not yet in the shared cache %s; "
             "publishing it", cache.directory, cached.key, tier.url)
    try:
        result = cache._publish_cached(tier, cached)  # noqa: SLF001
    except Exception as exc:  # noqa: BLE001
        return False, cache._remote_failed("publish", exc)  # noqa: SLF001
    cache._remote_ok()  # noqa: SLF001
    return _said(cache, cached.key, result)


def _said(cache: EngineCache, key: str, result: TierPublish) -> tuple[bool, str | None]:
    if result.published:
        log.info("engine cache %s: %s published to %s (%d bytes sent)", cache.directory, key,
                 cache.remote.url if cache.remote else "", result.sent)
        return True, None
    log.info("engine cache %s: %s not published: %s; our engine is kept in the local cache",
             cache.directory, key, result.reason)
    return False, result.reason or "not published"


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MIN_FREE",
    "CachedBuild",
    "EngineCache",
    "EngineCacheEvent",
    "build_key",
    "compute_capability",
]
