"""BlobCache's put: a source's bytes in, complete or absent, under the bound.

The bytes go to a temp file in ``tmp/`` (a hard link of the source with
``consume=True``; else cloned, else copied after making room), are fsynced
and digested (or the caller's digests trusted while the file keeps the
identity they were taken of), then, under the cache-wide lock, renamed into
``blobs/``, sealed and recorded, each step durable before the next is
visible. A bound, space or permission problem is a skip, never a failure:
the cache is an optimisation.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtet_store.cache.evict import Evictor
from trtet_store.cache.files import CacheFiles
from trtet_store.cache.layout import blob_name, check_key, owned_by_cache
from trtet_store.cache.results import Hit, PutResult
from trtet_store.io import Blob, Digests, Seal, copy_all, same_identity, try_clone, try_lock

log = logging.getLogger("trtet_store.cache")

# Errors that make a put a skip, not a failure: the cache is an optimisation.
_SKIP_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


class Putter:
    """A cache's :meth:`put` and the steps of its commit (room made by its evictor)."""

    def __init__(self, files: CacheFiles, evictor: Evictor) -> None:
        self.files, self.evictor = files, evictor

    def put(self, key: str, source: os.PathLike | str | Blob,
            metadata: Mapping[str, Any] | None = None, *, consume: bool = False,
            digests: Digests | None = None, pin: bool = False) -> PutResult:
        """Store ``source``'s bytes under ``key`` (:meth:`BlobCache.put`)."""
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
        if consume and owned_by_cache(self.files.directory, src):
            raise ValueError(f"cache source {src} is a file of the cache itself: it cannot be "
                             "consumed (put it without consume=True)")
        if self.files.read_only:
            return self._skip(key, size, f"the cache {self.files.directory} is on a read-only "
                              "filesystem or not writable")
        if size > self.evictor.max_bytes:
            return self._skip(key, size, f"{size} bytes is larger than the cache's bound "
                              f"of {self.evictor.max_bytes} bytes")
        pins: list[int] = []
        try:
            try:
                result = self._put(key, src, size, meta, consume, source, digests,
                                   pins if pin else None)
            except OSError as exc:
                if exc.errno not in _SKIP_ERRNOS:
                    raise
                return self._skip(key, size, f"{os.strerror(exc.errno)} while caching "
                                  f"({exc.filename or self.files.directory})")
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
                tmp = self.files.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
                try:
                    fcntl.flock(src_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.link(src, tmp)
                    placement = "link"
                except (BlockingIOError, OSError) as exc:
                    log.debug("cannot link %s into the cache (%s): placing a copy", src, exc)
                    tmp = None
            if placement is None:
                tmp, fd = self.files.temp()
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
                new = Seal(known.size, known.digest, known.chunk_size, tuple(known.chunk_digests))
            else:
                new = Seal.read(read_fd, self.files.chunk_size)
            if new.size != size:
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the source {src} changed size while it was cached "
                                 f"({size} -> {new.size} bytes)")
            claimed = digests or (Digests(source.digest, source.size, source.chunk_size,
                                          tuple(source.chunk_digests))
                                  if isinstance(source, Blob) and source.has_digests else None)
            if claimed is not None and (
                    claimed.digest != new.digest or
                    claimed.chunks_for(self.files.chunk_size) not in (None, new.chunk_digests)):
                # The staged blob's own seal (or the caller's check) disagrees: its file
                # changed since. Caching it would serve bytes nobody built.
                return PutResult(key=key, stored=False, size=size,
                                 reason=f"the {'blob' if isinstance(source, Blob) else 'file'} "
                                 f"{src} no longer holds the bytes it was sealed with")
            with self.files.locked():
                result = self._commit(key, tmp, read_fd, new, meta, placement)
                if pins is not None and result.stored:
                    if placement == "link":
                        # Our exclusive lock is on the blob's very inode: it would block the
                        # pin. Dropped under the cache-wide lock, which every eviction
                        # needs, so nothing can evict the entry before it is pinned.
                        fcntl.flock(src_fd, fcntl.LOCK_UN)
                    pins.append(try_lock(self.files.blobs.path(blob_name(new.digest, size)),
                                         create=False, readonly=True, wait=True, shared=True))
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
            seal = self.files.blobs.read(name)
            entry = None
            with contextlib.suppress(ValueError):
                entry = self.files.read_entry(key)
            sealed = seal is not None and entry is not None and entry.blob == name
            return Hit(key=key, path=self.files.blobs.path(name), fd=fd, size=result.size,
                       digest=result.digest,
                       chunk_size=seal.chunk_size if sealed else self.files.chunk_size,
                       chunk_digests=seal.chunk_digests if sealed else (),
                       metadata=entry.metadata if entry is not None else {},
                       created=entry.created if entry is not None else time.time(),
                       hits=entry.hits if entry is not None else 0, resealed=False,
                       identity=seal.identity if sealed else ())
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
                digests.chunks_for(self.files.chunk_size) is None:
            return None
        if not same_identity(digests.identity, st) or digests.size != st.st_size:
            log.debug("cache put: %s changed since its digests were taken; digesting it", st)
            return None
        return digests

    @staticmethod
    def _still(known: Digests, st: os.stat_result, placement: str) -> bool:
        """Whether the source kept the digests' identity while its bytes entered.

        A hard link changes the inode's ctime and nothing else.
        """
        return same_identity(known.identity, st, relink=placement == "link")

    def _place(self, src_fd: int, fd: int, size: int, key: str,
               evicted: list[str]) -> str | PutResult:
        """Clone the source into the temp file, else copy it (after making room for it)."""
        if try_clone(src_fd, fd, size):
            return "clone"
        with self.files.locked():
            why, evicted[:] = self.evictor.make_room(size, size, exclude=key)
        if why:
            return PutResult(key=key, stored=False, size=size, reason=why,
                             evicted=tuple(evicted))
        copy_all(src_fd, fd, size)
        return "copy"

    def _commit(self, key: str, tmp: Path, fd: int, new: Seal, meta: dict[str, Any],
                placement: str) -> PutResult:
        """Under the lock: make room, rename the blob in, seal it, write the record."""
        size, digest = new.size, new.digest
        name = blob_name(digest, size)
        old = None
        with contextlib.suppress(ValueError):
            old = self.files.read_entry(key)
        dedup = self.files.blobs.sealed(name)
        # The same bytes with the same metadata: nothing to write. New metadata for the
        # same bytes (a timing entry taking in the tier's ETag) is recorded below.
        if old is not None and old.blob == name and dedup and old.metadata == meta:
            return PutResult(key=key, stored=True, size=size, placement="dedup", digest=digest,
                             reason="the same bytes were already cached under this key")
        why, evicted = self.evictor.make_room(0 if dedup else size, 0, exclude=key, keep_blob=name)
        if why:
            return PutResult(key=key, stored=False, size=size, reason=why,
                             evicted=tuple(evicted))
        if dedup:
            placement = "dedup"
        else:
            os.rename(tmp, self.files.blobs.path(name))
            # write_atomic fsyncs blobs/ after the seal's rename: the blob's own entry,
            # renamed in before it, is durable with it, before the record names it.
            self.files.blobs.write(name, new.renewed(os.fstat(fd)))
        now = time.time()
        # The use stamp first: the record's write_atomic then fsyncs keys/ for both
        # (a kill between them leaves a .use no record names, which recovery removes).
        use = os.open(self.files.use(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                      | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            stamp = int(now * 1e9)
            os.utime(use, ns=(stamp, stamp))
        finally:
            os.close(use)
        self.files.write_json(self.files.record(key), {"key": key, "blob": name, "size": size,
                                                       "created": now, "metadata": meta})
        self.files.summary.put(key, name, size, stamp)  # after the record: a kill: rebuilt
        if old is not None and old.blob != name:
            self.evictor.remove_blob_if_unreferenced(old.blob)
        return PutResult(key=key, stored=True, size=size, placement=placement,
                         evicted=tuple(evicted), digest=digest)

    def _consume(self, source: os.PathLike | str | Blob, src: Path, name: str) -> None:
        """The entry is durable: release the caller's file (a hard link of it may be the blob)."""
        if isinstance(source, Blob):
            source.mark_consumed()
        else:
            self.files.unlink(src)
        # Removing a link changed the blob's ctime: seal it again.
        with self.files.locked(), contextlib.suppress(OSError):
            self.files.blobs.relinked(name)
