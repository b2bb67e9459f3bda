"""BlobCache's eviction: least recently used entries go, pinned ones stay (a mixin).

Everything here runs under the cache-wide lock (``_locked``), so the room is
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
from typing import TYPE_CHECKING

from trtet_store.cache.downloads import remove_unheld
from trtet_store.io import UnsafeLockFileError, file_identity, free_bytes, try_lock

if TYPE_CHECKING:
    from trtet_store.cache.store import BlobCache

log = logging.getLogger("trtet_store.cache")


class Eviction:
    """:class:`~trtet_store.cache.BlobCache`'s eviction, drops and :meth:`prune`."""

    def _make_room(self: BlobCache, new_bytes: int, new_disk: int, *, exclude: str | None = None,
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
        summary = self._summary
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
                free = free_bytes(self.directory)
            if free - new_disk < self.min_free:
                short = (f"not enough free space: {free} bytes free, {new_disk} needed, "
                         f"{self.min_free} kept free (min_free)")
                free = None  # an eviction may free some: look again after it
                return short
            return None

        why = problem()
        if why is not None:
            candidates = summary.least_recent(self._last_use)
            try:
                for key in candidates:
                    row = summary.row(key)
                    if row is None or key == exclude or row[0] == keep_blob:
                        continue
                    if self._evict(key, row[0]):
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

    def _last_use(self: BlobCache, key: str) -> int | None:
        """The key's use stamp (mtime of ``keys/<key>.use``), or None without one."""
        try:
            return os.stat(self._use(key)).st_mtime_ns
        except OSError:
            return None

    def _evict(self: BlobCache, key: str, blob: str) -> bool:
        """Remove one entry unless a hit pins its blob. Under the lock."""
        path = self._blob(blob)
        fd = _hold_blob(path)
        if fd is None:
            return False
        try:
            # Record first: a kill after this leaves a blob no record references,
            # which recovery removes; never a record without its bytes being served.
            for p in (self._record(key), self._use(key)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            if self._summary.refs(blob) <= 1:
                for p in (self._seal(blob), path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            self._summary.drop(key)
            return True
        finally:
            if fd >= 0:
                os.close(fd)

    def _remove_blob_if_unreferenced(self: BlobCache, name: str) -> None:
        """Under the lock: unlink blob ``name`` (unless pinned) if no record names it.

        The summary tells (every record change is in it, or it is rebuilt).
        """
        if self._summary.refs(name) == 0:
            self._remove_blob_unless_pinned(name)

    def _remove_blob_unless_pinned(self: BlobCache, name: str) -> list[Path]:
        """Under the lock: unlink a blob no record names, and its seal, unless a hit pins it.

        A hit taken just before its key was replaced may still hold the old
        blob: it stays (with its seal) until a later recovery finds it free.
        Returns the paths removed.
        """
        path = self._blob(name)
        fd = _hold_blob(path)
        if fd is None:
            return []
        removed = []
        try:
            for p in (self._seal(name), path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
                    removed.append(p)
            return removed
        finally:
            if fd >= 0:
                os.close(fd)

    def _drop_key(self: BlobCache, key: str, reason: str, blob: str | None = None) -> None:
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
            self._summary.drop(key)
            if entry is not None:
                self._remove_blob_if_unreferenced(entry.blob)

    def drop(self: BlobCache, key: str, reason: str) -> bool:
        """Remove ``key``'s entry (its blob too when no other key names it), saying ``reason``.

        For an entry that is whole but no longer wanted (a refit's structure entry
        whose refit failed). Unlike a damaged entry's drop, the next :meth:`get`
        is a plain miss. Returns whether there was an entry to drop.
        """
        if self.read_only or not os.path.exists(self._record(key)):
            return False
        self._drop_key(key, reason)
        self.dropped.pop(key, None)  # not damaged: nothing for a rebuild's report to say
        return True

    def _drop_blob(self: BlobCache, name: str, reason: str, seen: os.stat_result) -> None:
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
            for entry in self._scan():  # rare (a damaged blob): the records, not the summary
                if entry.blob == name:
                    for p in (self._record(entry.key), self._use(entry.key)):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(p)
                    self._summary.drop(entry.key)
            for p in (self._seal(name), self._blob(name)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)


    def prune(self: BlobCache, max_bytes: int | None = None) -> list[str]:
        """Evict least recently used entries down to ``max_bytes`` (default: the bound).

        Also down to where the filesystem keeps ``min_free``.

        Returns the evicted keys. Entries in use are kept (the result may
        then exceed ``max_bytes``; :meth:`stats` tells). Partial downloads
        no live download holds go too (:mod:`.downloads`; what went and
        what was kept is in :attr:`swept`).
        """
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(
                max_bytes, int) or max_bytes < 0):
            raise ValueError(f"prune's max_bytes must be an int >= 0, got {max_bytes!r}")
        if self.read_only:
            raise OSError(errno.EROFS, f"the cache {self.directory} is read-only: cannot prune",
                          os.fspath(self.directory))
        with self._locked():
            self.swept = remove_unheld(self.directory)
            _, evicted = self._make_room(0, 0, bound=max_bytes)
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
