"""BlobCache: a bounded, single-flight, crash-safe directory of blobs keyed by opaque strings.

Built on ``trtet_store.io``'s public face only; it knows nothing of TensorRT
(what a key means is the caller's: ``export/`` makes engine keys).

Why each piece is shaped as it is:

- **Content addressed.** A blob file is named by its xxh3-128 digest and
  size; key records reference it, so identical bytes under two keys are
  stored once. A blob goes when no record references it.
- **Complete or absent.** Bytes go to a temp file in ``tmp/`` (cloned from
  the source where the filesystem allows, else ``copy_file_range``; hard
  linked with ``consume=True``), fsynced, digested, then renamed into
  ``blobs/`` and recorded, each step durable before the next is visible.
  Each temp file is flocked by its writer, so recovery removes only the
  temp files of dead writers.
- **One cache-wide lock** (``lock``) serializes commits, evictions and
  recovery, so N processes inserting at once keep the bound: the room is
  checked, made and taken in one critical section. Copies run outside it.
- **Pins.** A :class:`Hit` holds a shared flock on its blob; eviction takes
  an exclusive one without waiting and skips an entry it cannot lock.
- **Use on disk.** A hit appends one byte to ``keys/<key>.use`` and stamps
  its mtime, so "least recently used" is the same for every process (and
  ``hits`` is that file's size).
- **Sealed.** A blob's seal (``blobs/<name>.json``) records its identity
  (device, inode, size, mtime, ctime) and digests. A hit compares the
  identity (one ``stat``); a changed identity costs a full re-digest, and
  bytes that differ are dropped, logged and never served.
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

from trtet_store.cache.directory import open_cache_directory
from trtet_store.cache.layout import (
    blob_name,
    check_key,
    default_directory,
    is_blob_name,
    owned_by_cache,
    refuse_foreign,
)
from trtet_store.cache.results import (
    CacheStats,
    CacheWaitTimeout,
    EntryInfo,
    Hit,
    PutResult,
    VerifyReport,
)
from trtet_store.io import (
    Blob,
    Digester,
    MiB,
    clone_range,
    file_identity,
    free_bytes,
    fsync_dir,
    try_lock,
    unlock_file,
)

log = logging.getLogger("trtet_store.cache")

DEFAULT_CHUNK_SIZE = MiB
_READ = 8 * MiB
# Errors that make a put a skip, not a failure: the cache is an optimisation.
_SKIP_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})
# copy_file_range / FICLONERANGE "not here" errors.
_UNSUPPORTED = frozenset({errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL,
                          errno.ENOSYS, errno.EPERM, errno.EBADF})


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
            *, consume: bool = False) -> PutResult:
        """:meth:`BlobCache.put` under this claim's key."""
        return self.cache.put(self.key, source, metadata, consume=consume)


