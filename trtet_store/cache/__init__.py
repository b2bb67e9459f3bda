"""The cache: a bounded, single-flight, crash-safe store of blobs keyed by opaque strings.

Built on :mod:`trtet_store.io`'s public face; it knows nothing of TensorRT
(``export/`` decides what an engine's key is). See :class:`BlobCache`. Its
second level, the shared tier in object storage (:mod:`.tier`: entries and
leases over :mod:`trtet_store.remote`), loads on first use of its names.
"""

from typing import Any

from trtet_store.cache.directory import CacheDirectoryError
from trtet_store.cache.layout import default_directory
from trtet_store.cache.results import (
    CacheStats,
    CacheWaitTimeout,
    EntryInfo,
    Hit,
    PutResult,
    TierOutcome,
    VerifyReport,
)
from trtet_store.cache.store import DEFAULT_CHUNK_SIZE, BlobCache, Claim
from trtet_store.cache.tiered import TieredCache

# The tier's names, imported on first access (PEP 562): the tier loads the remote floor.
_TIER_NAMES = frozenset({
    "ConditionalWritesUnsupportedError", "KeyFileError", "Lease", "LeaseWait", "LeaseWaitTimeout",
    "PublicKey", "RemoteEntry", "RemoteTier",
    "SigningKey", "SigningUnavailableError", "TierDownload", "TierEntryError", "TierPublish",
    "TierSignatureError", "TIER_ERRORS"})


def __getattr__(name: str) -> Any:
    if name not in _TIER_NAMES:
        raise AttributeError(f"module 'trtet_store.cache' has no attribute {name!r}")
    from trtet_store.cache import tier

    return getattr(tier, name)


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
    "TierOutcome",
    "TieredCache",
    "VerifyReport",
    "default_directory",
]
