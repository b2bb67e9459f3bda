"""The write transaction: validate, preflight, journal, place, verify, publish, release.

One or more output files are written as a single transaction. Until the
journal records ``publishing`` every failure rolls back: moved bytes go back
into their sources, temp files go, destinations keep what they had, and the
error propagates. See DESIGN.md, "The transaction". The way in is
:func:`trtet_store.io.writer.write_files`; which placement each payload gets,
and whether it fits, is :mod:`trtet_store.io.ladder`'s to say.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from trtet_store.io import fs, ladder, names, replay, transfer
from trtet_store.io.blobstore import Blob
from trtet_store.io.digests import chunk_digest
from trtet_store.io.errors import InsufficientSpaceError
from trtet_store.io.journal import (
    PUBLISHING,
    ROLLING_BACK,
    UNPUBLISHING,
    InlinePlan,
    Journal,
    OutputPlan,
    PayloadPlan,
    Plan,
)
from trtet_store.io.ladder import PLACEMENTS
from trtet_store.io.layout import Layout, Piece
from trtet_store.io.lock import lock_file, unlock_file
from trtet_store.io.options import DEFAULT_CHUNK_SIZE, AutoChunk, ProgressCallback, progress_caller
from trtet_store.io.place import place_payload
from trtet_store.io.recovery import recover_destination
from trtet_store.io.report import PlacementRecord, WriteReport
from trtet_store.io.validate import check_pieces, validate

# The name the transaction has always logged under (tests and users filter on it).
log = logging.getLogger("trtet_store.writer")



class _Output:
    """One output while the transaction runs."""

    def __init__(self, dest: Path, layout: Layout, follow_links: bool = True) -> None:
        self.dest = dest
        # False: a link at dest is replaced, never written through (validate lstats it).
        self.follow_links = follow_links
        self.layout = layout
        self.temp = dest  # named once the transaction has its token
        self.backup: Path | None = None
        self.temp_fd = -1
        self.lock_fd = -1
        self.lock_path = names.lock_path_of(dest)
        self.old_stat: os.stat_result | None = None
        self.report = WriteReport(dest, layout.size)
        self.renamed = False
        self.sync_inline = False


class Transaction:
    """A write of one or more files; :meth:`run` is the only way in."""

    def __init__(self, outputs: Sequence[tuple[os.PathLike | str, Iterable[Piece]]], *,
                 consume: bool, chunk_size: int | str | AutoChunk | None,
                 progress: ProgressCallback | None,
                 placements: Collection[str] | str | None = None,
                 timeout: float | None = None,
                 follow_links: bool | Sequence[bool] = True) -> None:
        self.auto: AutoChunk | None = None
        if chunk_size == "auto":
            chunk_size = AutoChunk()
        if isinstance(chunk_size, AutoChunk):
            self.auto, chunk_size = chunk_size, chunk_size.limit
        elif chunk_size is not None and (isinstance(chunk_size, bool)
                                         or not isinstance(chunk_size, int)):
            raise TypeError(f"chunk_size must be a number of bytes, 'auto' or AutoChunk, "
                            f"got {chunk_size!r}")
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if not outputs:
            raise ValueError("nothing to write: no outputs given")
        for path, pieces in outputs:
            check_pieces(path, pieces)
        self.token = uuid.uuid4().hex[:16]
        self.consume = consume
        self.timeout = timeout
        if isinstance(placements, str):
            placements = [placements]  # one placement, not its letters
        allowed = set(PLACEMENTS if placements is None else placements) | {"copy"}
        unknown = sorted(allowed - set(PLACEMENTS))
        if unknown:
            raise ValueError(f"unknown placement{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(repr(u) for u in unknown)}; choose from {PLACEMENTS}")
        self.allowed = allowed
        self.chunk_size = chunk_size or DEFAULT_CHUNK_SIZE
        # The callback's shape (Progress object or the old (done, total)) is read once here.
        self.progress = progress_caller(progress)
        follow = _per_output(follow_links, len(outputs))
        self.outputs = [_Output(names.destination(p, follow_links=f), Layout(pieces), f)
                        for (p, pieces), f in zip(outputs, follow, strict=True)]
        for out in self.outputs:
            out.temp = names.temp_path(out.dest, self.token)
        self.plans: list[ladder.Planned] = []
        self.journal: Journal | None = None
        self.total = sum(o.layout.size for o in self.outputs)
        self.done = 0
        self.committed = False
        self.claimed: list[Blob] = []

    # -- the steps, in order -------------------------------------------------

    def run(self) -> list[WriteReport]:
        start = time.monotonic()
        self.claim_blobs()
        try:
            self.validate()
            try:
                # Inside: when a later destination's lock is refused, the ones
                # already taken are released too.
                self.lock_destinations()
                self.choose_placements()
                self.preflight()
                self.digest_sources()
                self.sync_sources()
                self.write_journal()
                try:
                    self.create_temps()
                    self.place()
                    self.publish()
                    self.release()
                except BaseException as exc:
                    self.rollback(exc)
                    raise
            finally:
                self.unlock_destinations()
        finally:
            self.close_temps()
            self.unclaim_blobs()
        seconds = time.monotonic() - start
        for out in self.outputs:
            out.report.seconds = seconds
        return [o.report for o in self.outputs]

    def claim_blobs(self) -> None:
        """Take this write's blobs, so that no other write of this process consumes them meanwhile.

        A consuming write takes them for itself; two writes that moved one
        blob at once would each truncate it and leave a journal that no
        recovery can finish. The second is refused here, before anything.
        """
        blobs = {id(e.piece): e.piece for o in self.outputs for e in o.layout.payloads
                 if isinstance(e.piece, Blob)}
        self.claimed = []
        try:
            for blob in blobs.values():
                blob.claim(exclusive=self.consume)
                self.claimed.append(blob)
        except BaseException:
            self.unclaim_blobs()
            raise

    def unclaim_blobs(self) -> None:
        for blob in self.claimed:
            blob.unclaim(exclusive=self.consume)
        self.claimed = []

    def validate(self) -> None:
        """Refuse bad destinations and sources before touching anything."""
        olds = validate([(o.dest, o.layout) for o in self.outputs],
                        follow_links=[o.follow_links for o in self.outputs])
        for out, old in zip(self.outputs, olds, strict=True):
            out.old_stat = old

    def lock_destinations(self) -> None:
        """Take a per-destination lock, so two writers never race for one file."""
        for out in self.outputs:
            out.lock_fd = lock_file(out.lock_path, out.dest, self.timeout)
            recover_destination(out.dest)

    def choose_placements(self) -> None:
        """Pick, per payload, the best placement allowed, and say why (io/ladder.py)."""
        self.plans = ladder.choose_placements(
            [(o.dest, o.layout) for o in self.outputs], allowed=self.allowed,
            consume=self.consume, chunk_size=self.chunk_size)

    def preflight(self) -> None:
        """Fail before creating anything if the placements cannot fit (io/ladder.py).

        With ``chunk_size="auto"`` a move's budget is first the limit, then
        halved while the write does not fit, down to :data:`AutoChunk.minimum`:
        a disk with too little room for the default budget still takes the
        move, in more and smaller steps, rather than refusing it.
        """
        outputs = [(o.dest, o.layout) for o in self.outputs]
        movers = [p for plans in self.plans for _, p in plans
                  if p.placement in ("move", "insert")]
        while True:
            try:
                ladder.preflight(outputs, self.plans, consume=self.consume)
                break
            except InsufficientSpaceError:
                smaller = self.chunk_size // 2
                if self.auto is None or not movers or smaller < self.auto.minimum:
                    raise
                self.chunk_size = smaller
                for p in movers:
                    p.step = transfer.move_step(smaller, p.chunk_size)
        if self.auto is not None:
            log.info("%s: chunk_size auto: %d bytes (limit %d; %d free)", self.outputs[0].dest,
                     self.chunk_size, self.auto.limit, fs.free_bytes(self.outputs[0].dest.parent))

    def digest_sources(self) -> None:
        """Digest adopted blobs that a move or copy will read anyway (adopt reads nothing).

        Their digests go into the journal, so a move is verified as it goes,
        and a rollback or a recovery can check what it gives back.
        """
        for plans in self.plans:
            for ext, plan in plans:
                if (plan.placement in ("move", "copy") and plan.chunk_digests is None
                        and isinstance(ext.piece, Blob)):
                    ext.piece.ensure_digests()
                    plan.chunk_digests = list(ext.piece.chunk_digests)

    def sync_sources(self) -> None:
        """Make every source the write consumes durable, before the journal exists.

        A move truncates its source, and recovery reads each source's length
        as its progress marker; an insert renames its source into place; a
        consuming clone deletes it after publish. A freshly built blob may
        still be only in the page cache: a power cut would bring it back
        empty (seen on ext4 and XFS), taking its bytes with it, and making a
        partly moved source look fully moved. Synced first, every byte is
        durable in its source or in the temp file at every instant. The price
        is one write of the blob's bytes that the page cache would otherwise
        have dropped.
        """
        for plans in self.plans:
            for _, plan in plans:
                if plan.consumed:
                    fd = fs.calls.open(plan.source, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        fs.calls.fdatasync(fd)
                    finally:
                        fs.calls.close(fd)

    def write_journal(self) -> None:
        """Record the plan durably, and pin the blob files it needs.

        A pin (a symlink to the journal) in each directory holding a blob the
        write uses tells a store starting there that a journal still needs
        those files, even when their owner is dead: a move's or an insert's
        source to give the bytes back, a copy's or a clone's to finish.
        """
        outputs = []
        for i, out in enumerate(self.outputs):
            if len(self.outputs) > 1:
                out.backup = names.backup_path(out.dest, self.token)
            out.sync_inline = out.layout.inline_bytes() >= SYNC_INLINE_MIN
            inline = [InlinePlan(e.offset, e.size,
                                 None if out.sync_inline else chunk_digest(_view(e.piece)))
                      for e in out.layout.inline]
            outputs.append(OutputPlan(
                dest=os.fspath(out.dest), temp=os.fspath(out.temp),
                backup=os.fspath(out.backup) if out.backup else None, size=out.layout.size,
                inline=inline, payloads=[p for _, p in self.plans[i]]))
        first = self.outputs[0]
        path = names.journal_path(first.dest, self.token)
        # A shared blob's directory is its owner's (a cache's, maybe read-only): it is
        # pinned by its owner's lock, never consumed, so no pin of ours goes there.
        pin_dirs = sorted({os.path.dirname(p.source) for plans in self.plans
                           for ext, p in plans
                           if isinstance(ext.piece, Blob) and not ext.piece.shared})
        pins = [names.pin_path(d, self.token) for d in pin_dirs]
        plan = Plan(token=self.token, outputs=outputs, pins=pins)
        self.journal = Journal.create(path, plan)
        try:
            for pin in pins:
                fs.calls.symlink(os.fspath(path), pin)
                fs.fsync_dir(os.path.dirname(pin))
        except BaseException:
            self.journal.remove()
            self.journal = None
            raise

    def create_temps(self) -> None:
        """Temp files beside each destination, at full size (sparse), inline bytes in."""
        for i, out in enumerate(self.outputs):
            host = next((p for _, p in self.plans[i] if p.placement == "insert"), None)
            if host is not None:
                self._host(i, out, host)
            if host is None or out.temp_fd < 0:
                out.temp_fd = fs.calls.open(os.fspath(out.temp),
                                            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                            | os.O_CLOEXEC,
                                            0o644)
            self._keep_mode_and_owner(out)
            # Pre-sizing keeps XFS from speculative preallocation past EOF,
            # which would cost a move a second chunk of disk.
            fs.calls.ftruncate(out.temp_fd, out.layout.size)
            for ext in out.layout.inline:
                data = _view(ext.piece)
                if not _is_padding(data):  # zero padding stays a hole
                    fs.pwrite_all(out.temp_fd, data, ext.offset)
                out.report.inline_bytes += ext.size
                self._advance(ext.size)
            if out.sync_inline:
                # Gigabytes of tensors saved from memory are inline. Digesting
                # them for the plan cost a 2 GiB safetensors save 0.18 s of CPU
                # before its first pwrite; their bytes must reach the disk anyway,
                # so they are synced now, before place() touches any source, and
                # a journal line vouches for them instead of digests.
                assert self.journal is not None
                fs.calls.fdatasync(out.temp_fd)
                self.journal.record_inline_synced(i)

    def _keep_mode_and_owner(self, out: _Output) -> None:
        """Give the new file the old one's mode and owner, as an in-place save keeps them.

        Not another user's ownership in a sticky directory that group or
        others may write to (``/tmp``, a 1777 scratch directory): anyone there
        can create the destination first, so its owner says nothing about whose
        the new bytes are, and only ownership keeps them from rewriting ours.
        The new file is ours, with the old mode less group/other write and
        set-id bits. (Without the sticky bit anyone who may write there may
        replace any file anyway: the owner is kept, as documented.)
        """
        st = out.old_stat
        if st is None:
            return
        mode = stat.S_IMODE(st.st_mode)
        parent = os.stat(out.dest.parent).st_mode
        if st.st_uid != os.geteuid() and parent & stat.S_ISVTX and parent & 0o022:
            log.info("%s: not keeping its owner %d:%d (a sticky directory others may write "
                     "to); the new file is ours", out.dest, st.st_uid, st.st_gid)
            fs.calls.fchmod(out.temp_fd, mode & 0o755)
            return
        try:
            fs.calls.fchown(out.temp_fd, st.st_uid, st.st_gid)
        except PermissionError:
            # Only root may give a file away; an unprivileged writer keeps its
            # own ownership, as any replace-by-rename does.
            log.info("%s: cannot keep its owner %d:%d (not permitted); the new file is ours",
                     out.dest, st.st_uid, st.st_gid)
        # After the chown, which clears set-id bits.
        fs.calls.fchmod(out.temp_fd, mode)

    def _host(self, i: int, out: _Output, host: PayloadPlan) -> None:
        """Rename the host payload into place as the temp file, and make room before it.

        The blob is checked against its sealed identity before the rename and
        after it (on the open file), since no byte of it passes through us.
        Where inserting turns out impossible here (a capability cache that was
        wrong, a filesystem that changed), the file is given back untouched
        and the payload is moved instead, recorded in the journal first.
        """
        blob = self._blob_of(host)
        if blob is not None:
            blob.check_identity()
        fs.calls.rename(host.source, os.fspath(out.temp))
        out.temp_fd = fs.calls.open(os.fspath(out.temp), os.O_RDWR | os.O_CLOEXEC)
        if blob is not None:
            blob.check_identity(os.fstat(out.temp_fd), ctime=False)  # the rename set ctime
        if not host.offset:
            return
        try:
            fs.calls.fallocate(out.temp_fd, fs.FALLOC_FL_INSERT_RANGE, 0, host.offset)
        except OSError as exc:
            if exc.errno not in fs.UNSUPPORTED_ERRNOS:
                raise
            why = f"fallocate INSERT_RANGE: {os.strerror(exc.errno)}"
            fd, out.temp_fd = out.temp_fd, -1
            fs.calls.close(fd)
            fs.calls.rename(os.fspath(out.temp), host.source)
            fs.fsync_dir(os.path.dirname(host.source))
            fs.capabilities.put(("insert", fs.fs_identity(out.dest.parent)), False,
                                f"{out.dest.parent} cannot insert ranges ({why})")
            if blob is not None:
                blob.reseal()
                blob.ensure_digests()
                host.chunk_digests = list(blob.chunk_digests)
            host.placement = "move"
            host.reason = f"insert failed at placement ({why}); moved instead"
            log.warning("%s: %s", out.dest, host.reason)
            assert self.journal is not None
            self.journal.amend(i, host)

    def _blob_of(self, plan: PayloadPlan) -> Blob | None:
        for plans in self.plans:
            for ext, p in plans:
                if p is plan:
                    return ext.piece if isinstance(ext.piece, Blob) else None
        return None

    def place(self) -> None:
        """Place every payload, from the end of each file toward the front.

        One dispatch, :func:`trtet_store.io.place.place_payload`, as recovery
        uses. A clone that falls back to a copy there first checks that the
        copy fits beside what the payloads after it still need, and raises
        :class:`InsufficientSpaceError` before copying a byte when it does
        not (the preflight budgeted the clone); :meth:`run` then rolls back.
        """
        for i, out in enumerate(self.outputs):
            order = sorted(self.plans[i], key=lambda ep: -ep[1].offset)
            for k, (ext, plan) in enumerate(order):
                record = PlacementRecord(ext.index, plan.source, plan.offset, plan.size,
                                         plan.placement, plan.reason)
                blob = ext.piece if isinstance(ext.piece, Blob) else None
                pending = [(out.dest, [p for _, p in order[k + 1:]])]
                pending += [(o.dest, [p for _, p in self.plans[j]])
                            for j, o in enumerate(self.outputs) if j > i]
                t0 = time.monotonic()
                record.bytes_written = place_payload(
                    plan, out.temp_fd, temp_path=os.fspath(out.temp), dest=out.dest,
                    copy_chunk=self.chunk_size, progress=self._advance,
                    reserve=functools.partial(ladder.still_needed, out.dest.parent, pending),
                    check_source=blob.check_identity if blob is not None else None)
                record.seconds = time.monotonic() - t0
                record.placement, record.reason = plan.placement, plan.reason
                if plan.placement == "insert":  # in place since create_temps
                    self._advance(plan.size)
                else:
                    # A clone shares the source's blocks: no byte passed through us to check.
                    record.verified = (plan.chunk_digests is not None
                                       and plan.placement != "clone")
                    log.info("%s: placed %d bytes at %d by %s in %.3f s", out.dest, plan.size,
                             plan.offset, plan.placement, record.seconds)
                out.report.placements.append(record)
            out.report.placements.sort(key=lambda r: r.offset)

    def publish(self) -> None:
        """Make every temp file durable, then rename each over its destination."""
        for out in self.outputs:
            fs.calls.fsync(out.temp_fd)
        assert self.journal is not None
        self.journal.mark(PUBLISHING)
        for out in self.outputs:
            if out.backup is not None:
                # The name's own entry (a link stays a link), never its target.
                with contextlib.suppress(FileNotFoundError):
                    fs.calls.link(os.fspath(out.dest), os.fspath(out.backup),
                                  follow_symlinks=False)
            fs.calls.rename(os.fspath(out.temp), os.fspath(out.dest))
            out.renamed = True
        # The commit point: every new file is in place. What fails from here on
        # is reported, and `recover` finishes the cleanup; nothing is undone.
        # The outputs own the consumed bytes now, and their Blob objects say so.
        self.committed = True
        for blob in self._consumed_blobs():
            blob.consumed = True
        for parent in sorted({o.dest.parent for o in self.outputs}):
            fs.fsync_dir(parent)

    def release(self) -> None:
        """After publish: drop backups, release consumed sources, remove the journal."""
        replay.finish(self.journal.plan)
        for blob in self._consumed_blobs():
            blob.mark_consumed()
        self.journal.remove()
        self.journal = None

    def _consumed_blobs(self) -> list[Blob]:
        return [ext.piece for plans in self.plans for ext, plan in plans
                if plan.consumed and isinstance(ext.piece, Blob)]

    def rollback(self, exc: BaseException) -> None:
        """Undo everything before publish; the original error is re-raised by the caller."""
        if self.journal is None:
            return
        if self.committed:
            log.error("%s published, but the cleanup after it failed (%s); run "
                      "trtet_store.recover(%r) to finish it", ", ".join(
                          os.fspath(o.dest) for o in self.outputs), exc,
                      os.fspath(self.journal.path.parent))
            exc.add_note("the new files were published; run trtet_store.recover("
                         f"{os.fspath(self.journal.path.parent)!r}) to finish the cleanup")
            self.journal.close()
            return
        log.warning("write of %s failed (%s); rolling back",
                    ", ".join(os.fspath(o.dest) for o in self.outputs), exc)
        try:
            if self.journal.state == PUBLISHING:
                # Some outputs may be renamed into place: say so durably before
                # taking them back, so that recovery can finish taking them back.
                self.journal.mark(UNPUBLISHING)
                replay.unpublish(self.journal.plan)
                for out in self.outputs:
                    out.renamed = False
            self.journal.mark(ROLLING_BACK)
            self.close_temps()
            replay.undo(self.journal.plan)
            self.journal.remove()
            self.journal = None
            self._reseal_restored()
        except BaseException as undo_exc:
            # Keep the journal: it is what lets `recover` finish the rollback.
            directory = os.fspath(self.journal.path.parent)
            log.error("rollback did not complete (%s); run trtet_store.recover(%r)", undo_exc,
                      directory)
            self.journal.close()
            exc.add_note(f"rollback did not complete: {undo_exc!r}; run "
                         f"trtet_store.recover({directory!r})")
            if isinstance(undo_exc, OSError) and undo_exc.errno == errno.ENOSPC:
                step = max((p.step for plans in self.plans for _, p in plans
                            if p.placement == "move"), default=0)
                exc.add_note(f"giving moved bytes back to their sources needs {step} bytes "
                             f"free; free that much on the filesystem of {directory}, then run "
                             f"`trtet-store recover {directory}`. Until then every byte is in "
                             "its source or in the temp file, as the journal there records.")
            return
        if isinstance(exc, InsufficientSpaceError):
            # A placement's fallback found no room for itself before writing a byte.
            exc.add_note("the write was rolled back: the sources and the destinations are as "
                         "they were")
        elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            exc.add_note(f"the filesystem of {', '.join(os.fspath(o.dest) for o in self.outputs)} "
                         "filled up during the write, after the preflight had found enough "
                         "space (something else took it meanwhile); the write was rolled back: "
                         "the sources and the destinations are as they were")

    def _reseal_restored(self) -> None:
        """Blobs a rollback gave back (verified moves, exactly undone inserts) are sealed anew.

        Our own truncation, rename and collapse changed their files' identity;
        without this a retry could not place them by clone or insert.
        """
        for plans in self.plans:
            for ext, plan in plans:
                if plan.placement in ("move", "insert") and isinstance(ext.piece, Blob):
                    with contextlib.suppress(OSError):
                        ext.piece.reseal()

    # -- helpers ---------------------------------------------------------------

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress:
            self.progress(self.done, self.total)

    def close_temps(self) -> None:
        for out in self.outputs:
            if out.temp_fd >= 0:
                with contextlib.suppress(OSError):
                    fs.calls.close(out.temp_fd)
                out.temp_fd = -1

    def unlock_destinations(self) -> None:
        for out in self.outputs:
            if out.lock_fd >= 0:
                unlock_file(out.lock_fd, out.lock_path)
                out.lock_fd = -1


def _per_output(follow_links: bool | Sequence[bool], n: int) -> list[bool]:
    """``follow_links`` as one bool per output (a bool is every output's)."""
    if isinstance(follow_links, bool):
        return [follow_links] * n
    flags = list(follow_links)
    if len(flags) != n or not all(isinstance(f, bool) for f in flags):
        raise TypeError(f"follow_links must be True, False or one of them per output "
                        f"({n}), not {follow_links!r}")
    return flags


def _view(piece: Piece) -> memoryview:
    """The piece's bytes as they are, without a copy: an inline piece may be a
    tensor of gigabytes written from its own memory (a copy cost a 2 GiB
    safetensors save 0.7 s of 2.4 s)."""
    return memoryview(piece).cast("B")


#: Inline bytes of one output from which they are synced and journaled as on
#: disk instead of digested (see :meth:`Transaction.create_temps`).
SYNC_INLINE_MIN = 64 * 1024 * 1024


#: Inline pieces up to this size are tested for all zeros (padding, left a
#: hole); larger ones are data, written as they are rather than scanned.
PADDING_MAX = 64 * 1024


def _is_padding(data: memoryview) -> bool:
    return len(data) <= PADDING_MAX and not bytes(data).strip(b"\0")