class BlobCache:
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
        self.recovered: list[Path] = [] if self.read_only else self.recover()

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
        """Write ``path`` complete or not at all: temp file, fsync, rename (dir fsync: caller)."""
        tmp, fd = self._temp()
        try:
            payload = json.dumps(data, sort_keys=True).encode()
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)

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

    def get(self, key: str) -> Hit | None:
        """The entry under ``key``, pinned, or None.

        An entry whose blob no longer matches its seal (size; identity, then
        a full re-digest; the digest) is dropped, logged, and None is
        returned: it is never served. A hit records its use on disk.
        """
        check_key(key)
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
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._drop_key(key, f"its blob {path} is gone", entry.blob)
            return None
        try:
            # Blocking: an eviction holds the exclusive lock only to unlink.
            fcntl.flock(fd, fcntl.LOCK_SH)
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
            resealed = False
            problem = self._check_blob(fd, st, seal)
            if problem == "identity":
                problem = self._redigest(fd, seal)
                if problem is None:
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
                   resealed=resealed)

    def _check_blob(self, fd: int, st: os.stat_result, seal: Mapping[str, Any]) -> str | None:
        """None when the file is as sealed; a reason, or ``"identity"`` (re-digest to tell)."""
        if not stat.S_ISREG(st.st_mode):
            return "the blob is not a regular file"
        if st.st_size != int(seal["size"]):
            return f"size {st.st_size}, sealed {seal['size']} (truncated or extended)"
        if file_identity(st) != tuple(seal["identity"]):
            return "identity"
        return None

    def _redigest(self, fd: int, seal: Mapping[str, Any]) -> str | None:
        """Read the whole blob again: None when its digests are the sealed ones."""
        digest, chunks, size = _digest_fd(fd, int(seal["chunk_size"]))
        if size != int(seal["size"]):
            return f"read {size} bytes, sealed {seal['size']}"
        if digest != seal["digest"] or chunks != tuple(seal["chunk_digests"]):
            bad = next((i for i, (a, b) in enumerate(zip(chunks, seal["chunk_digests"],
                                                         strict=False)) if a != b), None)
            return f"digest mismatch (first bad chunk {bad})"
        return None

    def _reseal(self, name: str, seal: Mapping[str, Any], st: os.stat_result) -> None:
        """Record a re-digested blob's new identity (its bytes are the sealed ones)."""
        if self.read_only:
            return
        with self._locked():
            if self._read_seal(name) is None:
                return
            new = dict(seal, identity=list(file_identity(st)),
                       chunk_digests=list(seal["chunk_digests"]))
            with contextlib.suppress(OSError):
                self._write_json(self._seal(name), new)
        log.info("engine cache blob %s changed identity with the same bytes: resealed", name)

    def _stamp(self, key: str) -> None:
        """Record a use on disk: one byte appended (hits) and the mtime set to now (LRU)."""
        if self.read_only:
            return
        path = self._use(key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"h")
            finally:
                os.close(fd)
            now = time.time_ns()
            os.utime(path, ns=(now, now))
        except OSError as exc:  # a use not recorded costs LRU precision, never a hit
            log.debug("could not stamp the use of %s: %s", key, exc)

    # -- put ----------------------------------------------------------------------

    def put(self, key: str, source: os.PathLike | str | Blob,
            metadata: Mapping[str, Any] | None = None, *, consume: bool = False) -> PutResult:
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

        Returns
        -------
        PutResult
            ``stored``, or skipped with ``reason`` (also logged).
        """
        check_key(key)
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
        try:
            result = self._put(key, src, size, meta, consume, source)
        except OSError as exc:
            if exc.errno not in _SKIP_ERRNOS:
                raise
            return self._skip(key, size, f"{os.strerror(exc.errno)} while caching "
                              f"({exc.filename or self.directory})")
        if result.skipped:
            log.warning("engine cache: %s not stored: %s", key, result.reason)
        elif consume:
            self._consume(source, src, blob_name(result.digest, size))
        return result

    def _skip(self, key: str, size: int, reason: str) -> PutResult:
        log.warning("engine cache: %s not stored: %s", key, reason)
        return PutResult(key=key, stored=False, size=size, reason=reason)

    def _put(self, key: str, src: Path, size: int, meta: dict[str, Any],
             consume: bool, source: os.PathLike | str | Blob) -> PutResult:
        src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        tmp: Path | None = None
        fd = -1
        try:
            placement = None
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
            digest, chunks, got = _digest_fd(read_fd, self.chunk_size)
            if got != size:
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the source {src} changed size while it was cached "
                                 f"({size} -> {got} bytes)")
            if isinstance(source, Blob) and source.has_digests and \
                    source.chunk_size == self.chunk_size and \
                    (source.digest, tuple(source.chunk_digests)) != (digest, chunks):
                # The staged blob's own seal disagrees: its file changed since it was
                # written. Caching it would serve bytes nobody built.
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the blob {src} no longer holds the bytes it was "
                                 "sealed with")
            with self._locked():
                result = self._commit(key, tmp, read_fd, digest, chunks, size, meta, placement)
            if result.stored and result.placement != "dedup":
                tmp = None  # renamed into blobs/
            if evicted:
                result = dataclasses.replace(result, evicted=tuple(evicted) + result.evicted)
            return result
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if fd >= 0:
                os.close(fd)
            os.close(src_fd)

    def _place(self, src_fd: int, fd: int, size: int, key: str,
               evicted: list[str]) -> str | PutResult:
        """Clone the source into the temp file, else copy it (after making room for it)."""
        if size:
            try:
                clone_range(src_fd, 0, 0, fd, 0)  # length 0: to the source's end
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                os.ftruncate(fd, 0)
            else:
                if os.fstat(fd).st_size == size:
                    return "clone"
                os.ftruncate(fd, 0)
        with self._locked():
            why, evicted[:] = self._make_room(size, size, exclude=key)
        if why:
            return PutResult(key=key, stored=False, size=size, reason=why,
                             evicted=tuple(evicted))
        _copy(src_fd, fd, size)
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
            self._write_json(self._seal(name), seal)
            fsync_dir(self.directory / "blobs")
        now = time.time()
        self._write_json(self._record(key), {"key": key, "blob": name, "size": size,
                                             "created": now, "metadata": meta})
        use = os.open(self._use(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                      0o600)
        os.close(use)
        stamp = int(now * 1e9)
        os.utime(self._use(key), ns=(stamp, stamp))
        fsync_dir(self.directory / "keys")
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

    # -- eviction -----------------------------------------------------------------

    def _make_room(self, new_bytes: int, new_disk: int, *, exclude: str | None = None,
                   keep_blob: str | None = None,
                   bound: int | None = None) -> tuple[str | None, list[str]]:
        """Under the lock: evict least recently used entries until ``new_bytes`` fit.

        Fits means: the distinct blobs plus ``new_bytes`` stay within the bound,
        and the filesystem keeps ``min_free`` after ``new_disk`` more bytes.
        Pinned entries (a hit holds them) are skipped. Returns ``(why not, evicted)``.
        """
        bound = self.max_bytes if bound is None else bound
        entries = self._scan()
        evicted: list[str] = []
        pinned = 0

        def used() -> int:
            return sum({e.blob: e.size for e in entries}.values())

        def problem() -> str | None:
            total = used()
            if total + new_bytes > bound:
                return (f"no room under the bound: {total} bytes cached + {new_bytes} new > "
                        f"{bound}")
            free = free_bytes(self.directory)
            if free - new_disk < self.min_free:
                return (f"not enough free space: {free} bytes free, {new_disk} needed, "
                        f"{self.min_free} kept free (min_free)")
            return None

        for victim in sorted(entries, key=lambda e: (e.last_use_ns, e.key)):
            if problem() is None:
                break
            if victim.key == exclude or victim.blob == keep_blob:
                continue
            if self._evict(victim, entries):
                entries.remove(victim)
                evicted.append(victim.key)
            else:
                pinned += 1
        why = problem()
        if why and pinned:
            why += f" ({pinned} entries in use could not be evicted)"
        if evicted:
            log.info("engine cache: evicted %d least recently used entries: %s",
                     len(evicted), ", ".join(evicted))
        return why, evicted

    def _evict(self, victim: _Entry, entries: list[_Entry]) -> bool:
        """Remove one entry unless a hit pins its blob. Under the lock."""
        path = self._blob(victim.blob)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            # Record first: a kill after this leaves a blob no record references,
            # which recovery removes; never a record without its bytes being served.
            for p in (self._record(victim.key), self._use(victim.key)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            if not any(e.blob == victim.blob and e.key != victim.key for e in entries):
                for p in (self._seal(victim.blob), path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            return True
        finally:
            if fd >= 0:
                os.close(fd)

    def _remove_blob_if_unreferenced(self, name: str) -> None:
        if not any(e.blob == name for e in self._scan()):
            self._remove_blob_unless_pinned(name)

    def _remove_blob_unless_pinned(self, name: str) -> list[Path]:
        """Under the lock: unlink a blob no record names, and its seal, unless a hit pins it.

        A hit taken just before its key was replaced may still hold the old
        blob: it stays (with its seal) until a later recovery finds it free.
        Returns the paths removed.
        """
        path = self._blob(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        removed = []
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return []
            for p in (self._seal(name), path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
                    removed.append(p)
            return removed
        finally:
            if fd >= 0:
                os.close(fd)

    def _drop_key(self, key: str, reason: str, blob: str | None = None) -> None:
        """Drop ``key``'s record (and its blob if no other key names it).

        ``blob`` is the blob the caller found wrong: when the record names
        another one by the time the lock is held, a put replaced the entry
        since the caller read it (and removed that blob), and the new entry stays.
        """
        if self.read_only:
            log.warning("engine cache: dropping entry %r: %s", key, reason)
            self.dropped[key] = reason
            return
        with self._locked():
            entry = None
            with contextlib.suppress(ValueError):
                entry = self._read_entry(key)
            if blob is not None and (entry is None or entry.blob != blob):
                log.info("engine cache: entry %r was replaced while read (%s): kept", key,
                         reason)
                return
            log.warning("engine cache: dropping entry %r: %s", key, reason)
            self.dropped[key] = reason
            for p in (self._record(key), self._use(key)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            if entry is not None:
                self._remove_blob_if_unreferenced(entry.blob)

    def _drop_blob(self, name: str, reason: str, seen: os.stat_result) -> None:
        """A blob whose bytes are not the sealed ones: it and every key naming it go.

        ``seen`` is the file found damaged: when another process replaced it
        since (a put of the same bytes repairs a blob), the new one stays.
        """
        log.warning("engine cache: dropping damaged blob %s (never served): %s", name, reason)
        if self.read_only:
            return
        with self._locked():
            try:
                if file_identity(os.stat(self._blob(name))) != file_identity(seen):
                    return
            except FileNotFoundError:
                pass
            for entry in self._scan():
                if entry.blob == name:
                    for p in (self._record(entry.key), self._use(entry.key)):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(p)
            for p in (self._seal(name), self._blob(name)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)

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
        if self.read_only:  # nothing to build into, nothing created: the hit, if any
            claim = Claim(self, key, 0.0)
            try:
                claim.hit = self.get(key)
                yield claim
            finally:
                if claim.hit is not None:
                    claim.hit.close()
            return
        lock_path = self.directory / "flights" / f"{key}.lock"
        start = time.monotonic()
        if timeout is None:
            fd = try_lock(lock_path, create=True, wait=True)
        else:
            while (fd := try_lock(lock_path, create=True)) is None:
                if time.monotonic() - start >= timeout:
                    raise CacheWaitTimeout(key, time.monotonic() - start, lock_path)
                time.sleep(0.02)
        claim = Claim(self, key, time.monotonic() - start)
        try:
            claim.hit = self.get(key)
            yield claim
        finally:
            if claim.hit is not None:
                claim.hit.close()
            unlock_file(fd, lock_path)

    # -- listings and maintenance ---------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every entry, most recently used first (reads records only; no bytes)."""
        out = []
        for e in self._scan():
            seal = self._read_seal(e.blob) or {}
            out.append(EntryInfo(key=e.key, size=e.size, digest=seal.get("digest", ""),
                                 last_use=e.last_use_ns / 1e9, hits=e.hits, created=e.created,
                                 metadata=e.metadata))
        return sorted(out, key=lambda i: (-i.last_use, i.key))

    def stats(self) -> CacheStats:
        entries = self._scan()
        blobs = {e.blob: e.size for e in entries}
        return CacheStats(directory=self.directory, entries=len(entries), blobs=len(blobs),
                          bytes=sum(blobs.values()), max_bytes=self.max_bytes,
                          min_free=self.min_free, free_bytes=free_bytes(self.directory),
                          hits=sum(e.hits for e in entries), read_only=self.read_only)

    def prune(self, max_bytes: int | None = None) -> list[str]:
        """Evict least recently used entries down to ``max_bytes`` (default: the bound).

        Also down to where the filesystem keeps ``min_free``.

        Returns the evicted keys. Entries in use are kept (the result may
        then exceed ``max_bytes``; :meth:`stats` tells).
        """
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(
                max_bytes, int) or max_bytes < 0):
            raise ValueError(f"prune's max_bytes must be an int >= 0, got {max_bytes!r}")
        if self.read_only:
            raise OSError(errno.EROFS, f"the cache {self.directory} is read-only: cannot prune",
                          os.fspath(self.directory))
        with self._locked():
            _, evicted = self._make_room(0, 0, bound=max_bytes)
        return evicted

    def clear(self) -> list[str]:
        """Remove every entry not in use; returns the removed keys."""
        return self.prune(0)

    def verify(self) -> VerifyReport:
        """Re-digest every entry in full; drop (and log) each whose bytes are not as sealed."""
        checked, dropped = 0, []
        for entry in self._scan():
            seal = self._read_seal(entry.blob)
            path = self._blob(entry.blob)
            problem, st = None, None
            if seal is None:
                problem = "no valid seal"
            else:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    problem = "the blob is gone"
                else:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH)
                        st = os.fstat(fd)
                        problem = self._check_blob(fd, st, seal)
                        if problem in (None, "identity"):
                            again = self._redigest(fd, seal)
                            if again is None and problem == "identity":
                                self._reseal(entry.blob, seal, st)
                            problem = again
                    finally:
                        os.close(fd)
            checked += 1
            if problem is not None:
                dropped.append((entry.key, problem))
                if seal is not None and st is not None:
                    self._drop_blob(entry.blob, f"entry {entry.key!r}: {problem}", st)
                else:
                    self._drop_key(entry.key, problem, entry.blob)
        return VerifyReport(checked=checked, dropped=tuple(dropped))

    def recover(self) -> list[Path]:
        """Clean what interrupted inserts and evictions left; returns the removed paths.

        Temp files of dead writers (their flock is free), records that are
        unreadable or whose blob or seal is gone, use stamps without a
        record, seals without a blob, blobs without a seal or without any
        record, and free single-flight lock files. Runs when the cache opens.
        Any file owned by another user is refused (PermissionError), never
        removed.
        """
        removed: list[Path] = []

        def rm(path: Path) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)

        with self._locked():
            for sub in ("tmp", "flights"):
                for name in os.listdir(self.directory / sub):
                    path = self.directory / sub / name
                    refuse_foreign(path, os.lstat(path), "file")
                    try:
                        fd = try_lock(path, create=False)
                    except FileNotFoundError:
                        continue
                    if fd is not None:  # its writer is gone
                        rm(path)
                        os.close(fd)
            keys, blobs = self.directory / "keys", self.directory / "blobs"
            for name in os.listdir(keys):
                refuse_foreign(keys / name, os.lstat(keys / name), "file")
            for name in os.listdir(blobs):
                refuse_foreign(blobs / name, os.lstat(blobs / name), "file")
            referenced: set[str] = set()
            for name in sorted(os.listdir(keys)):
                if not name.endswith(".json"):
                    continue
                key = name[:-5]
                try:
                    entry = self._read_entry(key)
                except ValueError as exc:
                    log.warning("engine cache: removing %s", exc)
                    entry = None
                if entry is None or self._read_seal(entry.blob) is None or \
                        not self._blob(entry.blob).exists():
                    rm(keys / name)
                    continue
                referenced.add(entry.blob)
            for name in os.listdir(keys):
                if name.endswith(".use") and not (keys / f"{name[:-4]}.json").exists():
                    rm(keys / name)
            unreferenced = {name.removesuffix(".json") for name in os.listdir(blobs)} - referenced
            for name in sorted(unreferenced):
                removed += self._remove_blob_unless_pinned(name)
            if removed:
                fsync_dir(keys)
                fsync_dir(blobs)
        if removed:
            log.info("engine cache %s: recovered, removed %d leftover files", self.directory,
                     len(removed))
        return removed

    def __repr__(self) -> str:
        return f"BlobCache({os.fspath(self.directory)!r}, max_bytes={self.max_bytes})"


