"""The cache: a bounded, single-flight, crash-safe store of blobs keyed by opaque strings.

Built on :mod:`trtet_store.io`'s public face; it knows nothing of TensorRT
(``export/`` decides what an engine's key is). See :class:`BlobCache`.
"""

from trtet_store.cache.blobcache import DEFAULT_CHUNK_SIZE, BlobCache, Claim
from trtet_store.cache.directory import CacheDirectoryError
from trtet_store.cache.layout import default_directory
from trtet_store.cache.results import (
    CacheStats,
    CacheWaitTimeout,
    EntryInfo,
    Hit,
    PutResult,
    VerifyReport,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "BlobCache",
    "CacheDirectoryError",
    "CacheStats",
    "CacheWaitTimeout",
    "Claim",
    "EntryInfo",
    "Hit",
    "PutResult",
    "VerifyReport",
    "default_directory",
]
