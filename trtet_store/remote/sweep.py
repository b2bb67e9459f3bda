"""One bucket sweep for the three collectors (the tier's prune, a set publish's clean-up and
prune, a program's replaced objects): plan, then delete each object ``If-Match`` the ETag it
was listed at, so a version written since is someone's and stays (restic's
``PlanPrune``/``Execute``). A dry run is the plan, unexecuted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from trtet_store.remote.errors import RemoteError
from trtet_store.remote.s3 import S3, PreconditionFailed

__all__ = ["Listed", "SweepPlan", "plan_sweep"]

log = logging.getLogger("trtet_store.remote")


@dataclass(frozen=True)
class Listed:
    """One object as listed: its key, its ETag, its LastModified (None: no age to judge)."""

    key: str
    etag: str
    modified: float | None = None


@dataclass
class SweepPlan:
    """What a sweep removes (``doomed``, in key order) and what it keeps, with why."""

    doomed: list[Listed] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    def execute(self, s3: S3, bucket: str, *, first: Callable[
            [Listed], list[tuple[str, str]] | None] | None = None) -> list[str]:
        """Delete each doomed object ``If-Match`` its listed ETag; the keys removed.

        ``first(item)`` names ``(key, etag)`` to delete before it, each
        conditional too (a blob's manifest), or None to keep it. An object
        changed since it was listed, or that the server would not delete, is
        kept and logged. Best effort.
        """
        removed = []
        for item in self.doomed:
            try:
                steps = [] if first is None else first(item)
                if steps is None:
                    raise PreconditionFailed(item.key)
                for key, etag in [*steps, (item.key, item.etag)]:
                    s3.delete(bucket, key, if_match=etag)
                removed.append(item.key)
            except PreconditionFailed:
                self.kept[item.key] = "changed since it was listed"
            except (RemoteError, OSError) as exc:
                self.kept[item.key] = f"could not be removed ({exc})"
            if item.key in self.kept:
                log.info("s3://%s/%s is kept: %s", bucket, item.key, self.kept[item.key])
        return removed


def plan_sweep(listing: Iterable[Listed], named: Mapping[str, str] | Iterable[str],
               grace: float, *, now: float | None = None) -> SweepPlan:
    """What ``named`` names stays (a mapping says why), and so does anything younger than
    ``grace`` seconds before ``now`` (the server's clock where the caller has one; else
    this machine's); the rest of ``listing`` goes."""
    named = named if isinstance(named, Mapping) else dict.fromkeys(named, "named")
    now = time.time() if now is None else now
    plan = SweepPlan()
    for item in sorted(listing, key=lambda i: i.key):
        if item.key in named:
            plan.kept[item.key] = named[item.key]
        elif item.modified is not None and now - item.modified < grace:
            plan.kept[item.key] = f"younger than {grace:.0f} s"
        else:
            plan.doomed.append(item)
    return plan
