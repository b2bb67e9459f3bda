"""Every crash test's verdict after ``recover()``: :func:`check_recovered`.

Each destination holds its old content or the complete new one (all outputs
agreeing), every blob's bytes exist exactly once (in its source, or moved
into a published output), and no temp, journal, lock or pin file is left.
"""

from __future__ import annotations

import re
from pathlib import Path

from crash_scenario import Scenario, content
from digests import digest, file_digest

_BLOB = re.compile(r"^[0-9a-f]{16}-(\d+)\.blob$")


class Broken(AssertionError):
    """A crash test found an invariant broken."""


def blob_files(staging: Path) -> dict[int, Path]:
    """The dead child's blob files by index (its store numbers them 1, 2, ... in order)."""
    found = {}
    for p in staging.iterdir():
        m = _BLOB.match(p.name)
        if m:
            found[int(m.group(1)) - 1] = p
    return found


def check_recovered(scn: Scenario, staging: Path, out: Path, user: Path, *,
                    staged: list[str] | None = None,
                    new: dict[str, str] | None = None,
                    where: str = "") -> str:
    """Assert the invariants after ``recover()``.

    Parameters
    ----------
    scn : Scenario
        The write that was interrupted.
    staging, out, user : Path
        Its directories (as :meth:`Scenario.install` made them).
    staged : list of str, optional
        The blobs' digests as staged (computed from the scenario when omitted).
    new : dict, optional
        The digests of an uninterrupted write's outputs (likewise).
    where : str
        Says which crash, in the message of a failure.

    Returns
    -------
    str
        ``"old"`` or ``"new"``: what the outputs hold.

    Raises
    ------
    Broken
        An invariant does not hold.
    """
    staged = staged if staged is not None else scn.staged_digests()
    if new is None:
        new = {k: digest(v) for k, v in scn.new_content().items()}
    old = {k: (digest(v) if v is not None else None) for k, v in scn.old_content().items()}

    def fail(msg: str) -> None:
        raise Broken(f"{where}: {msg}")

    states = {}
    for name in scn.outputs:
        path = out / name
        got = file_digest(path) if path.exists() else None
        if got == new[name]:
            states[name] = "new"
        elif got == old[name]:
            states[name] = "old"
        else:
            size = path.stat().st_size if path.exists() else None
            fail(f"TORN: {name} is neither old nor new ({size} bytes)")
    if len(set(states.values())) != 1:
        fail(f"outputs disagree (one published without the other): {states}")
    state = next(iter(states.values()))

    leftovers = sorted(p.name for p in out.iterdir()
                       if p.name not in scn.outputs and p.name != "lost+found")
    if leftovers:
        fail(f"left in the output directory: {leftovers}")
    pins = sorted(p.name for p in staging.iterdir() if p.name.startswith(".trtet-pin-"))
    if pins:
        fail(f"pins left in the staging directory: {pins}")

    files = blob_files(staging)
    moved = scn.moved_blobs()
    for i in range(len(scn.blobs)):
        # A moved blob lives in the published output or in its source, never
        # both and never neither; a copied blob always keeps its source.
        must_be_in_source = not (state == "new" and i in moved)
        if i not in files:
            if must_be_in_source:
                fail(f"LOST: blob {i}'s source is gone and the outputs are {state}")
            continue
        if not must_be_in_source:
            fail(f"blob {i} was moved into the published output, but its source "
                 f"({files[i].stat().st_size} bytes) is still there: its bytes exist twice")
        if file_digest(files[i]) != staged[i]:
            fail(f"LOST: blob {i}'s source is {files[i].stat().st_size} of "
                 f"{scn.blobs[i][1]} bytes, not as staged (outputs {state})")
    for name, (seed, size) in scn.externals.items():
        if file_digest(user / name) != digest(content(seed, size)):
            fail(f"user file {name} changed")
    return state


def collect_dead_store(staging: Path) -> None:
    """A new store keeps the dead one's blobs as orphans; removing them leaves only its lock."""
    from trtet_store import BlobStore

    with BlobStore(staging) as store:
        store.remove_orphans()  # explicit: orphans are never removed behind the user's back
        left = sorted(p.name for p in staging.iterdir())
        mine = f".store-{store.token}.lock"
        if left != [mine]:
            raise Broken(f"a new store left {left} in the staging directory")


def journal_state(out: Path) -> str | None:
    """The state recorded in the (single) journal in ``out``, if any, before recovery."""
    from trtet_store.io import journal

    found = journal.journals_in(out)
    if not found:
        return None
    try:
        return journal.read(found[0])[1]
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc.__class__.__name__})"
