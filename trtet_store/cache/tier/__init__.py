"""The shared tier: entries (a few files + a JSON metadata dict) under opaque keys, and leases.

It sits above :mod:`trtet_store.remote.upload` and
:mod:`trtet_store.remote.download` (neither imports it) and knows no
TensorRT and no engine cache: files in, files out. See :mod:`.store` for the
bucket layout and the conditions every write carries, :mod:`.lease` for
leases, :mod:`.entry` for the pointer, :mod:`.signing` for its signature,
:mod:`trtet_store.remote.keyconfig` for where keys come from and :mod:`.probe` for the check
that the server honours the conditions (else nothing is written:
:class:`ConditionalWritesUnsupportedError`).
"""

from __future__ import annotations

from trtet_store.cache.tier.entry import RemoteEntry, TierEntryError
from trtet_store.cache.tier.errors import TIER_ERRORS as TIER_ERRORS
from trtet_store.cache.tier.lease import Lease, LeaseWait
from trtet_store.cache.tier.signing import (
    KeyFileError,
    PublicKey,
    SigningKey,
    SigningUnavailableError,
    TierSignatureError,
    keygen,
)
from trtet_store.cache.tier.store import LeaseWaitTimeout, RemoteTier, TierDownload, TierPublish
from trtet_store.remote.errors import ConditionalWritesUnsupportedError
from trtet_store.remote.keyconfig import resolve_keys as resolve_keys  # keys as the tier takes them
from trtet_store.remote.url import RemoteURL as RemoteURL  # s3://bucket[/prefix]

# Also importable from here, off __all__ (not the tier's classes of the remote face's
# aliases): TIER_ERRORS (errors.py), RemoteURL (the tier's URL), resolve_keys (where the
# tier's keys come from: remote/keyconfig.py, for export/, which never imports remote).
__all__ = ["ConditionalWritesUnsupportedError", "KeyFileError", "Lease", "LeaseWait",
           "LeaseWaitTimeout", "PublicKey", "RemoteEntry",
           "RemoteTier", "SigningKey", "SigningUnavailableError", "TierDownload",
           "TierEntryError", "TierPublish", "TierSignatureError", "keygen"]
