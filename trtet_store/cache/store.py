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

:class:`BlobCache` composes its parts, each holding the directory's files
(:mod:`.files`) and none another's insides: the put path (:mod:`.put`),
eviction and prune (:mod:`.evict`), verify and recover (:mod:`.check`).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtet_store.cache.check import Checker
from trtet_store.cache.directory import open_cache_directory
from trtet_store.cache.evict import Evictor
from trtet_store.cache.files import CacheFiles
from trtet_store.cache.layout import check_key, default_directory, refuse_foreign
from trtet_store.cache.put import Putter
from trtet_store.cache.results import (
    CacheStats,
    CacheWaitTimeout,
    EntryInfo,
    Hit,
    PutResult,
    VerifyReport,
)
from trtet_store.io import Blob, Digests, MiB, UnsafeLockFileError, try_lock, unlock_file

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


def _part(part: str, name: str) -> property:
    """An attribute of one of the cache's parts, read and set through the cache."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


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
    ``dropped`` maps a key to why :meth:`get` dropped its entry (damaged);
    ``swept`` is the last clear, prune or recover's sweep of partial downloads.
    """

    directory, chunk_size, read_only = (_part("files", n) for n in (
        "directory", "chunk_size", "read_only"))
    max_bytes, min_free, dropped, swept = (_part("evictor", n) for n in (
        "max_bytes", "min_free", "dropped", "swept"))

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
        directory = (default_directory() if directory is None else Path(directory)).absolute()
        try:
            # A link, another user's directory or one that is not a cache is refused here,
            # before anything in it is read, created or removed (cache/directory.py).
            writable = open_cache_directory(directory, create=not read_only)
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES):
                raise
            raise OSError(exc.errno, f"cannot create the engine cache {directory}: "
                          f"{os.strerror(exc.errno)}; pass a writable directory=",
                          os.fspath(directory)) from None
        #: The parts: the directory's files, and what puts, evicts and checks them.
        self.files = CacheFiles(directory, chunk_size=chunk_size, read_only=not writable)
        self.evictor = Evictor(self.files, max_bytes=max_bytes, min_free=min_free)
        self.putter = Putter(self.files, self.evictor)
        self.checker = Checker(self.files, self.evictor)
        # Recovery removes what it does not recognise: only on a write open (never on a
        # read-only one such as `trtet-store cache list`), in a directory checked above.
        # Not the partial downloads here: the next remote hit of their key resumes them.
        self.recovered: list[Path] = [] if self.read_only else self.recover(downloads=False)

    def __copy__(self) -> BlobCache:
        """A view of the same files with its own bounds (a put's raised floor, export's)."""
        view = object.__new__(BlobCache)
        view.__dict__.update(self.__dict__)
        view.evictor = copy.copy(self.evictor)
        view.putter = Putter(view.files, view.evictor)
        view.checker = Checker(view.files, view.evictor)
        return view

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
            entry = self.files.read_entry(key)
        except ValueError as exc:
            self.evictor.drop_key(key, str(exc))
            return None
        if entry is None:
            return None
        seal = self.files.blobs.read(entry.blob)
        if seal is None or seal.size != entry.size:
            self.evictor.drop_key(key, f"its blob {entry.blob} has no valid seal", entry.blob)
            return None
        path = self.files.blobs.path(entry.blob)
        try:
            # The pin. Blocking: an eviction holds the exclusive lock only to unlink.
            fd = try_lock(path, create=False, readonly=True, wait=True, shared=True)
        except FileNotFoundError:
            if not os.path.lexists(path):
                self.evictor.drop_key(key, f"its blob {path} is gone", entry.blob)
            return None  # else replaced while we waited (a put repaired it): a miss
        except UnsafeLockFileError:  # a link or a special file, never followed or opened
            self.evictor.drop_key(key, "the blob is not a regular file", entry.blob)
            return None
        try:
            st = os.fstat(fd)
            refuse_foreign(path, st, "blob")
            # Still the entry? An eviction may have removed it before we locked.
            try:
                again = self.files.read_entry(key)
                same = again is not None and again.blob == entry.blob and \
                    os.path.samestat(os.stat(path), st)
            except (FileNotFoundError, ValueError):
                same = False
            if not same:
                os.close(fd)
                return None
            problem, renewed = self.files.check(entry.blob, seal, fd, st, full=verify == "full")
            if problem is not None:
                os.close(fd)
                self.dropped[key] = problem
                self.evictor.drop_blob(entry.blob, f"entry {key!r}: {problem}", st)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self.files.stamp(key)
        resealed, seal = renewed not in (None, seal), renewed or seal
        return Hit(key=key, path=path, fd=fd, size=entry.size, digest=seal.digest,
                   chunk_size=seal.chunk_size, chunk_digests=seal.chunk_digests,
                   metadata=entry.metadata, created=entry.created, hits=entry.hits,
                   resealed=resealed, identity=seal.identity, verified=renewed is not None)

    def touch(self, key: str) -> bool:
        """Make ``key``'s entry the most recently used (its use stamp to now), counting no hit.

        For an entry another one depends on in its owner's eyes (a refit's structure
        entry, touched with each use of its builds: eviction takes them first).
        Returns whether the entry had a use stamp to set (no entry: nothing made).
        """
        return self.files.stamp(key, hit=False)

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
        return self.putter.put(key, source, metadata, consume=consume, digests=digests, pin=pin)

    def drop(self, key: str, reason: str) -> bool:
        """Remove ``key``'s entry (its blob too when no other key names it), saying ``reason``.

        For an entry that is whole but no longer wanted (a refit's structure entry
        whose refit failed). Unlike a damaged entry's drop, the next :meth:`get`
        is a plain miss. Returns whether there was an entry to drop.
        """
        return self.evictor.drop(key, reason)

    def prune(self, max_bytes: int | None = None) -> list[str]:
        """Evict least recently used entries down to ``max_bytes`` (default: the bound).

        Also down to where the filesystem keeps ``min_free``.

        Returns the evicted keys. Entries in use are kept (the result may
        then exceed ``max_bytes``; :meth:`stats` tells). Partial downloads
        no live download holds go too (:mod:`.downloads`; what went and
        what was kept is in :attr:`swept`).
        """
        return self.evictor.prune(max_bytes)

    def clear(self) -> list[str]:
        """Remove every entry not in use, and every partial download no download holds.

        Returns the removed keys (the downloads removed and kept: :attr:`swept`).
        """
        return self.prune(0)

    def verify(self) -> VerifyReport:
        """Re-digest every entry in full; drop (and log) each whose bytes are not as sealed."""
        return self.checker.verify()

    def recover(self, *, downloads: bool = True) -> list[Path]:
        """Clean what interrupted inserts and evictions left; returns the removed paths.

        Temp files of dead writers (their flock is free), records that are
        unreadable or whose blob or seal is gone, use stamps without a
        record, seals without a blob, blobs without a seal or without any
        record, and free single-flight lock files; with ``downloads``, each
        partial download in ``downloads/`` no live download holds (its
        directory is in the result; what was kept is in :attr:`swept`).
        Runs when the cache opens, without ``downloads``: a cut remote hit
        keeps its partial download for the next hit of the key to resume.
        Any file owned by another user is refused (PermissionError), never
        removed.
        """
        return self.checker.recover(downloads=downloads)

    def entries(self) -> list[EntryInfo]:
        """Every entry, most recently used first (reads records only; no bytes)."""
        return self.checker.entries()

    def stats(self) -> CacheStats:
        return self.checker.stats()

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
        # `not >= 0`, not `< 0`: a NaN compares false both ways and would wait for ever.
        if timeout is not None and not timeout >= 0:
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
