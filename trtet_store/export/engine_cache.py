"""EngineCache: TensorRT builds kept across processes and machines, on the two-level cache.

What an engine build's key and record are lives in :mod:`.engine_key` and
:mod:`.engine_record` (``cache/`` knows no TensorRT); this module is
:class:`EngineCache`, a :class:`~trtet_store.cache.tiered.TieredCache` (the
local :class:`~trtet_store.cache.BlobCache`, then the shared tier) with the
build record (a build's put, engines then record, is :mod:`.engine_put`). The
export's side of it is :mod:`.engine_build`:
:func:`~.engine_build.build_cached` turns a hit into staged engines (cloned
where the filesystems allow, else the cache's file shared) and puts a miss's
engines, then its record, into the cache before the consuming save, keeping
that save its room (cloned; on a staging filesystem that cannot clone, hard
linked and then shared, so the save copies each engine once).
A cache that cannot take an entry, or a shared tier that cannot be used, never
fails an export. See DESIGN.md, "The cache".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
from collections.abc import Callable, Sequence
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
from trtet_store.cache.layout import DOWNLOADS, ORIGIN_FILE, PENDING, REMOTE_JOURNAL
from trtet_store.cache.store import check_verify
from trtet_store.cache.tally import Tally, check_progress, key_list
from trtet_store.cache.tiered import TieredCache, Voice
from trtet_store.export import engine_key, engine_put
from trtet_store.export.engine_key import (
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_BYTES,
    DEFAULT_MIN_FREE,
    ENGINE_KIND,
    NO_GPU,
    RECORD_KIND,
)
from trtet_store.export.engine_record import CachedBuild, EngineCacheEvent, tier_files
from trtet_store.io import Progress

if TYPE_CHECKING:
    from trtet_store.cache.tier import LeaseWait, RemoteEntry, RemoteTier, TierPublish
    from trtet_store.export.tensorrt import BuildResult

log = logging.getLogger("trtet_store.engine_cache")

#: An export waits at most this many of its ``lease_ttl`` for another machine's build of
#: its key, then builds itself: 2 (600 s at the default ttl of 300 s). A lease that is
#: not renewed is taken over after one ttl (at most two, whatever ttl it claims), so the
#: bound matters only for a holder that keeps renewing and never publishes (a hung build,
#: or a bucket writer rewriting a lease of its own): it costs twice the lease's own bound,
#: not an hour. A build known to take longer passes ``wait_timeout=`` (or None).
WAIT_TIMEOUT_TTLS = 2.0
#: The default ``wait_timeout`` at the default ``lease_ttl``: ``WAIT_TIMEOUT_TTLS`` x 300 s.
DEFAULT_WAIT_TIMEOUT = WAIT_TIMEOUT_TTLS * DEFAULT_LEASE_TTL


class _TtlBound:
    """``wait_timeout``'s default: :data:`WAIT_TIMEOUT_TTLS` times the cache's ``lease_ttl``."""

    def __repr__(self) -> str:
        return f"{WAIT_TIMEOUT_TTLS:g} x lease_ttl"


_TTL_BOUND: Any = _TtlBound()

# What a cache directory can answer that means "no cache here now", never a failed export.
CACHE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                           errno.EDQUOT})


def compute_capability() -> str:
    """The GPU's compute capability, ``sm_<major><minor>`` or ``"no-gpu"`` (engine_key's)."""
    return engine_key.compute_capability()


def build_key(fingerprint: str, capability: str | None = None) -> str:
    """The cache key of a build: ``trt-<fingerprint>-<capability>``."""
    return engine_key.build_key(fingerprint, capability or compute_capability())


_engine_key = engine_key.engine_key


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
        Seconds to wait at most for another machine's build (default: twice
        ``lease_ttl``, :data:`WAIT_TIMEOUT_TTLS`; 600 s at the default ttl);
        then this machine builds too, and says so (a warning). None waits as
        long as the lease is renewed. A lease that is not renewed is taken
        over after its ttl, at most twice this cache's ``lease_ttl`` whatever
        ttl the lease claims. With ``trusted_keys``, only a lease signed by
        one of them holds the wait at all (another is ignored, said once,
        and taken over).
    signing_key : path-like, optional
        With ``remote=``: an ed25519 private key file (``trtet-store cache
        keygen``); every entry this cache publishes, and every build lease it
        claims, is signed with it.
        Default: ``TRTET_SIGNING_KEY``, else the config file's
        (:mod:`trtet_store.remote.keyconfig`).
    trusted_keys : sequence of path-like, optional
        With ``remote=``: public key files; a shared entry not signed by one
        of them is a miss (``remote_reason`` in its events), never served,
        and, when this cache signs, replaced by its own signed build
        (``If-Match`` that entry); another machine's build lease holds an
        export only when signed by one of them. Default:
        ``TRTET_TRUSTED_KEYS``, else the config file's, else none (every
        entry accepted). With or without keys, a build record is loaded only
        when it is data: one that asks for pickle, custom objects or code is
        a miss, never loaded (:mod:`.record_check`); without keys, a bucket
        writer can still put a program and engine bytes of their choosing
        into your ``.pte``.
    on_wait : callable, optional
        With ``remote=``: called with a :class:`~trtet_store.cache.tier.LeaseWait`
        at each look (every 2 s) while an export waits for another machine's
        build of its key (holder, host, pid, since when, seconds waited), and
        once more with ``over=True`` when the wait ends. The CLI draws a line
        from it on a terminal; the wait's start is also logged at WARNING.
    verify : {"seal", "full"}
        What a hit trusts. ``"seal"`` (default): a cached engine whose file
        identity (device, inode, size, mtime, ctime) is the one it was sealed
        with is served without reading it (any write, truncate or replace
        changes the identity, and such an entry is re-digested, and dropped
        and rebuilt if its bytes differ). ``"full"``: every hit is read and
        digested again, which also catches a media error that changes no
        identity (``trtet-store cache verify`` scrubs the whole cache so).

    Raises
    ------
    RemoteURLError
        ``remote`` is not an ``s3://bucket[/prefix]`` URL.
    PermissionError
        The directory (or a file in it) is another user's, or writable by others.
    ValueError, TypeError
        ``max_bytes`` not a positive int, ``min_free`` negative; ``lease_ttl``
        not > 0, ``wait_timeout`` negative; ``endpoint_url`` without a URL;
        ``verify`` not ``"seal"`` or ``"full"``.
    OSError
        The directory cannot be created (read-only parent): the message says so.
    """

    def __init__(self, directory: os.PathLike | str | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, min_free: int = DEFAULT_MIN_FREE,
                 remote: str | RemoteTier | None = None, endpoint_url: str | None = None,
                 lease_ttl: float = DEFAULT_LEASE_TTL,
                 wait_timeout: float | None = _TTL_BOUND, signing_key: Any = None,
                 trusted_keys: Any = None, read_only: bool = False,
                 verify: str = "seal",
                 on_wait: Callable[[LeaseWait], Any] | None = None) -> None:
        # Every argument is checked before the directory is touched or a tier is made.
        #: What a hit trusts, ``verify=`` ("seal" or "full").
        self.hit_verify = check_verify(verify)
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
        if wait_timeout is _TTL_BOUND:  # a RemoteTier given: its own lease_ttl is the one
            wait_timeout = WAIT_TIMEOUT_TTLS * float(
                lease_ttl if remote is None or isinstance(remote, str) else remote.lease_ttl)
        if wait_timeout is not None:
            if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
                raise TypeError(f"wait_timeout must be seconds or None, got "
                                f"{type(wait_timeout).__name__}")
            if math.isnan(wait_timeout) or wait_timeout < 0:
                raise ValueError(f"wait_timeout must be >= 0 seconds or None, got "
                                 f"{wait_timeout}")
        if on_wait is not None and not callable(on_wait):
            raise TypeError(f"on_wait must be callable or None, got {type(on_wait).__name__}")
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
        self.on_wait = on_wait
        self.remote: RemoteTier | None = tier if tier is not None else remote
        #: The two-level policy: this cache's local level and its shared tier.
        self.tiered = TieredCache(self.blobs, self.remote, self._accept, engine_key.places,
                                  voice=self._voice(),
                                  name=f"engine cache {self.directory}", logger=log)
        if tier is not None:  # this cache's own id and journals: a killed publish resumes
            self.tiered.adopt_tier(tier)
        # else: a RemoteTier given keeps its own origin, lease_ttl, journal (the caller's).
        # Why the last lookup of a key missed an entry it had (damaged), for its events.
        self._damaged: dict[str, str] = {}

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

    def lookup(self, key: str, *, kind: str | None = None) -> CachedBuild | None:
        """The complete build under ``key``, every entry pinned and checked, or None.

        ``kind``: the record's kind (a build's, or a structure entry's for a
        refit, :data:`~trtet_store.export.engine_refit.STRUCTURE_KIND`); a
        record of another kind is a miss. Default: the key's (a ``trt-s-``
        key is a structure entry's, so push and pull take them as builds).

        A record whose engines are missing, or whose engine entries hold other
        bytes than it recorded (size, digest), is a miss: never served.
        Damaged blobs are dropped by the blob cache (logged); the build is
        then rebuilt and put again.
        """
        if kind is None:
            kind = engine_key.STRUCTURE_RECORD_KIND \
                if key.startswith(engine_key.STRUCTURE_PREFIX) else RECORD_KIND
        self._damaged.pop(key, None)
        record = self.blobs.get(key, verify=self.hit_verify)
        if record is None:
            if key in self.blobs.dropped:
                self._damaged[key] = f"the cached entry was damaged (its record: " \
                                     f"{self.blobs.dropped.pop(key)})"
            return None
        engines: list[Hit] = []
        try:
            meta = record.metadata
            wanted = meta.get("engines")
            if meta.get("kind") != kind or not isinstance(wanted, list):
                log.warning("engine cache %s: entry %s is not a %s record; a miss",
                            self.directory, key, kind)
                record.close()
                return None
            for i, entry in enumerate(wanted):
                hit = self.blobs.get(_engine_key(key, i), verify=self.hit_verify)
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
                  reserve: int = 0, consume: bool = False,
                  record_extra: dict[str, Any] | None = None) -> list[PutResult]:
        """Cache ``built``'s engines, then its record (the commit point of the build), for
        this machine's GPU: :func:`.engine_put.put_build` on this cache's local level.

        Returns
        -------
        list of PutResult
            One per engine, then the record's (when the engines were stored).
        """
        return engine_put.put_build(self.blobs, key, built, fingerprint, compute_capability(),
                                    reserve=reserve, consume=consume, record_extra=record_extra)

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

    def touch_build(self, key: str, engines: int) -> None:
        """Make the build (or structure entry) ``key`` and its ``engines`` engine entries
        the most recently used, engines first (a record is never older than its engines).
        """
        for k in [*(_engine_key(key, i) for i in range(engines)), key]:
            self.blobs.touch(k)

    def drop_build(self, key: str, engines: int, reason: str) -> bool:
        """Drop the build (or structure entry) ``key``: its record first, then its
        ``engines`` engine entries (a record never names a missing engine). Never
        raises for a cache problem (logged: False)."""
        try:
            dropped = self.blobs.drop(key, reason)
            for i in range(engines):
                self.blobs.drop(_engine_key(key, i), reason)
        except OSError as exc:
            log.warning("engine cache %s: %s was not dropped (%s)", self.directory, key, exc)
            return False
        return dropped

    def damage(self, key: str) -> str | None:
        """Why the last :meth:`lookup` of ``key`` missed an entry it had (damaged), once."""
        return self._damaged.pop(key, None)

    # -- the shared tier (remote=) ----------------------------------------------------

    def origin(self) -> str:
        """This cache's id in the shared tier, kept in ``<directory>/remote-origin``
        (:meth:`TieredCache.origin`)."""
        return self.tiered.origin()

    def _accept(self, entry: RemoteEntry) -> str | None:
        """Why the shared ``entry`` is not served here (:func:`.engine_key.entry_problem`)."""
        return engine_key.entry_problem(entry, compute_capability())

    def _voice(self) -> Voice:
        """This cache's words for the tier's trouble (what the export's warnings say)."""
        prefix = f"engine cache {self.directory}: "

        def url() -> str:
            return self.remote.url if self.remote is not None else ""

        def failed(what: str, key: str, exc: BaseException, said: str | None) -> tuple[str, str]:
            from trtet_store.cache.tier.errors import public_name

            why = said or f"the shared cache {url()} was not usable ({what}: " \
                          f"{public_name(exc)}: {exc})"
            return prefix + (said or f"{why}; going on with the local cache only"), why

        def download_failed(key: str, exc: BaseException, seen: Any, directory: Path) -> str:
            from trtet_store.export import remote_miss

            return remote_miss.download_failed(key, exc, seen, directory)

        return Voice(
            failed=failed, works=lambda: f"{prefix}the shared cache {url()} works again",
            damaged=lambda key, exc: f"{prefix}the shared entry {key} is damaged, never "
                                     f"served: {exc}; building it here and replacing it",
            refused=lambda key, entry, why: f"{prefix}the shared entry {key} (from {entry.host}, "
            f"origin {entry.origin}) is refused, never served: {why}; building it here",
            not_served=lambda key, entry, why: f"{prefix}the shared entry {key} (from "
            f"{entry.host}, origin {entry.origin}) is a miss: {why}; building it here",
            placed=lambda name, key, put: None if name == "record" else
            f"{prefix}downloaded engine {name[1:]} of {key} ({put.size} bytes) cached by "
            f"{put.placement}", download_failed=download_failed)

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
            Build keys, or structure keys (default: every complete build and
            structure entry cached here).
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
        self._tier("push()")
        check_progress(progress, "push")
        from trtet_store.export import timing_cache, timing_entries

        if keys is None:
            wanted = sorted(e.key for e in self.entries() if e.metadata.get("kind") in
                            (RECORD_KIND, engine_key.STRUCTURE_RECORD_KIND))
            timing = sorted(e.key for e in self.entries()
                            if e.metadata.get("kind") == timing_cache.TIMING_KIND)
        else:
            wanted = key_list(keys, "push")
            timing = [k for k in wanted if k.startswith(timing_cache.TIMING_PREFIX)]
            wanted = [k for k in wanted if k not in timing]
            kinds = {e.key: e.metadata.get("kind") for e in self.entries()} if timing else {}
            for key in timing:  # checked with the rest, before anything is sent
                if kinds.get(key) != timing_cache.TIMING_KIND:
                    raise ValueError(f"{key!r} is not a timing cache in the engine cache "
                                     f"{self.directory}")
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
        tally = Tally(progress, sum(sizes.values()))
        out = []
        for key in wanted:
            with self.single_flight(key):
                cached = self.lookup(key)
                if cached is None:  # evicted since the check
                    raise ValueError(f"{key!r} left the engine cache {self.directory} (evicted) "
                                     "before it was pushed")
                with cached:
                    result = self.tiered.push(key, *tier_files(cached),
                                              progress=tally.key(sizes[key]))
            tally.settled(sizes[key])
            out.append(result)
        # Timing caches (kind timing): merged into the tier's, not first-writer-wins.
        return out + timing_entries.push_entries(self, timing)

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
        check_progress(progress, "pull")
        from trtet_store.export import timing_cache, timing_entries

        wanted = key_list(keys, "pull")
        timing = [k for k in wanted if k.startswith(timing_cache.TIMING_PREFIX)]
        wanted = [k for k in wanted if k not in timing]
        # Looked up and checked with the rest, before any download.
        facts = {key: timing_entries.pull_facts(self, key) for key in timing}
        entries: dict[str, RemoteEntry | None] = {}
        for key in wanted:
            cached = self.lookup(key)
            if cached is not None:
                cached.close()
                entries[key] = None
                continue
            entry = self.tiered.lookup(key)
            if entry is None:
                raise ValueError(f"{key!r} is in neither the engine cache {self.directory} nor "
                                 f"the shared tier {tier.url} (list it with `trtet-store cache "
                                 "list --remote`)")
            problem = self.tiered.check(key, entry)  # every key's, before any download
            if problem is not None:
                raise ValueError(f"the shared entry {key!r} cannot be used here: {problem}")
            entries[key] = entry
        # Timing caches: fetched, verified and merged into the local entry.
        out = [(k, timing_entries.pull_entry(self, k, facts[k])) for k in timing]
        if timing and not wanted:
            return out
        tally = Tally(progress, sum(e.size for e in entries.values() if e is not None))
        for key in wanted:
            entry = entries[key]
            if entry is None:
                out.append((key, 0))
                continue
            with self.single_flight(key):
                got = self.tiered.pull(key, entry, lambda k=key: self.lookup(k),
                                       progress=tally.key(entry.size))
                if got.hit is not None:
                    got.hit.close()
                downloaded, why = got.outcome.downloaded, got.why
                if why is not None:
                    raise RuntimeError(f"{key!r}: {downloaded} bytes downloaded from {tier.url}, "
                                       f"but not cached in {self.directory}: {why}")
            tally.settled(entry.size)
            out.append((key, downloaded))
        return out

    def export_timing_cache(self, destination: os.PathLike | str, key: str | None = None, *,
                            replace: bool = False) -> Any:
        """Write a merged TensorRT timing cache to a file, for ``trtexec --timingCacheFile``
        or TensorRT-LLM's ``--input_timing_cache``.

        ``key``: a timing entry's key (``trt-t-...``, or a prefix naming one);
        default this machine's (its GPU, TensorRT, CUDA and driver; refused
        when it has several, one per builder flag set). Digest-checked as it is
        copied out, written atomically, never over an existing file unless
        ``replace``. Returns a :class:`~.timing_entries.TimingExport`; see
        :func:`.timing_entries.export_entry` for what is refused.
        """
        from trtet_store.export import timing_entries

        return timing_entries.export_entry(self, destination, key, replace=replace)

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

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MIN_FREE",
    "DOWNLOADS",
    "ENGINE_KIND",
    "NO_GPU",
    "ORIGIN_FILE",
    "PENDING",
    "RECORD_KIND",
    "REMOTE_JOURNAL",
    "CachedBuild",
    "EngineCache",
    "EngineCacheEvent",
    "build_key",
    "compute_capability",
]

