"""The free space a fetch needs, counted before anything is created (step 3 of a fetch).

On the destination's filesystem: the bytes still to download, in whole
blocks, and what the final write's placements need. A resumed fetch counts
only the gaps its journaled ranges leave.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from trtet_store.io import STAGING_DIR, InsufficientSpaceError, MiB, block_size, free_bytes
from trtet_store.remote.download.plan import ObjectPlan, Run
from trtet_store.remote.download.staging import fetch_id

# The fetch's logger, as before this step left receive.py.
log = logging.getLogger("trtet_store.remote.download.receive")

#: The final write's move budget (``write_files(chunk_size=...)``), also what the
#: preflight reserves for it.
WRITE_CHUNK = 32 * MiB
#: Room for the journal, the staged files' sidecars and directory entries.
SLACK = MiB


def preflight(dest: Path, url: str, version: str, plans: list[ObjectPlan], range_size: int, *,
              resuming: bool) -> int:
    """Refuse, before anything is created, a fetch whose disk cannot hold it.

    Counted on the destination's filesystem: every byte still to download
    (each range rounded up to whole blocks), the final write's placements
    (per output, one move budget for its staged runs, two blocks each; every reused
    range as a copy, since whether the filesystem clones is only known
    by trying), and slack for journals and sidecars. The old files stay
    until the rename, so they are not counted as free. A resumed fetch
    counts only what is missing (its staged bytes are on disk already).
    """
    directory = dest.parent
    bs = block_size(directory)
    done: set[tuple[int, int, int]] = set()
    if resuming:
        done = _journaled_ranges(dest, version)
    # What a resume keeps is what its journaled ranges cover, whatever this
    # fetch's range size (see receive's _replan_run); each gap left is rounded up
    # to whole blocks, plus a block per range it is cut into.
    download = 0
    for p in plans:
        for run in p.runs:
            for gap in _gaps(run, done):
                download += -(-gap // bs) * bs + bs * -(-gap // range_size)
    n_runs = sum(len(p.runs) for p in plans)
    # write_files budgets each output's staged runs as one move (an insert
    # may fall back to one), plus two blocks per run.
    placements = sum(WRITE_CHUNK + 2 * bs * len(p.runs) for p in plans if p.runs)
    placements += sum(-(-r.size // bs) * bs for p in plans for r in p.reused)
    needed = download + placements + SLACK + 2 * bs * n_runs
    available = free_bytes(directory)
    log.info("%s: preflight: %d bytes to download, %d for the placements, %d free",
             dest, download, placements, available)
    if needed > available:
        raise InsufficientSpaceError(
            needed, available, dest,
            f"{url}: {download} bytes to download and {placements} for placing them; "
            "nothing was downloaded or created")
    return needed


def _gaps(run: Run, done: set[tuple[int, int, int]]) -> list[int]:
    """Sizes of the intervals of ``run`` that no journaled range in ``done`` covers."""
    end = run.offset + run.size
    spans = sorted((o, o + n) for obj, o, n in done
                   if obj == run.obj and run.offset <= o and o + n <= end)
    gaps, pos = [], run.offset
    for start, stop in [*spans, (end, end)]:
        if start > pos:
            gaps.append(start - pos)
        pos = max(pos, stop)
    return gaps


def _journaled_ranges(dest: Path, version: str) -> set[tuple[int, int, int]]:
    path = dest.parent / STAGING_DIR / f"fetch-{fetch_id(dest)}.journal"
    out: set[tuple[int, int, int]] = set()
    with contextlib.suppress(OSError, ValueError):
        lines = path.read_bytes().split(b"\n")
        if json.loads(lines[0]).get("version") != version:
            return out
        for line in lines[1:]:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                d = json.loads(line)
                out.add((d["obj"], d["offset"], d["size"]))
    return out
