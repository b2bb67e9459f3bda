"""A drop-in for Torch-TensorRT's ``custom_engine_cache=``, on the bounded, crash-safe cache.

Torch-TensorRT's own ``DiskEngineCache`` (2.14.0) writes ``<tmp>/torch_tensorrt_engine_cache/
<hash>/blob.bin`` with a plain ``open(..., "wb")``, shared by every user, with
entry sizes kept in a per-process dictionary. So a truncated blob after a
crash makes every later ``check`` raise, and a new process inserting into a
full cache credits 0 bytes per eviction and empties the directory without
caching anything. Its key has neither the TensorRT version nor the GPU.

:func:`for_torch_tensorrt` returns a subclass of
``torch_tensorrt.dynamo._engine_cache.BaseEngineCache`` (imported when it is
called, never at import time) that implements only ``save(hash, blob)`` and
``load(hash)``, as upstream asks of a custom cache, over a
:class:`~trtet_store.cache.BlobCache`:

- the key is upstream's hash plus the TensorRT version and the compute
  capability (sha256 of the three), so a cache shared between machines never
  hands an engine to another TensorRT or GPU;
- ``save`` is a put: temp file, fsync, rename under the cache-wide lock,
  bounded by bytes across processes, least recently *used* evicted, a skip
  (logged, never an exception) when the entry cannot be cached;
- ``load`` is a pinned hit (never evicted while read, its use recorded on
  disk) whose blob is checked against its seal; a torn, truncated or
  replaced entry is a miss, never handed to ``pickle.loads``;
- the directory is the user's own (0700, other users' files refused).

Upstream's ``insert``/``check`` (``pack`` + ``save``, ``load`` + ``pickle.loads``)
are inherited unchanged. The interface is ``bytes`` in and out, so ``save``
writes the packed bytes once to a temp file in the cache and enters them from
there (cloned where the filesystem can, else copied: ext4 writes them twice);
``load`` reads the entry into one ``bytes``.

The shared tier (issue 37). When the :class:`~trtet_store.EngineCache` given
(or opened here with ``remote=``) has a remote tier (``cache.remote``),
every machine of a team shares the entries, under the same key (so the same
TensorRT and GPU only), through the two-level policy
:class:`trtet_store.cache.tiered.TieredCache` (the engine cache's too) with
this adapter's own ``accept`` (:meth:`_Adapter._foreign`: the kind, TensorRT
version and compute capability of the entry's metadata):

- ``load`` on a local miss is :meth:`TieredCache.get`: the bucket's entry,
  verified, entered locally by a hard link and served as a local hit; a
  download the local cache cannot take is served once, then removed; a
  damaged, refused or foreign entry is a miss, replaced by the rebuild's
  ``save`` (``If-Match`` that entry only).
- ``save`` puts locally, then publishes the same bytes
  (:meth:`TieredCache.publish`). One winner rule at both levels: **the first
  writer wins**. In the bucket the pointer is written with
  ``If-None-Match: *``; in the local cache a key already cached keeps its
  entry (the save is skipped, ``last_put.reason`` says so): a sealed hit
  looked up just before the put, not a lock (a save killed there leaves only
  its temp file), so two saves racing inside one put may both land locally;
  the bucket still has one winner.
- The remote never fails a compile: the tier's errors
  (:data:`trtet_store.cache.tier.TIER_ERRORS`) are a warning, once until it
  works again, and the local cache alone. :attr:`last_remote` (a
  :class:`~trtet_store.cache.TierOutcome`) says what the last ``load``/``save`` did there.
- Trust (issue 44): upstream's ``check`` unpickles what ``load`` returns, so
  an entry from the bucket is code from whoever can write it. A shared tier
  is refused at construction (:class:`UntrustedBucketError`) unless it has
  trusted keys (``trusted_keys=``, ``TRTET_TRUSTED_KEYS`` or the config file:
  then an entry not signed by one of them is a miss, never unpickled) or the
  caller passes ``trust_bucket_writers=True``.

Usage::

    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    cache = for_torch_tensorrt()            # or for_torch_tensorrt(trtet_store.EngineCache(...))
    cache = for_torch_tensorrt(remote="s3://team-bucket/engines",   # shared through a bucket
                               trusted_keys=["ci.pub"], signing_key="ci.key")
    torch_tensorrt.compile(..., cache_built_engines=True, reuse_cached_engines=True,
                           custom_engine_cache=cache)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import logging
import os
import re
import uuid
from typing import Any, Protocol

from trtet_store.cache import BlobCache, PutResult, TieredCache, TierOutcome
from trtet_store.cache.tiered import Voice
from trtet_store.export.engine_key import (
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_BYTES,
    DEFAULT_MIN_FREE,
    NO_GPU,
)
from trtet_store.export.engine_key import compute_capability as compute_capability_of_this_gpu
from trtet_store.io import try_lock

log = logging.getLogger("trtet_store.cache")


class HasLevels(Protocol):
    """What the adapter takes of an :class:`~trtet_store.EngineCache`: its levels (this
    module never imports engine_cache, which imports it)."""

    @property
    def tiered(self) -> TieredCache: ...

__all__ = ["KIND", "RemoteOutcome", "UntrustedBucketError", "detect_tensorrt_version",
           "for_torch_tensorrt"]

#: The one file of an adapter entry in the bucket: upstream's packed bytes.
REMOTE_FILE = "blob"

#: Metadata ``kind`` of the entries this adapter stores (upstream's pickled pack).
KIND = "torch_tensorrt.packed"
_UPSTREAM = "torch_tensorrt.dynamo._engine_cache"
_TRT_DIST = re.compile(r"^tensorrt(-cu\d+)?$")
_CAPABILITY = re.compile(r"(\d+)\.(\d)")


class UntrustedBucketError(ValueError):
    """A shared tier without trusted keys, and ``trust_bucket_writers=True`` not passed.

    Upstream's ``BaseEngineCache.check`` unpickles what ``load`` returns, so
    whoever can write the bucket could run code on this machine.
    """


def detect_tensorrt_version() -> str:
    """The TensorRT version of this environment: ``tensorrt.__version__``, else its wheel's.

    Raises
    ------
    RuntimeError
        No TensorRT is installed (pass ``tensorrt_version=`` to
        :func:`for_torch_tensorrt`).
    """
    with contextlib.suppress(ImportError):
        return str(importlib.import_module("tensorrt").__version__)
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata.get("Name") or "").lower()
        if _TRT_DIST.match(name):
            return dist.version
    raise RuntimeError("no TensorRT found (neither `import tensorrt` nor a tensorrt wheel): "
                       "pass tensorrt_version= to for_torch_tensorrt()")


def _capability(value: object) -> str:
    """``"sm_90"`` (EngineCache's form) from ``"sm_90"``, ``"9.0"`` or ``(9, 0)``."""
    if isinstance(value, tuple) and len(value) == 2 and \
            all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return f"sm_{value[0]}{value[1]}"
    if isinstance(value, str):
        if (m := _CAPABILITY.fullmatch(value)) is not None:
            return f"sm_{m.group(1)}{m.group(2)}"
        if re.fullmatch(r"sm_\d{2,3}", value):
            return value
    raise ValueError(f"compute_capability must be 'sm_90', '9.0' or (9, 0), got {value!r}")


def _refuse_extra(method: str, args: tuple, kwargs: dict) -> None:
    # Upstream's signatures pass *args/**kwargs through insert/check to save/load;
    # ours take none, and an argument we would ignore silently is a caller's bug.
    if args or kwargs:
        given = [repr(a) for a in args] + [f"{k}=" for k in kwargs]
        raise TypeError(f"{method}() takes only (hash{', blob' if method == 'save' else ''}); "
                        f"got also {', '.join(given)}")


#: What the last ``load`` or ``save`` did with the shared tier (the old name of
#: :class:`trtet_store.cache.TierOutcome`, kept importable).
RemoteOutcome = TierOutcome


class _Adapter:
    """The methods the adapter adds to upstream's ``BaseEngineCache`` (see the module doc)."""

    def __init__(self, cache: BlobCache, *, tensorrt_version: str,
                 compute_capability: str, remote: Any = None) -> None:
        self.cache = cache
        self.tensorrt_version = tensorrt_version
        self.compute_capability = compute_capability
        #: The shared tier (a RemoteTier), or None: the local cache alone.
        self.remote = remote
        #: The last save's outcome (stored, or skipped with its reason).
        self.last_put: PutResult | None = None
        #: What the last load or save did with the shared tier (None: not asked).
        self.last_remote: TierOutcome | None = None
        #: The two-level policy (the engine cache's), with this adapter's accept and words.
        self.tiered = TieredCache(cache, remote, self._foreign, self._places, voice=self._voice(),
                                  name="engine cache", logger=log)

    def key_for(self, hash: str) -> str:  # noqa: A002 - upstream's parameter name
        """The cache key of upstream's ``hash`` on this TensorRT and GPU."""
        if not isinstance(hash, str) or not hash:
            raise TypeError(f"hash must be a non-empty str (upstream's get_hash), got {hash!r}")
        h = hashlib.sha256()
        for part in ("torch_tensorrt", hash, self.tensorrt_version, self.compute_capability):
            h.update(part.encode())
            h.update(b"\0")
        # The capability is in the digest and, readable, at the end (as EngineCache's keys).
        return f"torch_tensorrt-{h.hexdigest()}-{self.compute_capability}"

    def save(self, hash: str, blob: bytes, *args: Any, **kwargs: Any) -> None:  # noqa: A002
        """Store upstream's packed ``blob`` under ``hash``: complete or not at all, bounded.

        A blob the cache cannot take (larger than the bound, no room, no
        space, a read-only cache) is skipped and logged: a cache never fails
        a compile. :attr:`last_put` says what happened.
        """
        _refuse_extra("save", args, kwargs)
        key = self.key_for(hash)
        try:
            view = memoryview(blob).cast("B")
        except TypeError:
            raise TypeError(f"blob must be bytes-like (upstream's pack), got "
                            f"{type(blob).__name__}") from None
        size = view.nbytes
        cache = self.cache
        reason = None
        if cache.read_only:
            reason = f"the cache {cache.directory} is on a read-only filesystem or not writable"
        elif size > cache.max_bytes:
            reason = (f"{size} bytes is larger than the cache's bound of {cache.max_bytes} "
                      "bytes")
        if reason is not None:  # skipped before writing a byte
            log.warning("engine cache: torch-tensorrt entry %s not stored: %s", hash[:16], reason)
            self.last_put = PutResult(key=key, stored=False, size=size, reason=reason)
            return
        # The bytes go to a temp file of the cache's own tmp/, flocked while we live
        # (the cache's recovery removes it if we die), then are put from there.
        tmp = cache.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
        fd = None
        try:
            fd = try_lock(tmp, create=True)
            if fd is None:  # a fresh uuid name: nobody else can hold it
                raise OSError(f"temp file {tmp} is locked by another process")
            os.fchmod(fd, 0o600)
            done = 0
            while done < size:
                done += os.pwrite(fd, view[done:], done)
            # As EngineCache's records name theirs, so `trtet-store cache list` shows both.
            metadata = {"kind": KIND, "torch_tensorrt_hash": hash,
                        "versions": [["tensorrt", self.tensorrt_version]],
                        "compute_capability": self.compute_capability}
            self.last_put = self._put_first(key, tmp, metadata, size)
            if self.remote is not None:
                # From the temp file, still ours (flocked): the bytes just put. A put the
                # bound skipped still publishes: other machines may have room for it.
                self._publish(key, tmp, metadata, self.last_put)
        except OSError as exc:
            # No space for the temp file, a permission problem: a skip, as the cache's own.
            reason = f"{os.strerror(exc.errno) if exc.errno else exc} writing {tmp}"
            log.warning("engine cache: torch-tensorrt entry %s not stored: %s", hash[:16], reason)
            self.last_put = PutResult(key=key, stored=False, size=size, reason=reason)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if fd is not None:
                os.close(fd)

    def load(self, hash: str, *args: Any, **kwargs: Any) -> bytes | None:  # noqa: A002
        """Upstream's packed bytes under ``hash`` on this TensorRT and GPU, or None (a miss).

        The entry is pinned while it is read (never evicted under us) and
        checked against its seal first: a torn, truncated or replaced entry
        is dropped and missed, so upstream's ``check`` never unpickles it.
        """
        _refuse_extra("load", args, kwargs)
        key = self.key_for(hash)
        hit = self.cache.get(key)
        if hit is None and self.remote is not None:
            return self._load_remote_once(key)
        return _read(hit)

    def _put_first(self, key: str, path: os.PathLike | str, metadata: dict[str, Any],
                   size: int) -> PutResult:
        """The local put, first writer wins (as the bucket): a key cached keeps its entry.

        The check is a pinned, sealed hit just before the put (no lock file is
        made: a save killed here leaves only its temp file). Two saves of one
        key racing inside the same put may both land; both are builds of that
        key, and the bucket still has one winner.
        """
        hit = self.cache.get(key)
        if hit is not None:
            hit.close()
            reason = f"{key} is already cached (the first writer wins: its entry is kept)"
            log.info("engine cache: torch-tensorrt entry %s not stored: %s", key[:30], reason)
            return PutResult(key=key, stored=False, size=size, reason=reason)
        return self.cache.put(key, path, metadata)

    # -- the shared tier ------------------------------------------------------------------

    def _voice(self) -> Voice:
        def url() -> str:
            return self.remote.url if self.remote is not None else ""

        def failed(what: str, key: str, exc: BaseException, said: str | None
                   ) -> tuple[str, str]:
            reason = f"{type(exc).__name__}: {exc}"
            doing = "publishing" if what == "publish" else "looking up"
            return (f"engine cache: the shared tier {url()} failed {doing} {key} ({reason}); "
                    "the local cache alone is used until it works again"), reason

        def checks(key: str, why: object) -> str:
            return (f"engine cache: the shared entry {key} failed its checks, never served: "
                    f"{why}; a miss (the rebuild replaces it)")

        return Voice(failed=failed, works=lambda: f"engine cache: the shared tier {url()} "
                     "works again", damaged=checks,
                     refused=lambda key, entry, why: checks(key, f"refused: {why}"),
                     not_served=lambda key, entry, why: f"engine cache: the shared entry {key} "
                     f"is not for this machine ({why}): a miss",
                     placed=lambda name, key, put: f"engine cache: downloaded {key} "
                     f"({put.size} bytes) cached by {put.placement}")

    def _foreign(self, entry: Any) -> str | None:
        """Why the bucket's ``entry`` must not be served here, or None (this adapter's accept)."""
        meta = entry.metadata if isinstance(entry.metadata, dict) else {}
        versions = meta.get("versions")
        tensorrt = dict(map(tuple, versions)).get("tensorrt") if isinstance(versions, list) \
            and all(isinstance(v, list) and len(v) == 2 for v in versions) else None
        if meta.get("kind") != KIND:
            return f"its kind is {meta.get('kind')!r}, not {KIND!r}"
        if meta.get("compute_capability") != self.compute_capability:
            return (f"built for {meta.get('compute_capability')!r}, this GPU is "
                    f"{self.compute_capability!r}")
        if tensorrt != self.tensorrt_version:
            return f"built with TensorRT {tensorrt!r}, this one is {self.tensorrt_version!r}"
        if [f.get("name") for f in entry.files] != [REMOTE_FILE]:
            return f"its files are {[f.get('name') for f in entry.files]}, not [{REMOTE_FILE!r}]"
        return None

    def _places(self, entry: Any) -> list[tuple[str, str, dict[str, Any]]]:
        """The entry's one file, entered under its key with this machine's metadata."""
        return [(REMOTE_FILE, entry.key, {
            "kind": KIND, "torch_tensorrt_hash": entry.metadata.get("torch_tensorrt_hash"),
            "versions": [["tensorrt", self.tensorrt_version]],
            "compute_capability": self.compute_capability})]

    def _load_remote_once(self, key: str) -> bytes | None:
        """The bucket's entry under the key's build lock: one download per key per machine.

        Two processes of this machine missing the same key at once would
        download into the same ``downloads/<key>/`` (and remove each other's
        files); the second waits for the first (its flock dies with it) and
        then finds the entry locally, asking the bucket nothing.
        """
        with contextlib.ExitStack() as stack:
            try:
                claim = stack.enter_context(self.cache.single_flight(key))
            except OSError as exc:  # a read-only cache has no lock file to take: unguarded
                log.debug("engine cache: no build lock for %s (%s)", key, exc)
                claim = None
            if claim is not None and claim.hit is not None:
                return _read(self.cache.get(key))  # entered meanwhile by another process
            got = self.tiered.get(key, local=lambda: self.cache.get(key))
            self.last_remote = got.outcome
            if got.download is not None:  # verified, but the local cache could not take it
                with got.download, open(got.download.paths[REMOTE_FILE], "rb",
                                        buffering=0) as f:
                    return f.readall()
            return _read(got.hit)

    def _publish(self, key: str, path: os.PathLike | str, metadata: dict[str, Any],
                 put: PutResult | None) -> None:
        """Publish the bytes at ``path`` under ``key``: first wins; never raises."""
        files: list[tuple[Any, ...]] = [(REMOTE_FILE, path)]
        if put is not None and put.stored and put.digest is not None:
            files = [(REMOTE_FILE, path, put.digest)]  # digested by the put: not read again
        self.last_remote, _ = self.tiered.publish(key, files, metadata)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({os.fspath(self.cache.directory)!r}, "
                f"max_bytes={self.cache.max_bytes}, tensorrt={self.tensorrt_version}, "
                f"sm={self.compute_capability})")


def _read(hit: Any) -> bytes | None:
    """A pinned hit's bytes as one ``bytes`` (None: no hit, or a file shorter than sealed)."""
    if hit is None:
        return None
    with hit:
        fd = os.dup(hit.fileno())
        os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "rb", buffering=0) as f:  # readall: one bytes, sized by fstat
            data = f.readall()
    if len(data) != hit.size:  # the pinned file cannot shrink unless damaged
        log.warning("engine cache: %s read %d bytes, sealed %d: a miss", hit.key,
                    len(data), hit.size)
        return None
    return data


