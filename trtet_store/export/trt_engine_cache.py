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

Usage::

    from trtet_store.export.trt_engine_cache import for_torch_tensorrt

    cache = for_torch_tensorrt()            # or for_torch_tensorrt(trtet_store.EngineCache(...))
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
from typing import Any

from trtet_store.cache import BlobCache, PutResult
from trtet_store.export.engine_cache import NO_GPU, EngineCache
from trtet_store.export.engine_cache import compute_capability as compute_capability_of_this_gpu
from trtet_store.io import try_lock

log = logging.getLogger("trtet_store.cache")

__all__ = ["KIND", "detect_tensorrt_version", "for_torch_tensorrt"]

#: Metadata ``kind`` of the entries this adapter stores (upstream's pickled pack).
KIND = "torch_tensorrt.packed"
_UPSTREAM = "torch_tensorrt.dynamo._engine_cache"
_TRT_DIST = re.compile(r"^tensorrt(-cu\d+)?$")
_CAPABILITY = re.compile(r"(\d+)\.(\d)")


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


class _Adapter:
    """The methods the adapter adds to upstream's ``BaseEngineCache`` (see the module doc)."""

    def __init__(self, cache: BlobCache, *, tensorrt_version: str,
                 compute_capability: str) -> None:
        self.cache = cache
        self.tensorrt_version = tensorrt_version
        self.compute_capability = compute_capability
        #: The last save's outcome (stored, or skipped with its reason).
        self.last_put: PutResult | None = None

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
            self.last_put = cache.put(key, tmp, metadata)
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
        hit = self.cache.get(self.key_for(hash))
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

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({os.fspath(self.cache.directory)!r}, "
                f"max_bytes={self.cache.max_bytes}, tensorrt={self.tensorrt_version}, "
                f"sm={self.compute_capability})")


_CLASSES: dict[type, type] = {}


def _adapter_class(base: type) -> type:
    """The adapter as a subclass of ``base`` (upstream's BaseEngineCache), made once."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("TorchTensorRTEngineCache", (_Adapter, base), {"__module__": __name__})
        _CLASSES[base] = cls
    return cls


def for_torch_tensorrt(cache: EngineCache | BlobCache | os.PathLike | str | None = None, *,
                       max_bytes: int | None = None, tensorrt_version: str | None = None,
                       compute_capability: str | tuple[int, int] | None = None) -> Any:
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
    """
    try:
        base = importlib.import_module(_UPSTREAM).BaseEngineCache
    except ImportError as exc:
        raise ImportError(f"for_torch_tensorrt() needs torch-tensorrt ({_UPSTREAM}): {exc}; "
                          "install torch-tensorrt") from exc
    if isinstance(cache, (EngineCache, BlobCache)):
        if max_bytes is not None:
            raise TypeError(f"max_bytes= applies to a cache opened here; the "
                            f"{type(cache).__name__} given has its own bound "
                            f"({cache.max_bytes} bytes)")
        store = cache.blobs if isinstance(cache, EngineCache) else cache
    elif cache is None or isinstance(cache, (str, os.PathLike)):
        store = (EngineCache(cache) if max_bytes is None
                 else EngineCache(cache, max_bytes=max_bytes)).blobs
    else:
        raise TypeError(f"cache must be an EngineCache, a BlobCache, a directory or None, got "
                        f"{type(cache).__name__}")
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
    return _adapter_class(base)(store, tensorrt_version=tensorrt_version,
                                compute_capability=capability)
