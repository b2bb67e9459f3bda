"""A cached engine as a staged blob: cloned or copied in, or the cache's own file shared.

The export's hands on a cache entry's bytes, for :mod:`.engine_build` (a hit
staged for the save) and :mod:`.engine_put` (a build the cache took by hard
link, given back to the save): both import this module, which imports
neither, so no file circle. Knows io and the blob cache's :class:`Hit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.io import Digests, clone_or_copy

if TYPE_CHECKING:
    from trtet_store.cache import Hit
    from trtet_store.io import Blob, BlobStore

log = logging.getLogger("trtet_store.engine_cache")

__all__ = ["place_taken", "share_hit", "stage_hit"]


def stage_hit(store: BlobStore, hit: Hit, metadata: dict[str, Any], *,
              verify: str = "seal") -> tuple[Blob, str]:
    """A staged blob holding ``hit``'s bytes: cloned where the filesystem allows, else copied.

    Written as a ``.blob.part`` of ``store``'s own token (so a kill mid-copy
    leaves what the next open of the store removes), then adopted by rename,
    never given back anywhere. Returns the blob and ``"clone"`` or ``"copy"``.

    The blob is adopted with the hit's sealed digests, read from nothing,
    when the hit's file still has its sealed identity after the clone or
    copy (so the bytes taken are the sealed ones) and, with ``verify="full"``,
    the hit re-read them (:attr:`Hit.verified`). Otherwise it is adopted
    without digests, and read once when its digest is asked for.
    """
    from trtet_store.io.names import BLOB_PART_SUFFIX

    tmp = store.directory / f"{store.token}-cache{uuid.uuid4().hex[:12]}{BLOB_PART_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        placement = clone_or_copy(hit.fileno(), fd, hit.size, what="the cached engine")
        os.close(fd)
        fd = -1
        blob = store.adopt(tmp, metadata=metadata, give_back=False,
                           digests=_trusted_digests(hit, verify))
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return blob, placement


def _trusted_digests(hit: Any, verify: str) -> Digests | None:
    """The hit's digests, if its bytes just taken are provably the ones they describe."""
    if verify == "full" and not getattr(hit, "verified", False):
        return None
    unchanged = getattr(hit, "unchanged", None)
    if unchanged is None or not unchanged():
        return None
    return hit.digests()


def share_hit(store: BlobStore, hit: Hit, metadata: dict[str, Any], *,
              verify: str = "seal") -> tuple[Blob, str]:
    """``hit`` as a staged blob at the least bytes written: cloned, else the cached file itself.

    Where the cache's file clones into ``store``, :func:`stage_hit` (the save
    then consumes the clone, 0 bytes). Elsewhere (ext4, another filesystem) a
    copy into the store would be written again by the save (1.5 copies on
    ext4: one engine inserted, the others moved): the blob is the cached file
    itself (:meth:`BlobStore.share`, pinned until the blob is released, with
    the hit's sealed digests), which the save copies once and never consumes.
    Only a blob cache's own hit is shared, and only while its file has its
    sealed identity (and, with ``verify="full"``, was re-read): a download
    served without entering the cache is removed after the lookup, so it is
    staged as before.
    """
    from trtet_store.cache import Hit as CacheHit
    from trtet_store.io import fs
    from trtet_store.io.errors import PlacementUnavailable

    try:
        fs.probe_clone(Path(hit.path), Path(store.directory))
    except (PlacementUnavailable, OSError):
        if isinstance(hit, CacheHit) and _trusted_digests(hit, verify) is not None:
            return store.share(hit.path, hit.fileno(), digest=hit.digest,
                               chunk_size=hit.chunk_size, chunk_digests=hit.chunk_digests,
                               metadata=metadata), "copy"
    return stage_hit(store, hit, metadata, verify=verify)


def place_taken(taken: list[tuple[Any, Hit]], whole: bool) -> None:
    """Give each engine consumed into the cache its blob again, from its pinned entry.

    ``whole``: the build is cached with its record, so the cache keeps it for
    the next call: the blob is the cache's file, shared (the save copies it
    once). Otherwise the bytes are staged again (the store's own blob, kept
    if the save fails; a copy, cloned where it can be), or shared where that
    copy fails (no room): they are never lost to the export. Each engine has
    its own blob here (:meth:`EngineCache.put_build` takes none twice).
    """
    try:
        for engine, hit in taken:
            store, metadata = engine.blob.store, engine.blob.metadata
            if not whole:
                try:
                    engine.blob, _ = stage_hit(store, hit, metadata)
                    continue
                except OSError as exc:
                    log.warning("engine cache: engine %s could not be staged again from %s "
                                "(%s); placed from the cache's file", engine.engine_id,
                                hit.path, exc)
            engine.blob, _ = share_hit(store, hit, metadata)
    finally:
        for _, hit in taken:
            hit.close()
