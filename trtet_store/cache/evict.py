"""BlobCache's eviction: least recently used entries go, pinned ones stay.

Everything here runs under the cache-wide lock (``CacheFiles.locked``), so the room is
checked, made and taken in one critical section. An entry goes record first:
a kill after that leaves a blob no record names, which recovery removes;
never a record whose bytes are gone. A blob a :class:`~trtet_store.cache.Hit`
pins (a shared ``flock``) is skipped: eviction asks for an exclusive one
without waiting.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

from trtet_store.cache.downloads import DownloadSweep, remove_unheld
from trtet_store.cache.files import CacheFiles
from trtet_store.io import UnsafeLockFileError, free_bytes, same_identity, try_lock

log = logging.getLogger("trtet_store.cache")


class Evictor:
    """A cache's eviction, drops and :meth:`prune`, within ``max_bytes`` and ``min_free``."""

    def __init__(self, files: CacheFiles, *, max_bytes: int, min_free: int) -> None:
        self.files, self.max_bytes, self.min_free = files, max_bytes, min_free
        #: key -> why get() dropped its entry (damaged): what a rebuild's report says.
        self.dropped: dict[str, str] = {}
        #: The last clear, prune or recover's sweep of partial downloads (cache/downloads.py).
        self.swept = DownloadSweep()

    def sweep(self) -> DownloadSweep:
        """Under the lock: remove the partial downloads no live download holds."""
        self.swept = remove_unheld(self.files.directory)
        return self.swept

    def make_room(self, new_bytes: int, new_disk: int, *, exclude: str | None = None,
                   keep_blob: str | None = None,
                   bound: int | None = None) -> tuple[str | None, list[str]]:
        """Under the lock: evict least recently used entries until ``new_bytes`` fit.

        Fits means: the distinct blobs plus ``new_bytes`` stay within the bound,
        and the filesystem keeps ``min_free`` after ``new_disk`` more bytes.
        Pinned entries (a hit holds them) are skipped. Returns ``(why not, evicted)``.

        Reads no record but the victims' use stamps: the used bytes and the
        order come from the summary (:mod:`.summary`), checked against the
        records' directory first. ``statvfs`` runs once, and again after a
        victim only while free space is what is short.
        """
        bound = self.max_bytes if bound is None else bound
        summary = self.files.summary
        evicted: list[str] = []
        pinned = 0
        free: int | None = None

        def problem() -> str | None:
            nonlocal free
            total = summary.used_bytes()
            if total + new_bytes > bound:
                return (f"no room under the bound: {total} bytes cached + {new_bytes} new > "
                        f"{bound}")
            if free is None:
                free = free_bytes(self.files.directory)
            if free - new_disk < self.min_free:
                short = (f"not enough free space: {free} bytes free, {new_disk} needed, "
                         f"{self.min_free} kept free (min_free)")
                free = None  # an eviction may free some: look again after it
                return short
            return None

        why = problem()
        if why is not None:
            candidates = summary.least_recent(self.files.last_use)
            try:
                for key in candidates:
                    row = summary.row(key)
                    if row is None or key == exclude or row[0] == keep_blob:
                        continue
                    if self.evict(key, row[0]):
                        evicted.append(key)
                    else:
                        pinned += 1
                    why = problem()
                    if why is None:
                        break
            finally:
                candidates.close()
        if why and pinned:
            why += f" ({pinned} entries in use could not be evicted)"
        if evicted:
            log.info("engine cache: evicted %d least recently used entries: %s",
                     len(evicted), ", ".join(evicted))
        return why, evicted

    def evict(self, key: str, blob: str) -> bool:
        """Remove one entry unless a hit pins its blob. Under the lock."""
        path = self.files.blobs.path(blob)
        fd = _hold_blob(path)
        if fd is None:
            return False
        try:
            # Record first: a kill after this leaves a blob no record references,
            # which recovery removes; never a record without its bytes being served.
            self.files.unlink(self.files.record(key), self.files.use(key))
            if self.files.summary.refs(blob) <= 1:
                self.files.blobs.remove(blob)
            self.files.summary.drop(key)
            return True
        finally:
            if fd >= 0:
                os.close(fd)

    def remove_blob_if_unreferenced(self, name: str) -> None:
        """Under the lock: unlink blob ``name`` (unless pinned) if no record names it.

        The summary tells (every record change is in it, or it is rebuilt).
        """
        if self.files.summary.refs(name) == 0:
            self.remove_blob_unless_pinned(name)

    def remove_blob_unless_pinned(self, name: str) -> list[Path]:
        """Under the lock: unlink a blob no record names, and its seal, unless a hit pins it.

        A hit taken just before its key was replaced may still hold the old
        blob: it stays (with its seal) until a later recovery finds it free.
        Returns the paths removed.
        """
        path = self.files.blobs.path(name)
        fd = _hold_blob(path)
        if fd is None:
            return []
        try:
            return self.files.blobs.remove(name)
        finally:
            if fd >= 0:
                os.close(fd)

    def drop_key(self, key: str, reason: str, blob: str | None = None) -> None:
        """Drop ``key``'s record (and its blob if no other key names it).

        ``blob`` is the blob the caller found wrong: when the record names
        another one by the time the lock is held, a put replaced the entry
        since the caller read it (and removed that blob), and the new entry stays.
        """
        if self.files.read_only:
            log.warning("engine cache: dropping entry %r: %s", key, reason)
            self.dropped[key] = reason
            return
        with self.files.locked():
            entry = None
            with contextlib.suppress(ValueError):
                entry = self.files.read_entry(key)
            if blob is not None and (entry is None or entry.blob != blob):
                log.info("engine cache: entry %r was replaced while read (%s): kept", key,
                         reason)
                return
            log.warning("engine cache: dropping entry %r: %s", key, reason)
            self.dropped[key] = reason
            self.files.unlink(self.files.record(key), self.files.use(key))
            self.files.summary.drop(key)
            if entry is not None:
                self.remove_blob_if_unreferenced(entry.blob)

    def drop(self, key: str, reason: str) -> bool:
        """Remove ``key``'s entry, saying ``reason`` (:meth:`BlobCache.drop`)."""
        if self.files.read_only or not os.path.exists(self.files.record(key)):
            return False
        self.drop_key(key, reason)
        self.dropped.pop(key, None)  # not damaged: nothing for a rebuild's report to say
        return True

    def drop_blob(self, name: str, reason: str, seen: os.stat_result) -> None:
        """A blob whose bytes are not the sealed ones: it and every key naming it go.

        ``seen`` is the file found damaged: when another process replaced it
        since (a put of the same bytes repairs a blob), the new one stays.
        """
        log.warning("engine cache: dropping damaged blob %s (never served): %s", name, reason)
        if self.files.read_only:
            return
        with self.files.locked():
            try:
                if not same_identity(seen, os.stat(self.files.blobs.path(name))):
                    return
            except FileNotFoundError:
                pass
            for entry in self.files.scan():  # rare (a damaged blob): the records, not the summary
                if entry.blob == name:
                    self.files.unlink(self.files.record(entry.key), self.files.use(entry.key))
                    self.files.summary.drop(entry.key)
            self.files.blobs.remove(name)

    def prune(self, max_bytes: int | None = None) -> list[str]:
        """Evict least recently used entries down to ``max_bytes`` (:meth:`BlobCache.prune`)."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(
                max_bytes, int) or max_bytes < 0):
            raise ValueError(f"prune's max_bytes must be an int >= 0, got {max_bytes!r}")
        if self.files.read_only:
            raise OSError(errno.EROFS, f"the cache {self.files.directory} is read-only: cannot "
                          "prune", os.fspath(self.files.directory))
        with self.files.locked():
            self.sweep()
            _, evicted = self.make_room(0, 0, bound=max_bytes)
        return evicted


def _hold_blob(path: Path) -> int | None:
    """Lock a blob about to be unlinked, exclusively and never waiting: None while a hit pins it.

    ``-1`` when there is nothing to hold: the blob is gone, or it is a link or a
    special file planted in ``blobs/`` (never followed, and a FIFO never blocks:
    io's :func:`try_lock`), which the caller unlinks as it is.
    """
    try:
        return try_lock(path, create=False, readonly=True)
    except (FileNotFoundError, UnsafeLockFileError):
        return -1
