"""BlobCache: a bounded, single-flight, crash-safe directory of blobs keyed by opaque strings.

Built on ``trtet_store.io``'s public face only; it knows nothing of TensorRT
(what a key means is the caller's: ``export/`` makes engine keys).

Why each piece is shaped as it is:

- **Content addressed.** A blob file is named by its xxh3-128 digest and
  size; key records reference it, so identical bytes under two keys are
  stored once. A blob goes when no record references it.
- **Complete or absent.** Bytes go to a temp file in ``tmp/`` (cloned from
  the source where the filesystem allows, else copied; hard linked with
  ``consume=True``), fsynced, digested, then renamed into
  ``blobs/`` and recorded, each step durable before the next is visible.
  Each temp file is flocked by its writer (a seal's or a record's is
  written under the cache-wide lock, with io's ``write_atomic``), so
  recovery removes only the temp files of dead writers.
- **One cache-wide lock** (``lock``) serializes commits, evictions and
  recovery, so N processes inserting at once keep the bound: the room is
  checked, made and taken in one critical section. Copies run outside it.
- **Pins.** A :class:`Hit` holds a shared flock on its blob; eviction
  (:mod:`.evict`) takes an exclusive one without waiting and skips an entry
  it cannot lock.
- **Use on disk.** A hit appends one byte to ``keys/<key>.use`` and stamps
  its mtime, so "least recently used" is the same for every process (and
  ``hits`` is that file's size).
- **Sealed.** A blob's seal (``blobs/<name>.json``) records its identity
  (device, inode, size, mtime, ctime) and digests. A hit compares the
  identity (one ``stat``); a changed identity costs a full re-digest, and
  bytes that differ are dropped, logged and never served.

The put path is in :mod:`.put`; eviction and prune in :mod:`.evict`; verify,
recover and clear in :mod:`.check` (mixins of :class:`BlobCache`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.cache.check import Checks
from trtet_store.cache.directory import open_cache_directory
from trtet_store.cache.downloads import DownloadSweep
from trtet_store.cache.evict import Eviction
from trtet_store.cache.layout import (
    check_key,
    default_directory,
    is_blob_name,
    refuse_foreign,
)
from trtet_store.cache.put import Puts
from trtet_store.cache.results import (
    CacheWaitTimeout,
    Hit,
    PutResult,
)
from trtet_store.cache.summary import Summary
from trtet_store.io import (
    Blob,
    Digests,
    MiB,
    UnsafeLockFileError,
    file_identity,
    try_lock,
    unlock_file,
    write_atomic,
)

log = logging.getLogger("trtet_store.cache")

DEFAULT_CHUNK_SIZE = MiB


#: What a hit trusts (``BlobCache.get(verify=)``, ``EngineCache(verify=)``): its seal, or a
#: full re-read of its bytes.
VERIFY_MODES = ("seal", "full")


def check_verify(verify: object) -> str:
    """``verify`` if it is one of :data:`VERIFY_MODES`; TypeError or ValueError otherwise."""
    if not isinstance(verify, str):
        raise TypeError(f"verify must be one of {', '.join(map(repr, VERIFY_MODES))}, got "
                        f"{type(verify).__name__} {verify!r}")
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be 'seal' (trust a hit whose file identity is the one "
                         f"it was sealed with: no byte read) or 'full' (re-read and re-digest "
                         f"every hit), got {verify!r}")
    return verify


@dataclass
class _Entry:
    """A key record as read from disk (under the lock or not)."""

    key: str
    blob: str
    size: int
    created: float
    metadata: dict[str, Any]
    last_use_ns: int
    hits: int


class Claim:
    """The single-flight claim on a key (see :meth:`BlobCache.single_flight`).

    ``hit`` is the entry when it exists once the claim is held (another
    process built it while we waited): use it and skip the build. Otherwise
    build, then :meth:`put`. ``hit`` is closed when the ``with`` block ends.
    """

    def __init__(self, cache: BlobCache, key: str, waited: float) -> None:
        self.cache = cache
        self.key = key
        self.waited = waited
        self.hit: Hit | None = None

    def put(self, source: os.PathLike | str | Blob, metadata: Mapping[str, Any] | None = None,
            *, consume: bool = False, digests: Digests | None = None) -> PutResult:
        """:meth:`BlobCache.put` under this claim's key."""
        return self.cache.put(self.key, source, metadata, consume=consume, digests=digests)


