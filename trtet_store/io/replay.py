"""Plan-driven replay steps: what the writer's rollback and recovery both do from a journal.

Each step works from the journal's plan and the files alone, so it can be
run again after a crash in the middle of it. The writer's rollback and
:mod:`trtet_store.io.recovery` call these; this module calls neither.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from trtet_store.io import fs, ladder, names, transfer
from trtet_store.io.errors import StuckJournalError, VerificationError
from trtet_store.io.journal import PayloadPlan, Plan, digest_of_chunks
from trtet_store.io.place import place_payload
from trtet_store.io.units import MiB


def undo(plan: Plan) -> None:
    """Give every moved source its bytes back, then delete the temp files.

    Works from the files alone (each source's length is its marker), so an
    interrupted rollback can be run again.

    Raises
    ------
    StuckJournalError
        A moved source is gone (its directory deleted, say), or so is the
        temp file holding its bytes. Every other source was given its bytes
        back first; a temp file still holding bytes of a missing source is
        kept, and the error names both.
    """
    problems: list[str] = []
    kept: list[str] = []
    missing: str | None = None
    for out in plan.outputs:
        temp_exists = os.path.exists(out.temp)
        for p in out.payloads:
            if p.placement != "move":
                continue
            try:
                length: int | None = os.stat(p.source).st_size
            except FileNotFoundError:
                length = None
            if not temp_exists:
                if length != p.size:
                    state = "is missing" if length is None else f"has {length} of {p.size} bytes"
                    problems.append(f"the source {p.source} {state}, and the temp file "
                                    f"{out.temp} that held its moved bytes is gone")
                    missing = missing or (p.source if length is None else out.temp)
                continue
            if length is None:
                problems.append(f"the source {p.source} is missing, so the bytes moved out of "
                                f"it (in {out.temp}) have nowhere to go back to")
                missing = missing or p.source
                if out.temp not in kept:
                    kept.append(out.temp)
                continue
            src_fd = fs.calls.open(p.source, os.O_RDWR | os.O_CLOEXEC)
            try:
                dst_fd = fs.calls.open(out.temp, os.O_RDWR | os.O_CLOEXEC)
                try:
                    transfer.unmove(src_fd, dst_fd, p.offset, p.size, step=p.step,
                                    digests=p.chunk_digests, digest_chunk=p.chunk_size,
                                    dst_path=out.temp, src_path=p.source)
                finally:
                    fs.calls.close(dst_fd)
            finally:
                fs.calls.close(src_fd)
    for out in plan.outputs:
        if out.temp in kept:
            continue
        for p in out.payloads:
            if p.placement == "insert":
                if os.path.exists(out.temp) and not os.path.isdir(os.path.dirname(p.source)):
                    problems.append(f"the directory of {p.source} is gone, so the file it was "
                                    f"(now {out.temp}, whole) cannot be given back")
                    missing = missing or os.path.dirname(p.source)
                    kept.append(out.temp)
                    break
                _unhost(out.temp, p)
        else:
            with contextlib.suppress(FileNotFoundError):
                fs.calls.unlink(out.temp)
        if out.backup:
            with contextlib.suppress(FileNotFoundError):
                fs.calls.unlink(out.backup)
    if problems:
        others = sorted({p.source for o in plan.outputs for p in o.payloads
                         if p.placement in ("move", "insert") and os.path.exists(p.source)})
        done = ("Rolled back as far as it goes: the destinations keep what they had"
                + (f", and these sources have all their bytes back: {', '.join(others)}."
                   if others else "."))
        raise StuckJournalError(problems, done, kept,
                                os.path.dirname(plan.outputs[0].dest), filename=missing)


def unpublish(plan: Plan) -> None:
    """Take back the renames of a publish that failed: old files in place, temps back.

    Only for a journal in state ``unpublishing``: every temp file existed when
    the renames began, so a missing temp is one renamed over its destination.
    Idempotent, and durable when it returns; after it, a missing temp means
    the rollback already deleted it, so the caller records ``rolling_back``.
    """
    for out in plan.outputs:
        if not os.path.exists(out.temp):
            fs.calls.rename(out.dest, out.temp)
        # lexists/lstat: a backup may be a symlink the write replaced (follow_links=False).
        if out.backup and os.path.lexists(out.backup):
            try:
                restored = fs.same_file(os.lstat(out.backup), os.lstat(out.dest))
            except FileNotFoundError:
                restored = False
            if not restored:  # the backup (the old file) goes back to its name
                fs.calls.rename(out.backup, out.dest)
    for parent in sorted({os.path.dirname(o.dest) for o in plan.outputs}):
        fs.fsync_dir(parent)


def _unhost(temp: str, host: PayloadPlan) -> None:
    """Turn a temp file that a payload hosted back into that payload's source, exactly.

    Its size tells how far the write got: the payload's own size (renamed,
    nothing inserted yet), or more (room inserted before it and the rest of
    the output after it), which is cut away again. Its mode and owner, which
    became the destination's, are given back.
    """
    try:
        fd = fs.calls.open(temp, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # never renamed, or already given back
    try:
        if os.fstat(fd).st_size != host.size:
            fs.calls.ftruncate(fd, host.offset + host.size)
            if host.offset:
                fs.calls.fallocate(fd, fs.FALLOC_FL_COLLAPSE_RANGE, 0, host.offset)
        if host.host_mode is not None:  # it took the destination's on the way
            mode, uid, gid = host.host_mode
            with contextlib.suppress(PermissionError):  # only root gives files away
                fs.calls.fchown(fd, uid, gid)
            fs.calls.fchmod(fd, mode)  # after the chown, which clears set-id bits
        fs.calls.fsync(fd)
    finally:
        fs.calls.close(fd)
    fs.calls.rename(temp, host.source)
    fs.fsync_dir(os.path.dirname(host.source))


def finish(plan: Plan) -> None:
    """After every rename: drop backups and the emptied sources of moves."""
    for out in plan.outputs:
        if out.backup:
            with contextlib.suppress(FileNotFoundError):
                fs.calls.unlink(out.backup)
        for p in out.payloads:
            if p.consumed:
                with contextlib.suppress(FileNotFoundError):
                    fs.calls.unlink(p.source)
                if p.source.endswith(names.BLOB_SUFFIX):  # a staged blob's metadata sidecar
                    with contextlib.suppress(FileNotFoundError):
                        fs.calls.unlink(names.meta_path_of(p.source))


def complete_placement(plan: Plan) -> None:
    """Place every payload of every output into its temp file, last first, and sync it.

    Through the writer's own dispatch, :func:`trtet_store.io.place.place_payload`:
    a move resumes from its source's length, a copy is done again, a clone
    is cloned again, and a clone the filesystem refuses is copied only after
    checking that the copy fits beside what the rest still needs: short of
    room it raises :class:`InsufficientSpaceError` before writing a byte of
    it, and recovery rolls the write back instead of filling the disk.
    """
    for i, out in enumerate(plan.outputs):
        dest = Path(out.dest)
        order = sorted(out.payloads, key=lambda p: -p.offset)
        fd = fs.calls.open(out.temp, os.O_RDWR | os.O_CLOEXEC)
        try:
            for k, p in enumerate(order):
                if p.placement == "move" and not os.path.exists(p.source):
                    # Moved whole before its source was deleted: the check
                    # before this (recovery's) verified every byte in the temp.
                    continue
                rest = [(dest, order[k + 1:])]
                rest += [(Path(o.dest), o.payloads) for o in plan.outputs[i + 1:]]
                place_payload(p, fd, temp_path=out.temp, dest=dest, copy_chunk=p.step or 8 * MiB,
                              reserve=functools.partial(ladder.still_needed, dest.parent, rest))
                if p.placement == "clone":
                    # The writer trusts a blob's sealed identity, which died with its
                    # store; nothing says a source it never synced survived a crash
                    # intact. Read what the clone shares, as a copy would have.
                    _verify_cloned(fd, p, out.temp)
            fs.calls.fsync(fd)
        finally:
            fs.calls.close(fd)


def _verify_cloned(fd: int, p: PayloadPlan, temp: str) -> None:
    """Check the bytes a recovery cloned (or copied) into ``temp`` against the staged ones."""
    what = "cloned bytes in temp"
    if p.chunk_digests is not None:  # a journal that lists them
        transfer.verify_range(fd, p.offset, 0, p.size, p.chunk_size, p.chunk_digests, what,
                              temp)
    elif p.chunks_digest is not None:
        found = transfer.range_chunk_digests(fd, p.offset, p.size, p.chunk_size, temp)
        if digest_of_chunks(found) != p.chunks_digest:
            raise VerificationError(what, None, temp)


def publish(plan: Plan) -> None:
    """Rename every temp file that is still there over its destination, keeping backups."""
    for out in plan.outputs:
        if os.path.exists(out.temp):
            if out.backup and not os.path.lexists(out.backup):
                with contextlib.suppress(FileNotFoundError):
                    fs.calls.link(out.dest, out.backup, follow_symlinks=False)
            fs.calls.rename(out.temp, out.dest)
    for parent in sorted({os.path.dirname(o.dest) for o in plan.outputs}):
        fs.fsync_dir(parent)
