"""The wait of :meth:`RemoteTier.claim`: an entry, our lease, or a wait on another holder's.

Each look reads the pointer, then the lease with its dates
(:meth:`~trtet_store.remote.s3.S3.get_dated`); :class:`.lease.LeaseWatch`
judges it (dead by the server's clock, or unchanged for its capped ttl on
ours) and says the wait out loud. Before a lease is written, the server's
conditional writes are probed (:mod:`.probe`; once per endpoint and bucket).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trtet_store.cache.tier.entry import RemoteEntry, check_key
from trtet_store.cache.tier.lease import (
    Lease,
    LeaseWaitTimeout,
    LeaseWatch,
    lease_body,
    new_holder,
    parse_lease,
    put,
)
from trtet_store.cache.tier.probe import require_conditional_writes
from trtet_store.remote.jsondoc import LEASE_MAX_BYTES
from trtet_store.remote.s3 import PreconditionFailed

if TYPE_CHECKING:
    from trtet_store.cache.tier.store import RemoteTier

__all__ = ["claim"]

log = logging.getLogger("trtet_store.cache.tier")  # the tier's one logger (store.py's)


def claim(tier: RemoteTier, key: str, *, timeout: float | None = None,
          on_wait: Callable[[dict[str, Any]], None] | None = None) -> Lease | RemoteEntry:
    """:meth:`RemoteTier.claim` (see there)."""
    check_key(key)
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not "
                         f"{timeout!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    lkey = tier._lease(key)
    holder = new_holder()
    watch = LeaseWatch(f"{tier.url}: {key}", tier.lease_ttl, deadline)
    while True:
        entry = tier.lookup(key)
        if entry is not None:
            return entry
        got = tier.s3.get_dated(tier.bucket, lkey, LEASE_MAX_BYTES)
        started = time.time()
        if got is None:
            require_conditional_writes(tier)  # a lease is one conditional write (.probe)
            try:
                etag = put(tier.s3, tier.bucket, lkey,
                           lease_body(holder, started, tier.lease_ttl, 0),
                           if_none_match=True)
            except PreconditionFailed:
                continue  # another claimer got there first: look again
            return tier._acquired(key, lkey, holder, etag, started)
        doc = parse_lease(got.data) or {}
        dead, ttl, unchanged = watch.look(doc, got.etag, got.age, got.modified)
        if dead:
            require_conditional_writes(tier)
            try:
                new = put(tier.s3, tier.bucket, lkey,
                          lease_body(holder, started, tier.lease_ttl, 0),
                          if_match=got.etag)
            except PreconditionFailed:
                watch.forget()  # renewed, released or taken by another waiter meanwhile
                continue
            log.warning("%s: %s: took over the build lease of %s (pid %s), unchanged for "
                        "%.1f s (its ttl %.1f s)", tier.url, key, doc.get("host"),
                        doc.get("pid"), unchanged, ttl)
            return tier._acquired(key, lkey, holder, new, started)
        if on_wait is not None:
            on_wait(doc)
        wait = tier.poll
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LeaseWaitTimeout(
                    f"{tier.url}: {key}: waited {timeout:g} s for the build lease of "
                    f"{doc.get('host', 'another machine')} (pid {doc.get('pid')}); it is "
                    "still renewed")
            wait = min(wait, left)
        time.sleep(wait)

