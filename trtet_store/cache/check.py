"""BlobCache's checks: verify, recover; the listings.

:meth:`~Checker.recover` runs when a cache opens to write; it removes only
what it recognises as the cache's own leftovers, and refuses (never removes)
a file another user owns.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trtet_store.cache.downloads import downloads_bytes
from trtet_store.cache.evict import Evictor
from trtet_store.cache.files import CacheFiles
from trtet_store.cache.layout import refuse_foreign
from trtet_store.cache.results import CacheStats, EntryInfo, VerifyReport
from trtet_store.io import UnsafeLockFileError, free_bytes, fsync_dir, release, try_lock

log = logging.getLogger("trtet_store.cache")


class Checker:
    """A cache's :meth:`verify`, :meth:`recover`, :meth:`entries` and :meth:`stats`."""

    def __init__(self, files: CacheFiles, evictor: Evictor) -> None:
        self.files, self.evictor = files, evictor

    def entries(self) -> list[EntryInfo]:
        """Every entry, most recently used first (reads records only; no bytes)."""
        out = []
        for e in self.files.scan():
            seal = self.files.blobs.read(e.blob)
            out.append(EntryInfo(key=e.key, size=e.size, digest=seal.digest if seal else "",
                                 last_use=e.last_use_ns / 1e9, hits=e.hits, created=e.created,
                                 metadata=e.metadata))
        return sorted(out, key=lambda i: (-i.last_use, i.key))

    def stats(self) -> CacheStats:
        entries = self.files.scan()
        blobs = {e.blob: e.size for e in entries}
        files, evictor = self.files, self.evictor
        return CacheStats(directory=files.directory, entries=len(entries), blobs=len(blobs),
                          bytes=sum(blobs.values()), max_bytes=evictor.max_bytes,
                          min_free=evictor.min_free, free_bytes=free_bytes(files.directory),
                          hits=sum(e.hits for e in entries), read_only=files.read_only,
                          downloads_bytes=downloads_bytes(files.directory))

    def verify(self) -> VerifyReport:
        """Re-digest every entry in full; drop (and log) each whose bytes are not as sealed."""
        checked, dropped = 0, []
        for entry in self.files.scan():
            seal = self.files.blobs.read(entry.blob)
            path = self.files.blobs.path(entry.blob)
            problem, st = None, None
            if seal is None:
                problem = "no valid seal"
            else:
                try:
                    fd = try_lock(path, create=False, readonly=True, wait=True, shared=True)
                except FileNotFoundError:
                    # Gone; or replaced while we waited, by a put that digested the new bytes.
                    problem = None if os.path.lexists(path) else "the blob is gone"
                except UnsafeLockFileError:  # a link or a special file: never followed
                    problem = "the blob is not a regular file"
                else:
                    try:
                        st = os.fstat(fd)
                        problem, _ = self.files.check(entry.blob, seal, fd, st, full=True)
                    finally:
                        release(fd)
            checked += 1
            if problem is not None:
                dropped.append((entry.key, problem))
                if seal is not None and st is not None:
                    self.evictor.drop_blob(entry.blob, f"entry {entry.key!r}: {problem}", st)
                else:
                    self.evictor.drop_key(entry.key, problem, entry.blob)
        return VerifyReport(checked=checked, dropped=tuple(dropped))

    def recover(self, *, downloads: bool = True) -> list[Path]:
        """Clean what interrupted inserts and evictions left (:meth:`BlobCache.recover`)."""
        removed: list[Path] = []
        with self.files.locked():
            if downloads:
                removed += self.evictor.sweep().removed
            for sub in ("tmp", "flights"):
                for name in os.listdir(self.files.directory / sub):
                    path = self.files.directory / sub / name
                    refuse_foreign(path, os.lstat(path), "file")
                    try:
                        fd = try_lock(path, create=False)
                    except FileNotFoundError:
                        continue
                    if fd is not None:  # its writer is gone
                        removed += self.files.unlink(path)
                        os.close(fd)
            keys, blobs = self.files.directory / "keys", self.files.directory / "blobs"
            for name in os.listdir(keys):
                refuse_foreign(keys / name, os.lstat(keys / name), "file")
            for name in os.listdir(blobs):
                refuse_foreign(blobs / name, os.lstat(blobs / name), "file")
            referenced: set[str] = set()
            rows = {}  # what the summary must say (cache/summary.py)
            for name in sorted(os.listdir(keys)):
                if not name.endswith(".json"):
                    continue
                key = name[:-5]
                try:
                    entry = self.files.read_entry(key)
                except ValueError as exc:
                    log.warning("engine cache: removing %s", exc)
                    entry = None
                if entry is None or self.files.blobs.read(entry.blob) is None or \
                        not self.files.blobs.path(entry.blob).exists():
                    removed += self.files.unlink(keys / name)
                    continue
                referenced.add(entry.blob)
                rows[key] = (entry.blob, entry.size, entry.last_use_ns)
            for name in os.listdir(keys):
                if name.endswith(".use") and not (keys / f"{name[:-4]}.json").exists():
                    removed += self.files.unlink(keys / name)
            unreferenced = {name.removesuffix(".json") for name in os.listdir(blobs)} - referenced
            for name in sorted(unreferenced):
                removed += self.evictor.remove_blob_unless_pinned(name)
            if removed:
                fsync_dir(keys)
                fsync_dir(blobs)
            # Every record was just read: the summary is kept if it says the same, else
            # written anew (after a power cut nothing else tells an unsynced line).
            self.files.summary.agree(rows)
        if removed:
            log.info("engine cache %s: recovered, removed %d leftover files", self.files.directory,
                     len(removed))
        return removed
