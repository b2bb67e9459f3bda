"""Mergeable entries on the shared tier: fetched and verified, published by a conditional merge.

The tier's build entries are written once (first writer wins). A mergeable
entry (a TensorRT timing cache: ``export/timing_cache.py``; this module knows
no TensorRT) is small and often updated, so it is published as a merge:

- :func:`fetch` reads the entry's pointer, refuses it when the tier's trusted
  keys do (unsigned, another signer) or the caller's ``check`` does (made for
  another device), then downloads its one file, checked against the pointer
  (size, xxh3-128; sha256 where it is signed) as it arrives.
- :func:`publish_merged` merges what this machine holds with the entry as it
  is on the tier and publishes the result with a conditional write on the
  ETag of the pointer it read (``If-Match``; ``If-None-Match`` when there was
  none). A lost race (another machine's merge came first) reads again, merges
  again and retries, at most ``attempts`` times: never last-writer-wins, and
  never a whole history uploaded per engine (one merged file per publish).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.io import read_ours

if TYPE_CHECKING:
    from trtet_store.cache.tier import RemoteEntry, RemoteTier, TierPublish

__all__ = ["FILE", "Fetched", "fetch", "publish_merged"]

#: The one file of a mergeable entry.
FILE = "timing"
#: Publish attempts before giving up on a key that keeps changing under us.
ATTEMPTS = 4


@dataclass
class Fetched:
    """The tier's entry: ``data`` (verified bytes) or None, with ``entry`` (its pointer, when
    there is one) and ``reason`` (why one that is there is not used)."""

    data: bytes | None
    entry: RemoteEntry | None
    reason: str | None = None
    downloaded: int = 0


def fetch(tier: RemoteTier, key: str, directory: os.PathLike | str,
          check: Callable[[dict[str, Any]], str | None], *, limit: int) -> Fetched:
    """The tier's entry of ``key``, verified as it arrives (see the module docstring).

    ``directory``: a private scratch directory (removed after). A refused or
    damaged entry is ``data=None`` with the reason, never raised; a server
    that cannot be asked raises :class:`~trtet_store.cache.tier.RemoteError`.
    """
    from trtet_store.cache.tier import TierEntryError

    entry = tier.lookup(key)
    if entry is None:
        return Fetched(None, None)
    why = tier.signature_problem(entry)
    if why is None:
        why = check(dict(entry.metadata) if isinstance(entry.metadata, dict) else {})
    if why is None and ([f.get("name") for f in entry.files] != [FILE]
                        or int(entry.files[0].get("size") or 0) > limit):
        why = f"its files are {[f.get('name') for f in entry.files]}, not one {FILE!r} " \
              f"of at most {limit} bytes"
    if why is not None:
        return Fetched(None, entry, f"the shared entry is refused: {why}")
    scratch = Path(directory)
    try:
        got = tier.download(entry, scratch)
        data = read_ours(got.paths[FILE], limit=limit, what="downloaded cache entry")
    except TierEntryError as exc:
        return Fetched(None, entry, f"the shared entry is damaged: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Fetched(data, entry, None, got.downloaded)


def publish_merged(tier: RemoteTier, key: str, mine: bytes,
                   combine: Callable[[bytes, bytes], bytes],
                   check: Callable[[dict[str, Any]], str | None],
                   metadata: Callable[[bytes], dict[str, Any]], directory: os.PathLike | str,
                   *, limit: int, attempts: int = ATTEMPTS,
                   ) -> tuple[TierPublish | None, str | None, bytes]:
    """Merge ``mine`` into the tier's entry of ``key`` and publish it, If-Match what was read.

    ``combine(theirs, mine)``: the merged bytes (raises
    :class:`~.mergeable.MergeRefused`: nothing is published). A tier entry
    that is damaged or refused is replaced by ``mine`` (If-Match its ETag).
    ``metadata(bytes)``: the pointer's metadata for the bytes published.
    Returns ``(the publish, None, the bytes published)``, or ``(the last try or
    None, why not, the bytes last tried)``; ``(None, None, ...)`` when the tier
    holds all of ``mine`` already (nothing sent).
    """
    from trtet_store.cache.mergeable import MergeRefused

    scratch = Path(directory)
    last: TierPublish | None = None
    out = mine
    for n in range(attempts):
        got = fetch(tier, key, scratch / f"in-{n}", check, limit=limit)
        if got.data is None:
            out = mine
        else:
            try:
                out = combine(got.data, mine)
            except MergeRefused as exc:
                return None, f"the shared entry was not merged (left as it was): {exc}", mine
            if out == got.data:
                return None, None, out  # the tier holds all of it already: nothing to send
        scratch.mkdir(parents=True, exist_ok=True)
        path = scratch / f"out-{n}"
        path.write_bytes(out)
        try:
            last = tier.publish(key, [(FILE, path)], metadata(out), replace=got.entry)
        finally:
            path.unlink(missing_ok=True)
        if last.published:
            return last, None, out
        # Lost the race: another machine's merge is the entry now; merge with it.
    return last, f"gave up after {attempts} tries (the entry kept changing: " \
                 f"{last.reason if last is not None else '?'})", mine
