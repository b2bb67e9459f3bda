"""Where :class:`BlobCache` was: the store is :mod:`trtet_store.cache.store` (its put
:mod:`.put`, its eviction :mod:`.evict`, its checks :mod:`.check`); this name keeps importing."""

from trtet_store.cache.store import DEFAULT_CHUNK_SIZE, BlobCache, Claim

__all__ = ["DEFAULT_CHUNK_SIZE", "BlobCache", "Claim"]
