"""A resumed publish against its journal's plan: the part sizes it takes, what differs.

A journal's plan fingerprints each object as ``[name, key, size, part_size,
extents]`` (``plan.fingerprint``). A publish given no part size resumes with
the journal's (a default that changed, or a first run with ``--part-size``,
must not throw the uploaded parts away); one that differs in something real
says what, so the log line that announces the restart is a reason, not a
shrug.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from trtet_store.io import format_mib
from trtet_store.remote.errors import PartSizeError
from trtet_store.remote.upload.parts import choose_part_size

__all__ = ["journaled_part_sizes", "plan_difference"]


def journaled_part_sizes(plan: dict, objects: Sequence[tuple[str, int]],
                         chosen: Sequence[int]) -> list[int]:
    """The part sizes of a publish given none: the journal's where it planned the same object.

    Parameters
    ----------
    plan : dict
        The journal's plan record (its ``fingerprint``).
    objects : sequence of (name, size)
        This publish's objects, in order.
    chosen : sequence of int
        The part sizes chosen without the journal (the default).

    Returns
    -------
    list of int
        ``chosen``, with the journal's part size for each object of the same
        name and size whose journaled part size is still a valid one.
    """
    journaled = {e[0]: e for e in plan.get("fingerprint") or ()
                 if isinstance(e, list) and len(e) >= 4}
    sizes = []
    for (name, size), part_size in zip(objects, chosen, strict=True):
        entry = journaled.get(name)
        if entry is not None and entry[2] == size and entry[3] != part_size:
            # A journal of another era (a size no longer valid) keeps the default.
            with contextlib.suppress(PartSizeError, TypeError, ValueError):
                part_size = choose_part_size(size, entry[3])
        sizes.append(part_size)
    return sizes


def _size(n: Any) -> str:
    return format_mib(n) if isinstance(n, int) else repr(n)


def plan_difference(journaled: Sequence[Any] | None, planned: Sequence[Any]) -> str:
    """What differs between the journal's fingerprint and this publish's, in words."""
    journaled = list(journaled or [])
    names = [e[0] for e in journaled]
    ours = [e[0] for e in planned]
    if names != ours:
        return f"the objects are {ours}, the journal's {names}"
    said = []
    for old, new in zip(journaled, planned, strict=True):
        name = new[0]
        if old[1] != new[1]:
            said.append(f"{name}: key {new[1]}, the journal's {old[1]}")
        elif old[2] != new[2]:
            said.append(f"{name}: {new[2]} bytes, the journal's {old[2]}")
        elif old[3] != new[3]:
            said.append(f"{name}: part size {_size(new[3])}, the journal's {_size(old[3])} "
                        "(give the journal's --part-size to resume)")
        elif [list(x) for x in old[4]] != [list(x) for x in new[4]]:
            said.append(f"{name}: its pieces (staged engines, file ranges) are not the "
                        "journal's")
    return "; ".join(said) or "the journal's plan is not this publish's"
