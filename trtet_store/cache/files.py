"""CacheFiles: a cache directory's files, which each of :class:`~trtet_store.cache.BlobCache`'s
parts holds: ``keys/<key>.json`` (records), ``keys/<key>.use`` (use stamps), ``blobs/<name>``
and its seal ``blobs/<name>.json`` (``blobs/`` an :class:`~trtet_store.io.SealedDir`),
``tmp/``, ``lock``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.cache.layout import is_blob_name, refuse_foreign
from trtet_store.cache.summary import Summary
from trtet_store.io import NotOursError, Seal, SealedDir, read_ours, try_lock, write_atomic

log = logging.getLogger("trtet_store.cache")

#: The most a key record (``keys/<key>.json``: the key, its blob, size, times and the
#: caller's metadata) may hold; a bigger one is not ours to read.
RECORD_MAX_BYTES = 16 * 1024 * 1024


@dataclass
class Entry:
    """A key record as read from disk (under the lock or not)."""

    key: str
    blob: str
    size: int
    created: float
    metadata: dict[str, Any]
    last_use_ns: int
    hits: int


class CacheFiles:
    """The files of the cache ``directory`` (opened and checked by the caller)."""

    def __init__(self, directory: Path, *, chunk_size: int, read_only: bool) -> None:
        self.directory = directory
        self.chunk_size = chunk_size
        self.read_only = read_only
        #: ``blobs/<name>``, each sealed in ``blobs/<name>.json`` (a seal another user owns:
        #: NotOursError, a PermissionError, never trusted or removed; a link, a FIFO or one
        #: over its cap: never followed or read, its entry dropped as one with no valid seal).
        self.blobs = SealedDir(directory / "blobs", beside=True, temp_dir=directory / "tmp",
                               refuse=True)
        #: The used bytes and last-use order the bound needs (cache/summary.py).
        self.summary = Summary(directory, lambda: (
            (e.key, e.blob, e.size, e.last_use_ns) for e in self.scan()))

    def record(self, key: str) -> Path:
        return self.directory / "keys" / f"{key}.json"

    def use(self, key: str) -> Path:
        return self.directory / "keys" / f"{key}.use"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The cache-wide lock: commits, evictions, drops and recovery run under it."""
        fd = try_lock(self.directory / "lock", create=True, wait=True)
        self.summary.begin()  # others may have changed the records since we last held it
        try:
            yield
        finally:
            os.close(fd)

    def write_json(self, path: Path, data: Mapping[str, Any]) -> None:
        """Write ``path`` complete or not at all, its temp file in ``tmp/`` (under the lock)."""
        write_atomic(path, json.dumps(data, sort_keys=True).encode(),
                     temp_dir=self.directory / "tmp")

    @staticmethod
    def unlink(*paths: Path) -> list[Path]:
        """Unlink each of ``paths`` that is there, in order; the ones removed."""
        removed = []
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
        return removed

    def temp(self) -> tuple[Path, int]:
        """A new temp file in ``tmp/``, flocked by us (recovery leaves it alone while we live)."""
        path = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
        fd = try_lock(path, create=True)
        if fd is None:  # a fresh uuid name: nobody else can hold it
            raise OSError(errno.EBUSY, "temp file locked by another process", os.fspath(path))
        os.fchmod(fd, 0o600)
        return path, fd

    # -- records ------------------------------------------------------------------------

    def read_entry(self, key: str) -> Entry | None:
        """The key's record, or None when it is missing; ValueError when it is unreadable."""
        path = self.record(key)
        try:
            # io's one reader of files read back: no link followed, no FIFO waited on,
            # nothing read past the cap. Another user's record is refused as before;
            # anything else we did not make is an unreadable record (dropped as one).
            raw = json.loads(read_ours(path, limit=RECORD_MAX_BYTES, what="record"))
        except FileNotFoundError:
            return None
        except NotOursError as exc:
            if exc.other_owner:
                refuse_foreign(path, os.lstat(path), "record")
            raise ValueError(f"unreadable record {path}: {exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"unreadable record {path}: {exc}") from None
        try:
            if raw["key"] != key or not is_blob_name(raw["blob"]):
                raise ValueError(f"record {path} names key {raw['key']!r} blob {raw['blob']!r}")
            entry = Entry(key=key, blob=raw["blob"], size=int(raw["size"]),
                          created=float(raw["created"]), metadata=dict(raw["metadata"]),
                          last_use_ns=int(raw["created"] * 1e9), hits=0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable record {path}: {exc}") from None
        try:
            ust = os.stat(self.use(key))
        except FileNotFoundError:
            pass
        else:
            entry.last_use_ns, entry.hits = ust.st_mtime_ns, ust.st_size
        return entry

    def scan(self) -> list[Entry]:
        """Every readable record (unreadable ones are left to recovery)."""
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
                entry = self.read_entry(key)
                if entry is not None:
                    out.append(entry)
        return out

    def last_use(self, key: str) -> int | None:
        """The key's use stamp (mtime of ``keys/<key>.use``), or None without one."""
        try:
            return os.stat(self.use(key)).st_mtime_ns
        except OSError:
            return None

    def stamp(self, key: str, *, hit: bool = True) -> bool:
        """Record a use: a byte appended (a ``hit``; else only an existing stamp), mtime now.

        Returns whether it was; a use not recorded costs LRU precision, never a hit.
        """
        if self.read_only:
            return False
        try:
            fd = os.open(self.use(key), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
                         | (os.O_APPEND | os.O_CREAT if hit else 0), 0o600)
        except OSError as exc:
            log.debug("could not stamp the use of %s: %s", key, exc)
            return False
        try:
            if hit:
                os.write(fd, b"h")
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
        except OSError as exc:
            log.debug("could not stamp the use of %s: %s", key, exc)
            return False
        finally:
            os.close(fd)
        return True

    def check(self, name: str, seal: Seal, fd: int, st: os.stat_result, *,
              full: bool = False) -> tuple[str | None, Seal | None]:
        """:meth:`~trtet_store.io.Seal.check` of the open blob ``name``: the same bytes under
        a new identity are resealed (under the lock; not on a read-only cache)."""
        problem, renewed = seal.check(fd, st, full=full)
        if renewed not in (None, seal) and not self.read_only:
            with self.locked():
                if self.blobs.renew(name, renewed):
                    log.info("engine cache blob %s changed identity with the same bytes: "
                             "resealed", name)
        return problem, renewed
