"""Timing caches through the shared tier: fetched before a build, merged and published after.

:mod:`.timing_cache` keeps a key's timing cache in the local engine cache;
with ``EngineCache(remote=...)`` this module brings the team's in and sends
this machine's out, through :mod:`trtet_store.cache.mergeable_tier`:

- before a build, when the tier's pointer for the key is not the one the
  local entry last took in (its ETag, kept as ``tier_etag`` in the local
  entry's metadata), its one file is downloaded, verified (signature where
  the tier has trusted keys, sizes and digests), refused when made for
  another device, and merged into the local entry (under its single flight);
- after a build's merge, the local entry is merged with the tier's and
  published with ``If-Match`` the ETag read (a lost race re-reads, merges and
  retries a bounded number of times).

The tier never fails an export: a server that cannot be used, or an entry
refused, is said (the export's timing line) and logged.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import xxhash

from trtet_store.cache import mergeable_tier
from trtet_store.cache.mergeable import merge_in
from trtet_store.io import read_fd_capped

if TYPE_CHECKING:
    from trtet_store.cache import BlobCache
    from trtet_store.cache.tier import RemoteTier
    from trtet_store.cache.tiered import TieredCache

log = logging.getLogger("trtet_store.engine_cache")

__all__ = ["CacheLevels", "TierSaid", "pull", "push"]


class CacheLevels(Protocol):
    """What the timing modules take of an :class:`~trtet_store.EngineCache`: its levels
    (they never import engine_cache, which imports them)."""

    directory: Any

    @property
    def blobs(self) -> BlobCache: ...

    @property
    def remote(self) -> RemoteTier | None: ...

    @property
    def tiered(self) -> TieredCache: ...


@dataclass
class TierSaid:
    """What the tier did for one build's timing cache."""

    downloaded: int = 0  # bytes of the tier's entry received before the build
    fetched_reason: str | None = None  # why the tier's entry was not taken in
    published: bool | None = None
    publish_reason: str | None = None
    sent: int = 0  # bytes uploaded (the merged entry's size), 0 when not published


def _local(cache: CacheLevels, key: str, limit: int) -> tuple[bytes | None, dict[str, Any]]:
    """The local entry's bytes (checked against its seal) and metadata, or (None, {})."""
    hit = cache.blobs.get(key)
    if hit is None:
        return None, {}
    with hit:
        data = read_fd_capped(hit.fileno(), limit, hit.path, "cache entry")
        if xxhash.xxh3_128_hexdigest(data) != hit.digest:
            return None, {}
        return data, dict(hit.metadata)


def _scratch(cache: CacheLevels) -> str:
    return tempfile.mkdtemp(prefix="trtet-timing-")  # mode 0700: ours alone


def pull(cache: CacheLevels, key: str, check: Callable[[dict[str, Any]], str | None],
         combined: Callable[[bytes | None, bytes], tuple[bytes, dict[str, Any]]],
         metadata: dict[str, Any], *, limit: int, said: TierSaid) -> None:
    """Take the tier's entry of ``key`` into the local one when it changed since last taken."""
    tier = cache.remote
    if tier is None:
        return
    if cache.tiered.health.down is not None:  # said already by the build's own lookup
        said.fetched_reason = "the shared cache is not usable now"
        return
    scratch = _scratch(cache)
    try:
        _, meta = _local(cache, key, limit)
        entry = tier.lookup(key)
        if entry is None or entry.etag == meta.get("tier_etag"):
            return
        got = mergeable_tier.fetch(tier, key, os.path.join(scratch, "in"), check, limit=limit)
        if got.data is None:
            said.fetched_reason = got.reason
            if got.reason:
                log.warning("engine cache %s: %s: %s", cache.directory, key, got.reason)
            return
        said.downloaded = got.downloaded
        path = os.path.join(scratch, "fetched")
        with open(path, "xb") as f:
            f.write(got.data)
        done = merge_in(cache.blobs, key, path, combined, check,
                        {**metadata, "tier_etag": got.entry.etag}, limit=limit)
        if not done.merged:
            said.fetched_reason = done.reason
    except Exception as exc:  # the tier is an optimisation: never the export's failure
        said.fetched_reason = f"the shared cache was not usable ({type(exc).__name__}: {exc})"
        log.info("engine cache %s: timing cache %s not fetched: %s", cache.directory, key,
                 said.fetched_reason)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def push(cache: CacheLevels, key: str, check: Callable[[dict[str, Any]], str | None],
         combine: Callable[[bytes, bytes], bytes],
         combined: Callable[[bytes | None, bytes], tuple[bytes, dict[str, Any]]],
         metadata: Callable[[bytes], dict[str, Any]], *, limit: int, said: TierSaid) -> None:
    """Merge the local entry of ``key`` into the tier's and publish it (If-Match)."""
    tier = cache.remote
    if tier is None:
        return
    if cache.tiered.health.down is not None:  # said already by the build's own lookup
        said.published, said.publish_reason = False, "the shared cache is not usable now"
        return
    scratch = _scratch(cache)
    try:
        mine, _ = _local(cache, key, limit)
        if mine is None:
            return
        pub, why, out = mergeable_tier.publish_merged(
            tier, key, mine, combine, check, metadata, scratch, limit=limit)
        said.published, said.publish_reason = (pub is not None and pub.published), why
        if pub is None or not pub.published:
            if why is None:  # the tier held all of it already
                said.published = None
            return
        said.sent = pub.sent
        path = os.path.join(scratch, "published")
        with open(path, "xb") as f:
            f.write(out)
        # The local entry takes in what was published (a superset of it) and its ETag:
        # the next build here downloads nothing until another machine publishes.
        merge_in(cache.blobs, key, path, combined, check,
                 {**metadata(out), "tier_etag": pub.entry.etag}, limit=limit)
    except Exception as exc:  # the tier is an optimisation: never the export's failure
        said.published = False
        said.publish_reason = f"the shared cache was not usable ({type(exc).__name__}: {exc})"
        log.info("engine cache %s: timing cache %s not published: %s", cache.directory,
                 key, said.publish_reason)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

