"""The wait of :meth:`RemoteTier.claim`: an entry, our lease, or a wait on another holder's.

Each look reads the pointer, then the lease with its dates
(:meth:`~trtet_store.remote.s3.S3.get_dated`); :class:`.lease.LeaseWatch`
judges it (dead by the server's clock, or unchanged for its capped ttl on
ours) and says the wait out loud. Before a lease is written, the server's
conditional writes are probed (:mod:`.probe`; once per endpoint and bucket).

A lease is read with a size cap (:data:`LEASE_MAX_BYTES`, checked on the
answer's ContentLength before its body is read): a larger one is not read,
said once, and judged as a damaged lease. With trusted keys on the tier,
only a lease signed by one of them holds a waiter (:func:`.lease.lease_refusal`):
any other is said once at WARNING and taken over at once. Time is the
tier's :attr:`RemoteTier.clock`. It takes the tier's :class:`.bucket.TierBucket` and
its ``lookup``, never the tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trtet_store.cache.tier.bucket import TierBucket
from trtet_store.cache.tier.entry import RemoteEntry, check_key
from trtet_store.cache.tier.lease import (
    Lease,
    LeaseWaitTimeout,
    LeaseWatch,
    lease_body,
    lease_refusal,
    new_holder,
    parse_lease,
    put,
)
from trtet_store.cache.tier.probe import require_conditional_writes
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.jsondoc import LEASE_MAX_BYTES
from trtet_store.remote.s3 import PreconditionFailed

__all__ = ["claim"]

log = logging.getLogger("trtet_store.cache.tier")  # the tier's one logger (store.py's)


def claim(tier: TierBucket, lookup: Callable[[str], RemoteEntry | None], key: str, *,
          timeout: float | None = None,
          on_wait: Callable[[dict[str, Any]], None] | None = None) -> Lease | RemoteEntry:
    """:meth:`RemoteTier.claim` (see there)."""
    check_key(key)
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not "
                         f"{timeout!r}")
    clock = tier.clock
    deadline = None if timeout is None else clock.monotonic() + timeout
    lkey = tier.lease_key(key)
    holder = new_holder()
    trusted = tier.trusted_keys
    watch = LeaseWatch(f"{tier.url}: {key}", tier.lease_ttl, deadline, clock)

    def body() -> bytes:
        return lease_body(holder, started, tier.lease_ttl, 0, signing_key=tier.signing_key,
                          bucket=tier.bucket, object_key=lkey)

    while True:
        entry = lookup(key)
        if entry is not None:
            return entry
        got = tier.s3.get_dated(tier.bucket, lkey, LEASE_MAX_BYTES)
        started = clock.time()
        if got is None:
            require_conditional_writes(tier)  # a lease is one conditional write (.probe)
            try:
                etag = put(tier.s3, tier.bucket, lkey, body(), if_none_match=True)
            except PreconditionFailed:
                continue  # another claimer got there first: look again
            return _acquired(tier, lookup, key, lkey, holder, etag, started)
        if got.data is None:
            watch.oversized(got.size, LEASE_MAX_BYTES)
        parsed = parse_lease(got.data)
        doc = parsed or {}
        refused = None if trusted is None else lease_refusal(parsed, tier.bucket, lkey, trusted)
        if refused is not None:
            # Only a lease a trusted key signed holds a waiter: this one is ignored.
            watch.once("ignored", "%s: %s: ignored the build lease of %s (pid %s): %s (this "
                       "cache waits only on leases signed by its trusted keys); taking it over",
                       tier.url, key, str(doc.get("host", "?"))[:64],
                       str(doc.get("pid", "?"))[:16], refused)
            dead, ttl, unchanged = True, 0.0, 0.0
        else:
            dead, ttl, unchanged = watch.look(doc, got.etag, got.age, got.modified,
                                              signed=trusted is not None)
        if dead:
            require_conditional_writes(tier)
            try:
                new = put(tier.s3, tier.bucket, lkey, body(), if_match=got.etag)
            except PreconditionFailed:
                watch.forget()  # renewed, released or taken by another waiter meanwhile
                if refused is not None:
                    # A lease we ignore, rewritten again before our takeover: wait a poll
                    # (never a hot loop against a bucket writer) within the deadline.
                    clock.sleep(_pause(tier.poll, deadline, clock, timeout, key, tier.url,
                                       doc))
                continue
            if refused is None:
                log.warning("%s: %s: took over the build lease of %s (pid %s), unchanged for "
                            "%.1f s (its ttl %.1f s)", tier.url, key, doc.get("host"),
                            doc.get("pid"), unchanged, ttl)
            return _acquired(tier, lookup, key, lkey, holder, new, started)
        if on_wait is not None:
            on_wait(doc)
        clock.sleep(_pause(tier.poll, deadline, clock, timeout, key, tier.url, doc))


def _acquired(tier: TierBucket, lookup: Callable[[str], RemoteEntry | None], key: str,
              lkey: str, holder: str, etag: str, started: float) -> Lease | RemoteEntry:
    lease = Lease(tier.s3, tier.bucket, lkey, key, holder, etag, started, tier.lease_ttl,
                  signing_key=tier.signing_key)
    # The previous holder may have published and released between our look at the
    # pointer and our put: then the entry is the answer, not a second build.
    try:
        entry = lookup(key)
    except RemoteError:
        lease.release()
        raise
    if entry is not None:
        lease.release()
        return entry
    return lease


def _pause(poll: float, deadline: float | None, clock: Any, timeout: float | None, key: str,
           url: str, doc: dict[str, Any]) -> float:
    """Seconds to sleep before the next look: ``poll``, or what is left before the deadline.

    Raises
    ------
    LeaseWaitTimeout
        The deadline has passed.
    """
    if deadline is None:
        return poll
    left = deadline - clock.monotonic()
    if left <= 0:
        raise LeaseWaitTimeout(
            f"{url}: {key}: waited {timeout:g} s for the build lease of "
            f"{doc.get('host', 'another machine')} (pid {doc.get('pid')}); it is "
            "still renewed")
    return min(poll, left)
