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

Eviction and prune are in :mod:`.evict`; verify, recover and clear in
:mod:`.check` (mixins of :class:`BlobCache`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.cache.check import Checks
from trtet_store.cache.directory import open_cache_directory
from trtet_store.cache.downloads import DownloadSweep
from trtet_store.cache.evict import Eviction
from trtet_store.cache.layout import (
    blob_name,
    check_key,
    default_directory,
    is_blob_name,
    owned_by_cache,
    refuse_foreign,
)
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
    copy_all,
    digest_fd,
    file_identity,
    try_clone,
    try_lock,
    unlock_file,
    write_atomic,
)

log = logging.getLogger("trtet_store.cache")

DEFAULT_CHUNK_SIZE = MiB
# Errors that make a put a skip, not a failure: the cache is an optimisation.
_SKIP_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


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


class BlobCache(Eviction, Checks):
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

    def _temp(self) -> tuple[Path, int]:
        """A new temp file in ``tmp/``, flocked by us (recovery leaves it alone while we live)."""
        path = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
        fd = try_lock(path, create=True)
        if fd is None:  # a fresh uuid name: nobody else can hold it
            raise OSError(errno.EBUSY, "temp file locked by another process", os.fspath(path))
        os.fchmod(fd, 0o600)
        return path, fd

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

    # -- put ----------------------------------------------------------------------

    def put(self, key: str, source: os.PathLike | str | Blob,
            metadata: Mapping[str, Any] | None = None, *, consume: bool = False,
            digests: Digests | None = None, pin: bool = False) -> PutResult:
        """Store ``source``'s bytes under ``key``; a bound, space or permission problem is a skip.

        Parameters
        ----------
        key : str
            An opaque name (e.g. a hex digest): letters, digits, ``._-``.
        source : path-like or Blob
            A regular file. Cloned where the filesystem allows, else copied;
            left as it was unless ``consume``.
        metadata : mapping, optional
            JSON-serializable; recorded with the entry, returned with hits.
        consume : bool
            The caller gives the file up: where it shares the cache's
            filesystem it is hard linked in (no byte copied) and removed once
            the entry is durable; a :class:`~trtet_store.io.Blob` is released.
            Left as it was when the entry is skipped.
        digests : Digests, optional
            The source's digests, computed or checked by the caller (a
            download checked as it arrived), with the identity of the file
            they were taken of: trusted while the file keeps that identity
            (checked before and after its bytes enter), so the put reads
            nothing. A :class:`~trtet_store.io.Blob` source with digests
            brings its own. Without them (or once the file changed), the
            entered bytes are read and digested once.
        pin : bool
            Hand the stored entry back pinned, as ``result.hit`` (a
            :class:`Hit` the caller closes), pinned under the cache-wide lock
            of the commit: no eviction comes between the entry's commit and
            the pin. What a caller that consumed its only copy of the bytes
            into the cache needs to go on using them.

        Returns
        -------
        PutResult
            ``stored``, or skipped with ``reason`` (also logged).
        """
        check_key(key)
        if not isinstance(pin, bool):
            raise TypeError(f"pin must be a bool, got {type(pin).__name__}")
        if digests is not None and not isinstance(digests, Digests):
            raise TypeError(f"digests must be a trtet_store.io.Digests, got "
                            f"{type(digests).__name__}")
        meta = dict(metadata or {})
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cache metadata for {key!r} must be JSON-serializable: {exc}") \
                from None
        src = Path(source.path if isinstance(source, Blob) else source)
        st = os.stat(src)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"cache source {src} is not a regular file")
        size = st.st_size
        if consume and owned_by_cache(self.directory, src):
            raise ValueError(f"cache source {src} is a file of the cache itself: it cannot be "
                             "consumed (put it without consume=True)")
        if self.read_only:
            return self._skip(key, size, f"the cache {self.directory} is on a read-only "
                              "filesystem or not writable")
        if size > self.max_bytes:
            return self._skip(key, size, f"{size} bytes is larger than the cache's bound "
                              f"of {self.max_bytes} bytes")
        pins: list[int] = []
        try:
            try:
                result = self._put(key, src, size, meta, consume, source, digests,
                                   pins if pin else None)
            except OSError as exc:
                if exc.errno not in _SKIP_ERRNOS:
                    raise
                return self._skip(key, size, f"{os.strerror(exc.errno)} while caching "
                                  f"({exc.filename or self.directory})")
            if result.skipped:
                log.warning("engine cache: %s not stored: %s", key, result.reason)
            elif consume:
                self._consume(source, src, blob_name(result.digest, size))
            if pins:
                # After the consume: its reseal (a removed link changes the ctime) is the
                # identity the hit is sealed with.
                result = dataclasses.replace(result, hit=self._pinned(key, result, pins.pop()))
            return result
        finally:
            for fd in pins:
                os.close(fd)

    def _skip(self, key: str, size: int, reason: str) -> PutResult:
        log.warning("engine cache: %s not stored: %s", key, reason)
        return PutResult(key=key, stored=False, size=size, reason=reason)

    def _put(self, key: str, src: Path, size: int, meta: dict[str, Any],
             consume: bool, source: os.PathLike | str | Blob,
             digests: Digests | None, pins: list[int] | None) -> PutResult:
        src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        tmp: Path | None = None
        fd = -1
        # A link removed again (the entry skipped) changes the source's ctime only: a
        # staged blob that had its sealed identity before is sealed again after.
        reseal = isinstance(source, Blob) and consume and source.identity_matches()
        placement = None
        try:
            # The digests this put may trust, if the file is still the one they were
            # taken of (checked again once its bytes are in).
            known = self._known(source, digests, os.fstat(src_fd))
            evicted: list[str] = []  # to make room for a copy, before the commit
            if consume:
                # A hard link of the source, locked first so recovery never takes it.
                tmp = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
                try:
                    fcntl.flock(src_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.link(src, tmp)
                    placement = "link"
                except (BlockingIOError, OSError) as exc:
                    log.debug("cannot link %s into the cache (%s): placing a copy", src, exc)
                    tmp = None
            if placement is None:
                tmp, fd = self._temp()
                placement = self._place(src_fd, fd, size, key, evicted)
                if isinstance(placement, PutResult):
                    return placement
                os.fsync(fd)
            if placement == "link":
                # The caller's file may be only in the page cache (a blob store's
                # writer does not sync): its bytes are durable before a record names them.
                os.fsync(src_fd)
            read_fd = src_fd if placement == "link" else fd
            if known is not None and self._still(known, os.fstat(src_fd), placement):
                # The bytes that entered are the file's, which is still the one the
                # digests were taken of: nothing is read back (issue 42).
                digest, chunks, got = known.digest, known.chunk_digests, known.size
            else:
                digest, chunks, got = digest_fd(read_fd, self.chunk_size)
            if got != size:
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the source {src} changed size while it was cached "
                                 f"({size} -> {got} bytes)")
            claimed = digests or (Digests(source.digest, source.size, source.chunk_size,
                                          tuple(source.chunk_digests))
                                  if isinstance(source, Blob) and source.has_digests else None)
            if claimed is not None and (
                    claimed.digest != digest or
                    claimed.chunks_for(self.chunk_size) not in (None, tuple(chunks))):
                # The staged blob's own seal (or the caller's check) disagrees: its file
                # changed since. Caching it would serve bytes nobody built.
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the {'blob' if isinstance(source, Blob) else 'file'} "
                                 f"{src} no longer holds the bytes it was sealed with")
            with self._locked():
                result = self._commit(key, tmp, read_fd, digest, chunks, size, meta, placement)
                if pins is not None and result.stored:
                    if placement == "link":
                        # Our exclusive lock is on the blob's very inode: it would block the
                        # pin. Dropped under the cache-wide lock, which every eviction
                        # needs, so nothing can evict the entry before it is pinned.
                        fcntl.flock(src_fd, fcntl.LOCK_UN)
                    pins.append(try_lock(self._blob(blob_name(digest, size)), create=False,
                                         readonly=True, wait=True, shared=True))
            if result.stored and result.placement != "dedup":
                tmp = None  # renamed into blobs/
            if evicted:
                result = dataclasses.replace(result, evicted=tuple(evicted) + result.evicted)
            return result
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if placement == "link" and reseal and not source.closed:
                    source.reseal(sidecar=True)  # our own link, removed again
            if fd >= 0:
                os.close(fd)
            os.close(src_fd)

    def _pinned(self, key: str, result: PutResult, fd: int) -> Hit:
        """The entry ``result`` stored, as a hit on ``fd`` (its pin, taken at the commit).

        Its identity is the seal's as it is now (after a consume's reseal), so
        :meth:`Hit.unchanged` says whether the file is still the sealed one.
        An entry replaced or dropped since (a damaged blob another process
        found) gets no identity: its digests are never trusted, and its
        bytes stay readable through the pinned descriptor.
        """
        try:
            name = blob_name(result.digest, result.size)
            seal = self._read_seal(name)
            entry = None
            with contextlib.suppress(ValueError):
                entry = self._read_entry(key)
            sealed = seal is not None and entry is not None and entry.blob == name
            return Hit(key=key, path=self._blob(name), fd=fd, size=result.size,
                       digest=result.digest,
                       chunk_size=int(seal["chunk_size"]) if sealed else self.chunk_size,
                       chunk_digests=seal["chunk_digests"] if sealed else (),
                       metadata=entry.metadata if entry is not None else {},
                       created=entry.created if entry is not None else time.time(),
                       hits=entry.hits if entry is not None else 0, resealed=False,
                       identity=seal["identity"] if sealed else ())
        except BaseException:
            os.close(fd)
            raise

    def _known(self, source: os.PathLike | str | Blob, digests: Digests | None,
               st: os.stat_result) -> Digests | None:
        """The digests a put may take instead of reading: given, or a sealed Blob's.

        Only with chunk digests of the cache's span (a seal needs them), and
        only for the file they were taken of (its identity now).
        """
        if digests is None and isinstance(source, Blob) and source.has_digests:
            digests = Digests(source.digest, source.size, source.chunk_size,
                              tuple(source.chunk_digests), tuple(source.identity))
        if digests is None or digests.identity is None or \
                digests.chunks_for(self.chunk_size) is None:
            return None
        if file_identity(st) != tuple(digests.identity) or digests.size != st.st_size:
            log.debug("cache put: %s changed since its digests were taken; digesting it", st)
            return None
        return digests

    @staticmethod
    def _still(known: Digests, st: os.stat_result, placement: str) -> bool:
        """Whether the source kept the digests' identity while its bytes entered.

        A hard link changes the inode's ctime and nothing else.
        """
        n = 4 if placement == "link" else 5
        return file_identity(st)[:n] == tuple(known.identity or ())[:n]

    def _place(self, src_fd: int, fd: int, size: int, key: str,
               evicted: list[str]) -> str | PutResult:
        """Clone the source into the temp file, else copy it (after making room for it)."""
        if try_clone(src_fd, fd, size):
            return "clone"
        with self._locked():
            why, evicted[:] = self._make_room(size, size, exclude=key)
        if why:
            return PutResult(key=key, stored=False, size=size, reason=why,
                             evicted=tuple(evicted))
        copy_all(src_fd, fd, size)
        return "copy"

    def _commit(self, key: str, tmp: Path, fd: int, digest: str, chunks: tuple[int, ...],
                size: int, meta: dict[str, Any], placement: str) -> PutResult:
        """Under the lock: make room, rename the blob in, seal it, write the record."""
        name = blob_name(digest, size)
        old = None
        with contextlib.suppress(ValueError):
            old = self._read_entry(key)
        dedup = self._intact(name)
        if old is not None and old.blob == name and dedup:
            return PutResult(key=key, stored=True, size=size, placement="dedup", digest=digest,
                             reason="the same bytes were already cached under this key")
        why, evicted = self._make_room(0 if dedup else size, 0, exclude=key, keep_blob=name)
        if why:
            return PutResult(key=key, stored=False, size=size, reason=why,
                             evicted=tuple(evicted))
        if dedup:
            placement = "dedup"
        else:
            os.rename(tmp, self._blob(name))
            seal = {"size": size, "digest": digest, "chunk_size": self.chunk_size,
                    "chunk_digests": list(chunks), "identity": list(file_identity(os.fstat(fd)))}
            # write_atomic fsyncs blobs/ after the seal's rename: the blob's own entry,
            # renamed in before it, is durable with it, before the record names it.
            self._write_json(self._seal(name), seal)
        now = time.time()
        # The use stamp first: the record's write_atomic then fsyncs keys/ for both
        # (a kill between them leaves a .use no record names, which recovery removes).
        use = os.open(self._use(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                      | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            stamp = int(now * 1e9)
            os.utime(use, ns=(stamp, stamp))
        finally:
            os.close(use)
        self._write_json(self._record(key), {"key": key, "blob": name, "size": size,
                                             "created": now, "metadata": meta})
        self._summary.put(key, name, size, stamp)  # after the record: a kill between rebuilds
        if old is not None and old.blob != name:
            self._remove_blob_if_unreferenced(old.blob)
        return PutResult(key=key, stored=True, size=size, placement=placement,
                         evicted=tuple(evicted), digest=digest)

    def _intact(self, name: str) -> bool:
        """Whether blob ``name`` is there and still as sealed (one ``stat``), to share it.

        A blob whose identity changed is not shared: the new bytes replace it
        (same name, same digest), so a damaged file is repaired, never reused.
        """
        seal = self._read_seal(name)
        try:
            st = os.stat(self._blob(name))
        except FileNotFoundError:
            return False
        return seal is not None and file_identity(st) == tuple(seal["identity"])

    def _consume(self, source: os.PathLike | str | Blob, src: Path, name: str) -> None:
        """The entry is durable: release the caller's file (a hard link of it may be the blob)."""
        if isinstance(source, Blob):
            source.mark_consumed()
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(src)
        # Removing a link changed the blob's ctime: seal it again (a kill before
        # this costs the next hit one re-digest, never a wrong answer). Only the
        # ctime may differ; any other change is left for a hit to re-digest.
        with self._locked():
            seal = self._read_seal(name)
            with contextlib.suppress(OSError):
                now = file_identity(os.stat(self._blob(name)))
                if seal is not None and tuple(seal["identity"])[:4] == now[:4] and \
                        tuple(seal["identity"]) != now:
                    self._write_json(self._seal(name),
                                     dict(seal, identity=list(now),
                                          chunk_digests=list(seal["chunk_digests"])))

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
