"""BlobCache's checks: a blob against its seal, verify, recover, clear; the listings (a mixin).

:meth:`~Checks.recover` runs when a cache opens to write; it removes only
what it recognises as the cache's own leftovers, and refuses (never removes)
a file another user owns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.cache.downloads import downloads_bytes, remove_unheld
from trtet_store.cache.layout import refuse_foreign
from trtet_store.cache.results import CacheStats, EntryInfo, VerifyReport
from trtet_store.io import (
    UnsafeLockFileError,
    digest_fd,
    file_identity,
    free_bytes,
    fsync_dir,
    release,
    try_lock,
)

if TYPE_CHECKING:
    from trtet_store.cache.store import BlobCache

log = logging.getLogger("trtet_store.cache")


class Checks:
    """:class:`~trtet_store.cache.BlobCache`'s seal checks, :meth:`verify`, :meth:`recover`,
    :meth:`clear`, :meth:`entries` and :meth:`stats`."""

    # -- a blob against its seal (hits and verify) ----------------------------------------

    def _check_blob(self: BlobCache, fd: int, st: os.stat_result,
                    seal: Mapping[str, Any]) -> str | None:
        """None when the file is as sealed; a reason, or ``"identity"`` (re-digest to tell)."""
        if not stat.S_ISREG(st.st_mode):
            return "the blob is not a regular file"
        if st.st_size != int(seal["size"]):
            return f"size {st.st_size}, sealed {seal['size']} (truncated or extended)"
        if file_identity(st) != tuple(seal["identity"]):
            return "identity"
        return None

    def _redigest(self: BlobCache, fd: int, seal: Mapping[str, Any]) -> str | None:
        """Read the whole blob again: None when its digests are the sealed ones."""
        digest, chunks, size = digest_fd(fd, int(seal["chunk_size"]))
        if size != int(seal["size"]):
            return f"read {size} bytes, sealed {seal['size']}"
        if digest != seal["digest"] or chunks != tuple(seal["chunk_digests"]):
            bad = next((i for i, (a, b) in enumerate(zip(chunks, seal["chunk_digests"],
                                                         strict=False)) if a != b), None)
            return f"digest mismatch (first bad chunk {bad})"
        return None

    def _reseal(self: BlobCache, name: str, seal: Mapping[str, Any], st: os.stat_result) -> None:
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

    # -- listings and maintenance -------------------------------------------------------

    def entries(self: BlobCache) -> list[EntryInfo]:
        """Every entry, most recently used first (reads records only; no bytes)."""
        out = []
        for e in self._scan():
            seal = self._read_seal(e.blob) or {}
            out.append(EntryInfo(key=e.key, size=e.size, digest=seal.get("digest", ""),
                                 last_use=e.last_use_ns / 1e9, hits=e.hits, created=e.created,
                                 metadata=e.metadata))
        return sorted(out, key=lambda i: (-i.last_use, i.key))

    def stats(self: BlobCache) -> CacheStats:
        entries = self._scan()
        blobs = {e.blob: e.size for e in entries}
        return CacheStats(directory=self.directory, entries=len(entries), blobs=len(blobs),
                          bytes=sum(blobs.values()), max_bytes=self.max_bytes,
                          min_free=self.min_free, free_bytes=free_bytes(self.directory),
                          hits=sum(e.hits for e in entries), read_only=self.read_only,
                          downloads_bytes=downloads_bytes(self.directory))

    def clear(self: BlobCache) -> list[str]:
        """Remove every entry not in use, and every partial download no download holds.

        Returns the removed keys (the downloads removed and kept: :attr:`swept`).
        """
        return self.prune(0)

    def verify(self: BlobCache) -> VerifyReport:
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
                    fd = try_lock(path, create=False, readonly=True, wait=True, shared=True)
                except FileNotFoundError:
                    # Gone; or replaced while we waited, by a put that digested the new bytes.
                    problem = None if os.path.lexists(path) else "the blob is gone"
                except UnsafeLockFileError:  # a link or a special file: never followed
                    problem = "the blob is not a regular file"
                else:
                    try:
                        st = os.fstat(fd)
                        problem = self._check_blob(fd, st, seal)
                        if problem in (None, "identity"):
                            again = self._redigest(fd, seal)
                            if again is None and problem == "identity":
                                self._reseal(entry.blob, seal, st)
                            problem = again
                    finally:
                        release(fd)
            checked += 1
            if problem is not None:
                dropped.append((entry.key, problem))
                if seal is not None and st is not None:
                    self._drop_blob(entry.blob, f"entry {entry.key!r}: {problem}", st)
                else:
                    self._drop_key(entry.key, problem, entry.blob)
        return VerifyReport(checked=checked, dropped=tuple(dropped))

    def recover(self: BlobCache, *, downloads: bool = True) -> list[Path]:
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
        removed: list[Path] = []

        def rm(path: Path) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)

        with self._locked():
            if downloads:
                self.swept = remove_unheld(self.directory)
                removed += self.swept.removed
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
            rows = {}  # what the summary must say (cache/summary.py)
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
                rows[key] = (entry.blob, entry.size, entry.last_use_ns)
            for name in os.listdir(keys):
                if name.endswith(".use") and not (keys / f"{name[:-4]}.json").exists():
                    rm(keys / name)
            unreferenced = {name.removesuffix(".json") for name in os.listdir(blobs)} - referenced
            for name in sorted(unreferenced):
                removed += self._remove_blob_unless_pinned(name)
            if removed:
                fsync_dir(keys)
                fsync_dir(blobs)
            # Every record was just read: the summary is kept if it says the same, else
            # written anew (after a power cut nothing else tells an unsynced line).
            self._summary.agree(rows)
        if removed:
            log.info("engine cache %s: recovered, removed %d leftover files", self.directory,
                     len(removed))
        return removed