def _refuse_untrusted(url: str) -> None:
    raise UntrustedBucketError(
        f"for_torch_tensorrt: the shared tier {url} is refused: Torch-TensorRT unpickles "
        "cache entries (pickle.loads in BaseEngineCache.check), so anyone who can write that "
        "bucket could run code here; pass trusted_keys=[PUBLIC_KEY_FILE, ...] (entries "
        "signed by those keys only: `trtet-store cache keygen`) or trust_bucket_writers=True")


_CLASSES: dict[type, type] = {}


def _adapter_class(base: type) -> type:
    """The adapter as a subclass of ``base`` (upstream's BaseEngineCache), made once."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("TorchTensorRTEngineCache", (_Adapter, base), {"__module__": __name__})
        _CLASSES[base] = cls
    return cls


def for_torch_tensorrt(cache: HasLevels | BlobCache | os.PathLike | str | None = None, *,
                       max_bytes: int | None = None, tensorrt_version: str | None = None,
                       compute_capability: str | tuple[int, int] | None = None,
                       remote: str | None = None, endpoint_url: str | None = None,
                       signing_key: Any = None, trusted_keys: Any = None,
                       trust_bucket_writers: bool = False) -> Any:
    """A ``BaseEngineCache`` for ``torch_tensorrt.compile(..., custom_engine_cache=)``.

    Parameters
    ----------
    cache : EngineCache, BlobCache, path-like or None
        The store: an :class:`~trtet_store.EngineCache` (its entries live
        beside the export's, under one bound), its :class:`BlobCache`, or a
        directory (None: the per-user default,
        ``$XDG_CACHE_HOME/trtet_store/engines``) opened as an ``EngineCache``.
    max_bytes : int, optional
        The bound of a cache opened here (default EngineCache's); refused
        with a cache given (it has its own).
    tensorrt_version : str, optional
        Default: this environment's (:func:`detect_tensorrt_version`).
    compute_capability : str or (int, int), optional
        ``"sm_90"``, ``"9.0"`` or ``(9, 0)``; default: the current GPU's
        (:func:`trtet_store.export.engine_cache.compute_capability`).
    remote : str, optional
        ``s3://bucket[/prefix]``: the shared tier of a cache opened here
        (``EngineCache(..., remote=)``). An ``EngineCache`` given brings its
        own (``cache.remote``); a ``BlobCache`` has none.
    endpoint_url : str, optional
        The S3 endpoint of ``remote`` (default: what boto3 finds).
    signing_key, trusted_keys : optional
        Of a cache opened here with ``remote=`` (as EngineCache's; default:
        ``TRTET_SIGNING_KEY``, ``TRTET_TRUSTED_KEYS``, the config file).
    trust_bucket_writers : bool
        A shared tier without trusted keys is refused unless this is True:
        upstream's ``check`` unpickles entries, so anyone who can write the
        bucket could run code here. With trusted keys, only entries signed
        by one of them are ever loaded.

    Returns
    -------
    TorchTensorRTEngineCache
        An instance of a subclass of ``torch_tensorrt.dynamo._engine_cache.BaseEngineCache``.

    Raises
    ------
    ImportError
        torch-tensorrt is not installed.
    RuntimeError
        No TensorRT or no GPU was found and none was given.
    UntrustedBucketError
        A shared tier without trusted keys, and ``trust_bucket_writers`` not True.
    """
    try:
        base = importlib.import_module(_UPSTREAM).BaseEngineCache
    except ImportError as exc:
        raise ImportError(f"for_torch_tensorrt() needs torch-tensorrt ({_UPSTREAM}): {exc}; "
                          "install torch-tensorrt") from exc
    if endpoint_url is not None and remote is None:
        raise TypeError("endpoint_url= applies to remote=; no remote was given")
    if not isinstance(trust_bucket_writers, bool):
        raise TypeError(f"trust_bucket_writers must be True or False, got "
                        f"{trust_bucket_writers!r}")
    if (signing_key is not None or trusted_keys is not None) and remote is None:
        raise TypeError("signing_key= and trusted_keys= apply to remote=; an EngineCache "
                        "given brings its own (EngineCache(directory, remote=..., "
                        "trusted_keys=...))")
    # An EngineCache (or any cache holding a TieredCache) brings its levels; a BlobCache,
    # its local level alone. Duck-typed: this module never imports engine_cache.
    levels = getattr(cache, "tiered", None)
    opened_tier = None
    if isinstance(levels, TieredCache) or isinstance(cache, BlobCache):
        if max_bytes is not None:
            raise TypeError(f"max_bytes= applies to a cache opened here; the "
                            f"{type(cache).__name__} given has its own bound "
                            f"({cache.max_bytes} bytes)")
        if remote is not None:
            raise TypeError(f"remote= applies to a cache opened here; open the "
                            f"{type(cache).__name__} as EngineCache(directory, remote=...) "
                            "and pass that")
        store = levels.local if isinstance(levels, TieredCache) else cache
        tier = levels.tier if isinstance(levels, TieredCache) else None
    elif cache is None or isinstance(cache, (str, os.PathLike)):
        tier = None
        if remote is not None:
            from trtet_store.cache.tier import RemoteTier, RemoteURL, resolve_keys

            if isinstance(remote, str):  # a bad URL is refused first, as EngineCache would
                RemoteURL.parse(remote.rstrip("/") + "/x")
            # Keys loaded, and the trust refused, before the cache directory is opened.
            signing, trusted = resolve_keys(signing_key, trusted_keys)
            if trusted is None and not trust_bucket_writers:
                _refuse_untrusted(remote)
            # As EngineCache(remote=) makes it: its lease, and a waiter's poll.
            tier = opened_tier = RemoteTier(
                remote, endpoint_url=endpoint_url, lease_ttl=DEFAULT_LEASE_TTL,
                poll=min(2.0, DEFAULT_LEASE_TTL / 4), signing_key=signing,
                trusted_keys=None if trusted is None else list(trusted.values()))
        store = BlobCache(cache, max_bytes=DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                          min_free=DEFAULT_MIN_FREE)
    else:
        raise TypeError(f"cache must be an EngineCache, a BlobCache, a directory or None, got "
                        f"{type(cache).__name__}")
    if tier is not None and tier.trusted_keys is None and not trust_bucket_writers:
        _refuse_untrusted(tier.url)
    if tensorrt_version is None:
        tensorrt_version = detect_tensorrt_version()
    elif not isinstance(tensorrt_version, str) or not tensorrt_version:
        raise ValueError(f"tensorrt_version must be a non-empty str, got {tensorrt_version!r}")
    if compute_capability is None:
        capability = compute_capability_of_this_gpu()
        if capability == NO_GPU:
            raise RuntimeError("no CUDA device to read a compute capability from: pass "
                               "compute_capability= (e.g. 'sm_90') to for_torch_tensorrt()")
    else:
        capability = _capability(compute_capability)
    made = _adapter_class(base)(store, tensorrt_version=tensorrt_version,
                                compute_capability=capability, remote=tier)
    if opened_tier is not None:  # this cache's own origin and journals, as EngineCache's
        made.tiered.adopt_tier(opened_tier)
    return made
