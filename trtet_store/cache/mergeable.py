"""Small entries that many builds update: copied out privately, merged back under the key's lock.

A TensorRT timing cache is such an entry (``export/timing_cache.py`` says what
its bytes and key are; this module knows no TensorRT): every build starts from
the entry as it is and adds what it learned. Two rules keep it whole:

- **A private copy per user of the entry** (:func:`copy_out`): the bytes are
  copied into a new temp file in the cache's ``tmp/`` (mode 0600, flocked by
  this process, so recovery leaves it alone while we live), digested on the
  way and checked against the entry's seal; nobody ever writes the entry's
  file in place. A damaged entry is dropped (never handed out); one whose
  metadata the caller's ``check`` refuses is never read.
- **Merged back under the key's single flight** (:func:`merge_in`): the
  entry *as it is now* (not the copy the build started from) is combined
  with what the build wrote by the caller's ``combine`` into another temp
  file, which replaces the entry by the cache's atomic put (temp, fsync,
  rename, journal). Two builds that merge one after the other both end up
  in the entry (no lost update); a ``combine`` that refuses leaves the entry
  as it was; a process killed mid-merge leaves the previous entry whole (its
  temp file is swept by :meth:`BlobCache.recover` once it is dead).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from trtet_store.io import pwrite_all, read_fd_capped, read_ours

if TYPE_CHECKING:
    from trtet_store.cache.results import PutResult
    from trtet_store.cache.store import BlobCache

__all__ = ["Copied", "MergeRefused", "Merged", "copy_out", "merge_in"]


class MergeRefused(ValueError):
    """``combine`` will not combine the two (their headers differ): the entry is left as it was."""


@dataclass
class Copied:
    """A private copy of an entry (or an empty file: the entry was missing or not usable).

    ``path`` is this process's temp file in the cache's ``tmp/`` (flocked by
    ``fd``); ``warm`` whether it holds the entry's bytes; ``digest`` their
    xxh3-128 (what a later look tells unchanged bytes by); ``metadata`` the
    entry's; ``reason`` why an entry that was there is not in the copy
    (damaged, or refused by ``check``). :meth:`close` removes the file.
    """

    path: Path
    fd: int
    warm: bool
    digest: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Copied:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entry_bytes(cache: BlobCache, hit: Any, limit: int) -> tuple[bytes | None, str | None]:
    """The pinned ``hit``'s bytes, digested against its seal: ``(bytes, None)`` or
    ``(None, why)``; damaged bytes drop the entry (never served)."""
    data = read_fd_capped(hit.fileno(), limit, hit.path, "cache entry")
    if len(data) != hit.size or xxhash.xxh3_128_hexdigest(data) != hit.digest:
        why = (f"its bytes ({len(data)}, xxh3-128 {xxhash.xxh3_128_hexdigest(data)}) are not "
               f"the sealed ones ({hit.size}, {hit.digest})")
        cache.drop(hit.key, f"damaged: {why}")
        return None, f"the entry was damaged ({why}); dropped"
    return data, None


def copy_out(cache: BlobCache, key: str, check: Callable[[dict[str, Any]], str | None], *,
             limit: int) -> Copied:
    """A private copy of ``key``'s entry, for one user (a build) to read and rewrite.

    ``check(metadata)``: why the entry must not be used here (None: it may);
    a refused entry is never read. ``limit``: the most bytes an entry may
    hold (a bigger one is refused). Raises OSError when the cache cannot
    make a temp file (a read-only cache): the caller goes on without.
    """
    path, fd = cache.files.temp()
    copied = Copied(path, fd, False, None)
    try:
        hit = cache.get(key)
        if hit is None:
            return copied
        with hit:
            copied.metadata = dict(hit.metadata)
            problem = check(copied.metadata)
            if problem is not None:
                copied.reason = problem
                return copied
            if hit.size > limit:
                copied.reason = f"the entry holds {hit.size} bytes, over the {limit} allowed"
                return copied
            data, copied.reason = _entry_bytes(cache, hit, limit)
        if data is not None:
            pwrite_all(fd, data, 0)
            copied.warm, copied.digest = True, xxhash.xxh3_128_hexdigest(data)
    except BaseException:
        copied.close()
        raise
    return copied


@dataclass
class Merged:
    """What :func:`merge_in` did: ``merged`` (the entry now holds both), else ``reason``."""

    merged: bool
    reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    put: PutResult | None = None
    #: Why the entry that was there was not merged but replaced (damaged, refused by check).
    replaced: str | None = None


def merge_in(cache: BlobCache, key: str, learned: os.PathLike | str,
             combine: Callable[[bytes | None, bytes], tuple[bytes, dict[str, Any]]],
             check: Callable[[dict[str, Any]], str | None], metadata: dict[str, Any], *,
             limit: int, timeout: float | None = None) -> Merged:
    """Merge ``learned`` (a file this process made) into ``key``'s entry, under its single flight.

    ``combine(current or None, learned) -> (bytes, extra metadata)`` or
    :class:`MergeRefused`: the entry as it is now (None when there is none, or
    when it is damaged or refused by ``check``: then replaced) with the
    learned bytes. The result replaces the entry atomically, with
    ``metadata`` and the extra. A refusal, or a put the cache skips, leaves
    the entry as it was (``merged=False`` and why).
    """
    new = read_ours(learned, limit=limit, what="learned cache file")
    with cache.single_flight(key, timeout=timeout) as claim:
        current: bytes | None = None
        replaced = None
        hit = claim.hit
        if hit is not None:
            problem = check(dict(hit.metadata))
            if problem is None and hit.size > limit:
                problem = f"the entry holds {hit.size} bytes, over the {limit} allowed"
            if problem is None:
                current, problem = _entry_bytes(cache, hit, limit)
            replaced = problem
        try:
            combined, extra = combine(current, new)
        except MergeRefused as exc:
            return Merged(False, f"the merge was refused, the entry is left as it was: {exc}")
        path, fd = cache.files.temp()
        try:
            # No fsync here: this temp file is copied by the put, which fsyncs its own copy
            # before the record names it.
            pwrite_all(fd, combined, 0)
            meta = {**metadata, **extra}
            put = cache.put(key, path, meta)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)
    if not put.stored:
        return Merged(False, f"the merged entry was not cached: {put.reason}", meta, put,
                      replaced)
    return Merged(True, None, meta, put, replaced)
