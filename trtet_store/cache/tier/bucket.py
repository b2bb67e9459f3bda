"""TierBucket: a tier's place in its bucket and its lease settings (what claim, probe, prune take).

:attr:`RemoteTier.where <.store.RemoteTier.where>` makes one from the tier's
attributes at each use: those operations never see the tier itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from trtet_store.cache.tier.lease import LEASE_SUFFIX, Clock
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.manifest import MANIFEST_SUFFIX
from trtet_store.remote.s3 import S3

log = logging.getLogger("trtet_store.cache.tier")

POINTER_SUFFIX = ".json"


@dataclass(frozen=True)
class TierBucket:
    """``s3://bucket/prefix`` through ``s3`` (said as ``url``), with its leases' ttl and keys."""

    s3: S3
    bucket: str
    prefix: str
    url: str
    endpoint_url: str | None
    lease_ttl: float
    poll: float
    signing_key: Any
    trusted_keys: Any
    clock: Clock

    def pointer_key(self, key: str) -> str:
        return f"{self.prefix}{key}{POINTER_SUFFIX}"

    def lease_key(self, key: str) -> str:
        return f"{self.prefix}{key}{LEASE_SUFFIX}"

    def remove_attempt(self, adir: str) -> None:
        """Delete every object under ``adir`` (manifests first), best effort, logged.

        Called only for an attempt no pointer names any more (a replaced or
        pruned entry's, a lost race's, an orphan's): its objects have no
        reader, so they go whatever their ETag. An object someone rewrote
        (the tampering a replace repairs) would otherwise stay, billed, for
        good. An attempt directory is its origin's alone, and a replacement
        never reuses the damaged one's (``-r`` suffix).
        """
        try:
            keys = self.s3.list_keys(self.bucket, adir, delimiter="")
            # The manifest first: a directory without it is never taken for complete.
            for k in sorted(keys, key=lambda k: not k.endswith(MANIFEST_SUFFIX)):
                self.s3.delete(self.bucket, k)
            for u in self.s3.list_uploads(self.bucket, adir):
                self.s3.abort(self.bucket, u.key, u.upload_id)
        except RemoteError as exc:
            log.warning("%s: could not remove %s (%s); prune removes it later", self.url,
                        adir, exc)
