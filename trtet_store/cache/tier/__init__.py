"""The shared tier: entries (a few files + a JSON metadata dict) under opaque keys, and leases.

It sits above :mod:`trtet_store.remote.upload` and
:mod:`trtet_store.remote.download` (neither imports it) and knows no
TensorRT and no engine cache: files in, files out. See :mod:`.store` for the
bucket layout and the conditions every write carries, :mod:`.lease` for
leases, :mod:`.entry` for the pointer, :mod:`.signing` for its signature and
:mod:`.keyconfig` for where keys come from.
"""

from __future__ import annotations

from trtet_store.cache.tier.entry import RemoteEntry, TierEntryError
from trtet_store.cache.tier.errors import TIER_ERRORS, RemoteError
from trtet_store.cache.tier.lease import Lease
from trtet_store.cache.tier.signing import (
    KeyFileError,
    PublicKey,
    SigningKey,
    SigningUnavailableError,
    TierSignatureError,
    keygen,
)
from trtet_store.cache.tier.store import LeaseWaitTimeout, RemoteTier, TierDownload, TierPublish

__all__ = ["TIER_ERRORS", "KeyFileError", "Lease", "LeaseWaitTimeout", "PublicKey",
           "RemoteEntry", "RemoteError", "RemoteTier", "SigningKey", "SigningUnavailableError",
           "TierDownload", "TierEntryError", "TierPublish", "TierSignatureError", "keygen"]