def _digest_fd(fd: int, chunk_size: int) -> tuple[str, tuple[int, ...], int]:
    """Digest a whole open file as io's :class:`Digester` does as a blob is written."""
    d = Digester(chunk_size)
    pos = 0
    step = max(chunk_size, _READ // chunk_size * chunk_size)
    while data := os.pread(fd, step, pos):
        d.update(data)
        pos += len(data)
    digest, chunks = d.finish()
    return digest, chunks, d.size


def _copy(src_fd: int, dst_fd: int, size: int) -> None:
    """Copy ``size`` bytes: ``copy_file_range`` (which may share blocks), else read/write."""
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(src_fd, dst_fd, size - done, done, done)
            if n == 0:
                raise OSError(errno.EIO, f"source ended at {done} of {size} bytes")
            done += n
        return
    except OSError as exc:
        if done or exc.errno not in _UNSUPPORTED:
            raise
    while done < size:
        data = os.pread(src_fd, min(_READ, size - done), done)
        if not data:
            raise OSError(errno.EIO, f"source ended at {done} of {size} bytes")
        view = memoryview(data)
        while view:
            n = os.pwrite(dst_fd, view, done)
            if n <= 0:
                raise OSError(errno.ENOSPC, "write made no progress")
            view = view[n:]
            done += n
