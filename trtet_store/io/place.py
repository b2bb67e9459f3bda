"""One payload into its temp file by the placement its plan names: the one dispatch that the
writer and recovery share.

The writer places what it planned; recovery finishes what a dead writer
planned, from the journal. Both come here, so a clone falls back, a move
resumes and a copy verifies the same way in both. Below the writer and
recovery: this module imports neither (nor :mod:`trtet_store.io.replay`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from trtet_store.io import fs, transfer
from trtet_store.io.errors import InsufficientSpaceError, PlacementUnavailable
from trtet_store.io.journal import PayloadPlan
from trtet_store.io.units import round_up

log = logging.getLogger("trtet_store.writer")

#: Called with the source's ``fstat`` before and after a clone; raises if it is
#: not the file that was staged (a clone reads no byte that could be verified).
SourceCheck = Callable[[os.stat_result], None]


def place_payload(plan: PayloadPlan, temp_fd: int, *, temp_path: str, dest: Path,
                  copy_chunk: int, reserve: Callable[[], int] | None = None,
                  check_source: SourceCheck | None = None,
                  progress: transfer.Progress | None = None) -> int:
    """Place one payload into the temp file ``temp_fd`` as ``plan`` says.

    An ``insert`` is already in place (its source became the temp file) and
    writes nothing here. A ``clone`` that the filesystem refuses after all
    (:class:`PlacementUnavailable`: nothing changed yet) is copied instead,
    never moved, since the plan promised its source stays intact; ``plan``
    then says ``copy`` and why, and the capability cache learns it. A move
    resumes from the source's length, whoever started it.

    A copy that replaces a clone was not budgeted by the preflight (see
    :func:`trtet_store.io.ladder.preflight`), so it first checks that its
    payload plus ``reserve`` fits on the destination's filesystem, and
    raises :class:`InsufficientSpaceError` before writing a byte when it
    does not; the caller rolls back.

    Parameters
    ----------
    plan : PayloadPlan
        The payload's plan (updated in place when a clone falls back).
    temp_fd : int
        The output's temp file, open for writing.
    temp_path : str
        Its path, for messages.
    dest : pathlib.Path
        The output's destination: its directory's filesystem is where room is needed.
    copy_chunk : int
        Bytes per copy step.
    reserve : callable, optional
        Returns the room the rest of the write still needs on that filesystem
        (:func:`trtet_store.io.ladder.still_needed`), kept free by a fallback
        copy; called only when a clone falls back, since nothing else needs it.
    check_source : callable, optional
        Checks the source's identity before and after a clone.
    progress : callable, optional
        Called with each count of bytes placed.

    Returns
    -------
    int
        Bytes written (a clone writes only an unaligned tail).

    Raises
    ------
    InsufficientSpaceError
        A copy replacing a clone would not fit; nothing of it was written.
    """
    if plan.placement == "insert":
        return 0
    flags = os.O_RDWR if plan.placement == "move" else os.O_RDONLY
    src_fd = fs.calls.open(plan.source, flags | os.O_CLOEXEC)
    try:
        if plan.placement == "clone":
            try:
                return _clone(plan, src_fd, temp_fd, dest, check_source, progress)
            except PlacementUnavailable as exc:
                why = f"clone failed ({exc.reason})"
                fs.capabilities.put(("clone", fs.fs_identity(plan.source),
                                     fs.fs_identity(dest.parent)), False, exc.reason)
            # Counted as a whole copy: copy_file_range may yet share the blocks (XFS or
            # btrfs between two mounts of one filesystem), but nothing says so before
            # it runs, and where FICLONERANGE is refused it mostly writes every byte.
            ensure_room(dest, round_up(plan.size, fs.block_size(dest.parent))
                        + (reserve() if reserve else 0),
                        f"{why}, so {plan.source} has to be copied, which needs its whole size")
            log.warning("%s: %s before changing anything; copying %s instead", dest, why,
                        plan.source)
            plan.placement, plan.reason = "copy", f"{why}; copied"
        if plan.placement == "move":
            return transfer.move(src_fd, temp_fd, plan.offset, plan.size, step=plan.step,
                                 digests=plan.chunk_digests, digest_chunk=plan.chunk_size,
                                 src_path=plan.source, progress=progress)
        return transfer.copy(src_fd, temp_fd, plan.offset, plan.size, chunk=copy_chunk,
                             digests=plan.chunk_digests, digest_chunk=plan.chunk_size,
                             src_path=plan.source, dst_path=temp_path, progress=progress,
                             src_offset=plan.source_offset)
    finally:
        fs.calls.close(src_fd)


def _clone(plan: PayloadPlan, src_fd: int, temp_fd: int, dest: Path,
           check_source: SourceCheck | None, progress: transfer.Progress | None) -> int:
    # Nothing is read: the sealed identity, before and after, is what says
    # the shared blocks are the staged bytes.
    if check_source is not None:
        check_source(os.fstat(src_fd))
    written = transfer.clone(src_fd, temp_fd, plan.offset, plan.size,
                             block=fs.block_size(dest.parent), src_path=plan.source,
                             progress=progress, src_offset=plan.source_offset)
    if check_source is not None:
        check_source(os.fstat(src_fd))
    return written


def ensure_room(dest: Path, needed: int, hint: str) -> None:
    """Raise :class:`InsufficientSpaceError` unless ``needed`` bytes are free for ``dest`` now.

    What the preflight raises, for room it could not budget (a fallback, or
    recovery's copy of a clone); checked before the first byte it is for, so
    the error leaves nothing to undo but what the caller's rollback undoes anyway.
    """
    available = fs.free_bytes(dest.parent)
    if needed > available:
        raise InsufficientSpaceError(needed, available, dest, hint)
