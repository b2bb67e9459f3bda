"""Pruning the shared tier (:meth:`RemoteTier.prune`): old entries, orphan attempts, dead leases.

For buckets without a lifecycle rule. Entries go by their pointer's
``created``; attempt directories no pointer names by their newest object;
leases when dead by the server's clock (:func:`.lease.prunable`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from trtet_store.cache.tier.bucket import TierBucket
from trtet_store.cache.tier.entry import RemoteEntry, check_key
from trtet_store.cache.tier.lease import LEASE_SUFFIX, prunable
from trtet_store.remote.jsondoc import LEASE_MAX_BYTES
from trtet_store.remote.sweep import Listed, plan_sweep

__all__ = ["prune"]


def prune(tier: TierBucket, older_than: float, *, dry_run: bool = False,
          entries: Callable[[], list[RemoteEntry]],
          lookup: Callable[[str], RemoteEntry | None],
          kept: dict[str, str] | None = None) -> list[str]:
    """:meth:`RemoteTier.prune` (see there): its entries, as ``entries`` and ``lookup``
    tell them, and what ``tier`` lists. Pointers and leases go by one sweep
    (:mod:`trtet_store.remote.sweep`), each ``If-Match`` the version judged."""
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) \
            or not older_than >= 0:
        raise ValueError(f"older_than must be a number of seconds >= 0, not {older_than!r}")
    now = tier.clock.time()  # the tier's clock: a test fixes "now" instead of racing it
    pointers = {tier.pointer_key(e.key): e for e in entries()}
    listing = [Listed(k, e.etag, e.created) for k, e in pointers.items()]
    newest: dict[str, float] = {}
    alive: set[str] = set()
    for k, _, modified in tier.s3.list_dated(tier.bucket, tier.prefix):
        rest = k[len(tier.prefix):]
        parts = rest.split("/")
        if len(parts) == 3:
            adir = f"{parts[0]}/{parts[1]}/"
            newest[adir] = max(newest.get(adir, 0.0), modified)
        elif len(parts) == 1 and rest.endswith(LEASE_SUFFIX) and now - modified >= older_than:
            got = tier.s3.get_dated(tier.bucket, k, LEASE_MAX_BYTES)
            if got is None:
                continue
            listing.append(Listed(k, got.etag, modified))
            # Dead by the server's clock: unchanged for two of its (capped) ttls.
            if not prunable(got, tier.lease_ttl):
                alive.add(k)
    plan = plan_sweep(listing, dict.fromkeys(alive, "a live lease"), older_than, now=now)
    gone = [i.key for i in plan.doomed] if dry_run else plan.execute(tier.s3, tier.bucket)
    kept_attempts = {e.attempt for e in pointers.values()}  # kept, or removed with its pointer
    for k in gone:
        if k in pointers and not dry_run:
            tier.remove_attempt(f"{tier.prefix}{pointers[k].attempt}")
    def name(k: str) -> str:
        return pointers[k].key if k in pointers else k[len(tier.prefix):]

    removed = [name(k) for k in gone]
    if kept is not None:
        kept.update((name(k), why) for k, why in plan.kept.items())
    for u in tier.s3.list_uploads(tier.bucket, tier.prefix):
        parts = u.key[len(tier.prefix):].split("/")
        if len(parts) == 3:
            adir = f"{parts[0]}/{parts[1]}/"
            started = u.initiated.timestamp() if hasattr(u.initiated, "timestamp") else now
            newest[adir] = max(newest.get(adir, 0.0), started)
    for adir, modified in sorted(newest.items()):
        if adir in kept_attempts or now - modified < older_than:
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