class BlobCache(Puts, Eviction, Checks):
    """A bounded directory of blobs keyed by opaque strings, safe across processes.

    Parameters
    ----------
    directory : path-like, optional
        The cache directory. Default :func:`default_directory`
        (``$XDG_CACHE_HOME/trtet_store/engines``, else
        ``~/.cache/trtet_store/engines``), created with mode 0700 (its
        missing parents too, whatever the umask) and tagged with a
        ``CACHEDIR.TAG``. A symbolic link, or an existing directory that is
        not empty and not a trtet_store cache, is refused with
        :class:`~trtet_store.cache.CacheDirectoryError`; a directory (or any
        file in it) owned by another user, or writable by others, with
        PermissionError.
    max_bytes : int
        The bound: the distinct blobs' sizes (identical bytes counted once)
        never exceed it after a commit. Must be positive (there is no
        "disabled" value: to cache nothing, pass no cache).
    min_free : int
        Bytes the filesystem keeps free: a put evicts, or skips, rather than
        leave less.
    chunk_size : int
        The span of each chunk digest recorded with a blob (1 MiB, as io's).
    read_only : bool
        Open to look only: nothing is created (no directory, tag, lock or
        subdirectory), nothing is removed (no recovery, no drop of a damaged
        entry), hits are not stamped, puts are skipped. A missing directory
        is FileNotFoundError.

    Notes
    -----
    Opening the cache to write runs :meth:`recover` (temp files of dead
    writers, records whose blob is gone, blobs no record references). On a
    read-only filesystem the cache opens as with ``read_only=True``.
    """

    def __init__(self, directory: os.PathLike | str | None = None, *, max_bytes: int,
                 min_free: int = 0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 read_only: bool = False) -> None:
        for name, value, low in (("max_bytes", max_bytes, 1), ("min_free", min_free, 0),
                                 ("chunk_size", chunk_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int number of bytes, got {value!r}")
            if value < low:
                raise ValueError(
                    f"{name} must be {'positive' if low else 'zero or more'} bytes, got {value}"
                    + ("; a cache of 0 bytes can hold nothing: to disable caching, pass no "
                       "cache" if name == "max_bytes" else ""))
        self.max_bytes = max_bytes
        self.min_free = min_free
        self.chunk_size = chunk_size
        #: key -> why get() dropped its entry (damaged): what a rebuild's report says.
        self.dropped: dict[str, str] = {}
        self.directory = (default_directory() if directory is None
                          else Path(directory)).absolute()
        try:
            # A link, another user's directory or one that is not a cache is refused here,
            # before anything in it is read, created or removed (cache/directory.py).
            writable = open_cache_directory(self.directory, create=not read_only)
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES):
                raise
            raise OSError(exc.errno, f"cannot create the engine cache {self.directory}: "
                          f"{os.strerror(exc.errno)}; pass a writable directory=",
                          os.fspath(self.directory)) from None
        self.read_only = not writable
        # Recovery removes what it does not recognise: only on a write open (never on a
        # read-only one such as `trtet-store cache list`), in a directory checked above.
        #: The last clear, prune or recover's sweep of partial downloads (cache/downloads.py).
        self.swept = DownloadSweep()
        #: The used bytes and last-use order the bound needs (cache/summary.py).
        self._summary = Summary(self.directory, lambda: (
            (e.key, e.blob, e.size, e.last_use_ns) for e in self._scan()))
        # Not the partial downloads here: the next remote hit of their key resumes them.
        self.recovered: list[Path] = [] if self.read_only else self.recover(downloads=False)

    # -- paths ----------------------------------------------------------------

    def _record(self, key: str) -> Path:
        return self.directory / "keys" / f"{key}.json"

    def _use(self, key: str) -> Path:
        return self.directory / "keys" / f"{key}.use"

    def _blob(self, name: str) -> Path:
        return self.directory / "blobs" / name

    def _seal(self, name: str) -> Path:
        return self.directory / "blobs" / f"{name}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The cache-wide lock: commits, evictions, drops and recovery run under it."""
        fd = try_lock(self.directory / "lock", create=True, wait=True)
        self._summary.begin()  # others may have changed the records since we last held it
        try:
            yield
        finally:
            os.close(fd)

    def _write_json(self, path: Path, data: Mapping[str, Any]) -> None:
        """Write ``path`` complete or not at all (io's :func:`~trtet_store.io.write_atomic`).

        Its temp file is made in ``tmp/``, where recovery removes what a kill
        left; every caller holds the cache-wide lock, so no recovery runs meanwhile.
        """
        write_atomic(path, json.dumps(data, sort_keys=True).encode(),
                     temp_dir=self.directory / "tmp")

    # -- reading records --------------------------------------------------------

    def _read_entry(self, key: str) -> _Entry | None:
        """The key's record, or None when it is missing; ValueError when it is unreadable."""
        path = self._record(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                refuse_foreign(path, st, "record")
                raw = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"unreadable record {path}: {exc}") from None
        try:
            if raw["key"] != key or not is_blob_name(raw["blob"]):
                raise ValueError(f"record {path} names key {raw['key']!r} blob {raw['blob']!r}")
            entry = _Entry(key=key, blob=raw["blob"], size=int(raw["size"]),
                           created=float(raw["created"]), metadata=dict(raw["metadata"]),
                           last_use_ns=int(raw["created"] * 1e9), hits=0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable record {path}: {exc}") from None
        try:
            ust = os.stat(self._use(key))
        except FileNotFoundError:
            pass
        else:
            entry.last_use_ns, entry.hits = ust.st_mtime_ns, ust.st_size
        return entry

    def _read_seal(self, name: str) -> dict[str, Any] | None:
        path = self._seal(name)
        try:
            with open(path, "rb") as f:
                refuse_foreign(path, os.fstat(f.fileno()), "seal")
                seal = json.loads(f.read())
            seal["identity"] = tuple(seal["identity"])
            seal["chunk_digests"] = tuple(seal["chunk_digests"])
            int(seal["size"]), str(seal["digest"]), int(seal["chunk_size"])
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
            return None
        return seal

    def _scan(self) -> list[_Entry]:
        """Every readable record (unreadable ones are left to :meth:`recover`)."""
        out = []
        try:
            names = os.listdir(self.directory / "keys")
        except FileNotFoundError:  # a read-only open of an empty (adoptable) directory
            return out
        for name in sorted(names):
            if not name.endswith(".json"):
                continue
            key = name[:-5]
            with contextlib.suppress(ValueError):
                entry = self._read_entry(key)
                if entry is not None:
                    out.append(entry)
        return out

    # -- get --------------------------------------------------------------------

    def get(self, key: str, *, verify: str = "seal") -> Hit | None:
        """The entry under ``key``, pinned, or None.

        An entry whose blob no longer matches its seal (size; identity, then
        a full re-digest; the digest) is dropped, logged, and None is
        returned: it is never served. A hit records its use on disk.

        ``verify``: what a hit trusts (:data:`VERIFY_MODES`). ``"seal"``: the
        blob's identity (device, inode, size, mtime, ctime) is the one it was
        sealed with, so its bytes are the sealed ones; no byte is read.
        ``"full"``: the whole blob is read and digested again as well (what
        a media error that changes no identity needs; ``verify()`` does it
        for every entry).
        """
        check_key(key)
        check_verify(verify)
        try:
            entry = self._read_entry(key)
        except ValueError as exc:
            self._drop_key(key, str(exc))
            return None
        if entry is None:
            return None
        seal = self._read_seal(entry.blob)
        if seal is None or int(seal["size"]) != entry.size:
            self._drop_key(key, f"its blob {entry.blob} has no valid seal", entry.blob)
            return None
        path = self._blob(entry.blob)
        try:
            # The pin. Blocking: an eviction holds the exclusive lock only to unlink.
            fd = try_lock(path, create=False, readonly=True, wait=True, shared=True)
        except FileNotFoundError:
            if not os.path.lexists(path):
                self._drop_key(key, f"its blob {path} is gone", entry.blob)
            return None  # else replaced while we waited (a put repaired it): a miss
        except UnsafeLockFileError:  # a link or a special file, never followed or opened
            self._drop_key(key, "the blob is not a regular file", entry.blob)
            return None
        try:
            st = os.fstat(fd)
            refuse_foreign(path, st, "blob")
            # Still the entry? An eviction may have removed it before we locked.
            try:
                again = self._read_entry(key)
                same = again is not None and again.blob == entry.blob and \
                    os.path.samestat(os.stat(path), st)
            except (FileNotFoundError, ValueError):
                same = False
            if not same:
                os.close(fd)
                return None
            resealed = verified = False
            problem = self._check_blob(fd, st, seal)
            if problem == "identity" or (problem is None and verify == "full"):
                changed, verified = problem == "identity", True
                problem = self._redigest(fd, seal)
                if problem is None and changed:
                    resealed = True
                    self._reseal(entry.blob, seal, st)
            if problem is not None:
                os.close(fd)
                self.dropped[key] = problem
                self._drop_blob(entry.blob, f"entry {key!r}: {problem}", st)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._stamp(key)
        return Hit(key=key, path=path, fd=fd, size=entry.size, digest=seal["digest"],
                   chunk_size=int(seal["chunk_size"]), chunk_digests=seal["chunk_digests"],
                   metadata=entry.metadata, created=entry.created, hits=entry.hits,
                   resealed=resealed, identity=file_identity(st), verified=verified)

    def touch(self, key: str) -> bool:
        """Make ``key``'s entry the most recently used (its use stamp to now), counting no hit.

        For an entry another one depends on in its owner's eyes (a refit's structure
        entry, touched with each use of its builds: eviction takes them first).
        Returns whether the entry had a use stamp to set (no entry: nothing made).
        """
        if self.read_only:
            return False
        try:
            fd = os.open(self._use(key), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
                         | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
        except OSError as exc:  # costs LRU precision, never a hit
            log.debug("could not touch %s: %s", key, exc)
            return False
        finally:
            os.close(fd)
        return True

    def _stamp(self, key: str) -> None:
        """Record a use on disk: one byte appended (hits) and the mtime set to now (LRU)."""
        if self.read_only:
            return
        path = self._use(key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            try:
                os.write(fd, b"h")
                now = time.time_ns()
                os.utime(fd, ns=(now, now))
            finally:
                os.close(fd)
        except OSError as exc:  # a use not recorded costs LRU precision, never a hit
            log.debug("could not stamp the use of %s: %s", key, exc)

    # -- single flight ------------------------------------------------------------

    @contextlib.contextmanager
    def single_flight(self, key: str, *, timeout: float | None = None) -> Iterator[Claim]:
        """Hold ``key``'s build lock: one builder per key across processes.

        A process that finds the key claimed waits until the holder leaves
        its block (then ``claim.hit`` is the entry it stored) or dies (the
        ``flock`` dies with it, and this process builds in its place).

        Raises
        ------
        CacheWaitTimeout
            The holder kept it longer than ``timeout`` seconds.
        """
        check_key(key)
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        lock_path = self.directory / "flights" / f"{key}.lock"
        start = time.monotonic()
        fd = None
        if self.read_only:
            pass  # nothing to build into, nothing created: the hit, if any
        elif timeout is None:
            fd = try_lock(lock_path, create=True, wait=True)
        else:
            while (fd := try_lock(lock_path, create=True)) is None:
                if time.monotonic() - start >= timeout:
                    raise CacheWaitTimeout(key, time.monotonic() - start, lock_path)
                time.sleep(0.02)
        claim = Claim(self, key, 0.0 if fd is None else time.monotonic() - start)
        try:
            claim.hit = self.get(key)
            yield claim
        finally:
            if claim.hit is not None:
                claim.hit.close()
            if fd is not None:
                unlock_file(fd, lock_path)

    def __repr__(self) -> str:
        return f"BlobCache({os.fspath(self.directory)!r}, max_bytes={self.max_bytes})"
