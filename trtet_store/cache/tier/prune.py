"""Pruning the shared tier (:meth:`RemoteTier.prune`): old entries, orphan attempts, dead leases.

For buckets without a lifecycle rule. Entries go by their pointer's
``created``; attempt directories no pointer names by their newest object;
leases when dead by the server's clock (:func:`.lease.prunable`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from trtet_store.cache.tier.bucket import TierBucket
from trtet_store.cache.tier.entry import RemoteEntry, check_key
from trtet_store.cache.tier.lease import LEASE_SUFFIX, prunable
from trtet_store.remote.errors import ObjectChangedError
from trtet_store.remote.jsondoc import LEASE_MAX_BYTES
from trtet_store.remote.s3 import PreconditionFailed

__all__ = ["prune"]


def prune(tier: TierBucket, older_than: float, *, dry_run: bool = False,
          entries: Callable[[], list[RemoteEntry]], delete: Callable[[RemoteEntry], None],
          lookup: Callable[[str], RemoteEntry | None]) -> list[str]:
    """:meth:`RemoteTier.prune` (see there): its entries, as ``entries``, ``delete`` and
    ``lookup`` tell them, and what ``tier`` lists."""
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) \
            or not older_than >= 0:
        raise ValueError(f"older_than must be a number of seconds >= 0, not {older_than!r}")
    now = time.time()
    cutoff = now - older_than
    removed: list[str] = []
    kept_attempts: set[str] = set()
    for entry in entries():
        if entry.created < cutoff:
            if not dry_run:
                try:
                    delete(entry)
                except ObjectChangedError:
                    kept_attempts.add(entry.attempt)  # replaced meanwhile: not ours
                    continue
            removed.append(entry.key)
        else:
            kept_attempts.add(entry.attempt)
    listing = tier.s3.list_dated(tier.bucket, tier.prefix)
    newest: dict[str, float] = {}
    for k, _, modified in listing:
        rest = k[len(tier.prefix):]
        parts = rest.split("/")
        if len(parts) == 3:
            adir = f"{parts[0]}/{parts[1]}/"
            newest[adir] = max(newest.get(adir, 0.0), modified)
        elif len(parts) == 1 and rest.endswith(LEASE_SUFFIX) and modified < cutoff:
            got = tier.s3.get_dated(tier.bucket, k, LEASE_MAX_BYTES)
            # Dead by the server's clock: unchanged for two of its (capped) ttls.
            if got is None or not prunable(got, tier.lease_ttl):
                continue
            if not dry_run:
                try:
                    tier.s3.delete(tier.bucket, k, if_match=got.etag)
                except PreconditionFailed:
                    continue  # renewed or taken over meanwhile: alive
            removed.append(rest)
    for u in tier.s3.list_uploads(tier.bucket, tier.prefix):
        parts = u.key[len(tier.prefix):].split("/")
        if len(parts) == 3:
            adir = f"{parts[0]}/{parts[1]}/"
            started = u.initiated.timestamp() if hasattr(u.initiated, "timestamp") else now
            newest[adir] = max(newest.get(adir, 0.0), started)
    for adir, modified in sorted(newest.items()):
        if adir in kept_attempts or modified >= cutoff:
            continue
        key = adir.split("/")[0]
        with contextlib.suppress(ValueError):
            check_key(key)
            # Looked at once more: a pointer written since our listing keeps it.
            current = lookup(key)
            if current is not None and current.attempt == adir:
                continue
            if not dry_run:
                tier.remove_attempt(f"{tier.prefix}{adir}")
            removed.append(adir)
    return removed

