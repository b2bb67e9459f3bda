"""What the cache hands back: hits, put results, listings, and its errors."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import Digests, ExternalFile, same_identity


class CacheWaitTimeout(TimeoutError):
    """A single-flight wait ran out: another process kept building ``key`` for ``waited`` s."""

    def __init__(self, key: str, waited: float, lock_path: Path) -> None:
        self.key = key
        self.waited = waited
        self.lock_path = lock_path
        super().__init__(
            f"waited {waited:.1f} s for another process to finish building cache key {key!r} "
            f"(it holds {lock_path}); pass a longer timeout=, or timeout=None to wait until it "
            "finishes or dies")


class Hit:
    """A cache entry, pinned: never evicted while this handle is open.

    It holds a shared ``flock`` on the entry's blob file, which every
    eviction tries to take exclusively without waiting (and skips the entry
    when it cannot). Use it as a context manager, or call :meth:`close`.

    Attributes
    ----------
    key : str
    path : pathlib.Path
        The blob file: read it, clone it or copy it while the hit is open.
        Never write to it.
    size : int
    digest : str
        xxh3-128 hex of the bytes (as :class:`trtet_store.io.Digester`).
    chunk_size : int
    chunk_digests : tuple of int
        xxh3-64 of each ``chunk_size`` chunk, for a placement to check.
    metadata : dict
        The caller's metadata recorded with :meth:`BlobCache.put`.
    created : float
        When the entry was stored (seconds since the epoch).
    hits : int
        Hits recorded before this one.
    resealed : bool
        The file's identity had changed and a full re-digest found the same bytes.
    identity : tuple of int
        The blob's sealed identity (device, inode, size, mtime, ctime), which
        the file had when this hit was made (:meth:`unchanged` asks again).
    verified : bool
        The hit re-read the whole blob and found its sealed digests
        (``get(verify="full")``, or a changed identity).
    """

    def __init__(self, *, key: str, path: Path, fd: int, size: int, digest: str,
                 chunk_size: int, chunk_digests: tuple[int, ...], metadata: dict[str, Any],
                 created: float, hits: int, resealed: bool,
                 identity: tuple[int, ...] = (), verified: bool = False) -> None:
        self.key = key
        self.path = path
        self._fd = fd
        self.size = size
        self.digest = digest
        self.chunk_size = chunk_size
        self.chunk_digests = chunk_digests
        self.metadata = metadata
        self.created = created
        self.hits = hits
        self.resealed = resealed
        self.identity = tuple(identity)
        self.verified = verified

    def unchanged(self) -> bool:
        """Whether the pinned file still has its sealed identity (one ``fstat``).

        What makes :meth:`digests` true of bytes read or cloned from it: ask
        after reading them (a write, truncate or replacement in between
        changes the identity).
        """
        return same_identity(self.identity, os.fstat(self.fileno()))

    def digests(self) -> Digests:
        """The sealed digests of the hit's bytes, checked by the hit (identity, or a re-read)."""
        return Digests(self.digest, self.size, self.chunk_size, tuple(self.chunk_digests))

    def fileno(self) -> int:
        """The open, read-only descriptor of the blob (valid until :meth:`close`)."""
        if self._fd < 0:
            raise ValueError(f"the cache hit for {self.key!r} is closed")
        return self._fd

    def external_file(self) -> ExternalFile:
        """The blob as an io piece: ``write_file`` clones it where it can, else copies it."""
        return ExternalFile(self.path, self.size, chunk_size=self.chunk_size,
                            chunk_digests=self.chunk_digests)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Unpin the entry (closing the descriptor releases its shared lock). Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Hit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Hit({self.key!r}, {os.fspath(self.path)!r}, size={self.size}" + (
            ", closed)" if self.closed else ")")


@dataclass(frozen=True)
class PutResult:
    """What :meth:`BlobCache.put` did.

    ``stored`` is False when the entry was skipped; ``reason`` says why
    (larger than the bound, not enough free space above ``min_free``, no room
    because entries are in use, a permission or read-only filesystem error,
    the same bytes already cached under the key). ``placement`` says how the
    bytes entered: ``clone``, ``copy``, ``link`` (``consume=True`` on the same
    filesystem) or ``dedup`` (identical bytes already stored, under another key
    or this one: nothing was written).
    ``evicted`` names the entries evicted to make room; ``digest`` is the
    stored bytes' xxh3-128. ``hit`` is the stored entry, pinned, when the put
    was asked for it (``put(..., pin=True)``): the caller closes it.
    """

    key: str
    stored: bool
    size: int
    reason: str | None = None
    placement: str | None = None
    evicted: tuple[str, ...] = ()
    digest: str | None = None
    hit: Hit | None = field(default=None, compare=False, repr=False)

    @property
    def skipped(self) -> bool:
        return not self.stored


@dataclass(frozen=True)
class EntryInfo:
    """One entry as :meth:`BlobCache.entries` lists it."""

    key: str
    size: int
    digest: str
    last_use: float
    hits: int
    created: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheStats:
    """:meth:`BlobCache.stats`: ``bytes`` counts each distinct blob once (what the bound bounds)."""

    directory: Path
    entries: int
    blobs: int
    bytes: int
    max_bytes: int
    min_free: int
    free_bytes: int
    hits: int
    read_only: bool
    #: Bytes on disk under ``downloads/``: remote hits being downloaded, or cut off
    #: mid-way and kept for the next hit to resume (``clear`` removes those no one holds).
    downloads_bytes: int = 0


@dataclass(frozen=True)
class VerifyReport:
    """:meth:`BlobCache.verify`: entries fully re-digested, and those dropped with why."""

    checked: int
    dropped: tuple[tuple[str, str], ...]

    @property
    def ok(self) -> bool:
        return not self.dropped


@dataclass
class TierOutcome:
    """What a ``get`` or ``publish`` of the two-level cache did with the shared tier.

    ``action`` is ``"hit"`` (downloaded ``downloaded`` bytes and served),
    ``"miss"`` (no entry, or a foreign or damaged one: ``reason``),
    ``"published"``, ``"not-published"`` (``reason``: already there, lost
    the race, ...) or ``"error"`` (the tier failed: ``reason``; warned).
    """

    key: str
    action: str
    reason: str | None = None
    downloaded: int = 0
    sent: int = 0
    #: A hit's way into the local cache (PutResult.placement: "link", "copy",
    #: "clone", "dedup"), or None (not entered: served from the download, or no hit).
    placement: str | None = None
