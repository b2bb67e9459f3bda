"""The write transaction: validate, preflight, journal, place, verify, publish, release.

One or more output files are written as a single transaction. Until the
journal records ``publishing`` every failure rolls back: moved bytes go back
into their sources, temp files go, destinations keep what they had, and the
error propagates. See DESIGN.md, "The transaction".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.io import fs, names, replay, transfer
from trtet_store.io.blobstore import Blob, chunk_digest, live_blob
from trtet_store.io.errors import (
    InsufficientSpaceError,
    PlacementUnavailable,
    SourceChangedError,
)
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
from trtet_store.io.layout import Extent, ExternalFile, Layout, Piece
from trtet_store.io.lock import lock_file
from trtet_store.io.recovery import recover_destination
from trtet_store.io.units import MiB, round_up

log = logging.getLogger("trtet_store.writer")

# A move's peak-disk budget (two steps of half this; see transfer.move_step)
# and a copy's step. One fdatasync per 32 MiB step instead of two per 8 MiB
# cut a third off a durable 1 GiB move (benchmarks/README.md); 64 MiB is
# small next to any disk that holds an engine.
DEFAULT_CHUNK_SIZE = 64 * MiB
# Room for the journal, directory entries and per-file block rounding, on top
# of what the placements themselves need.
SLACK_BYTES = MiB
PLACEMENTS = ("clone", "insert", "move", "copy")

ProgressCallback = Callable[[int, int], None]


@dataclass
class PlacementRecord:
    """How one payload got into its output."""

    index: int
    source: str
    offset: int
    size: int
    placement: str
    reason: str
    bytes_written: int = 0
    seconds: float = 0.0
    verified: bool = False

    def to_json(self) -> dict[str, object]:
        """The record as a JSON-ready dict (what ``trtet-store`` prints)."""
        return {
            "offset": self.offset,
            "size": self.size,
            "placement": self.placement,
            "reason": self.reason,
            "bytes_written": self.bytes_written,
        }


@dataclass
class WriteReport:
    """What a write did, per output file.

    Attributes
    ----------
    path : pathlib.Path
        The published file.
    size : int
        Its length.
    inline_bytes : int
        Bytes written from memory (headers, metadata, padding).
    placements : list of PlacementRecord
        One per payload: the placement used, why, bytes written, seconds.
    seconds : float
        Wall time of the whole transaction.
    """

    path: Path
    size: int
    inline_bytes: int = 0
    placements: list[PlacementRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_written(self) -> int:
        """Bytes this write put on disk itself (inline plus copied or moved)."""
        return self.inline_bytes + sum(p.bytes_written for p in self.placements)

    def to_json(self) -> dict[str, object]:
        """The report as a JSON-ready dict: path, size, seconds and each placement."""
        return {
            "path": os.fspath(self.path),
            "size": self.size,
            "seconds": self.seconds,
            "placements": [p.to_json() for p in self.placements],
        }


def write_file(path: os.PathLike | str, pieces: Iterable[Piece], *, consume: bool = False,
               chunk_size: int | None = None, progress: ProgressCallback | None = None,
               placements: Collection[str] | str | None = None,
               timeout: float | None = None) -> WriteReport:
    """Write the concatenation of ``pieces`` to ``path`` as one transaction.

    Parameters
    ----------
    path : path-like
        The destination. It holds its old content, or none, until the new file
        is complete and durable, then the new file replaces it atomically.
    pieces : iterable of bytes, Blob or ExternalFile
        The content in order.
    consume : bool
        Allow moving :class:`Blob` pieces into the output (they are released
        afterwards) when they share the output's filesystem. Without it every
        source is left as it was.
    chunk_size : int, optional
        The most extra disk a move may use (default 64 MiB: two steps of half
        that, rounded to whole digest chunks of its blob), and a copy's step.
    progress : callable, optional
        Called as ``progress(bytes_done, bytes_total)`` as payload bytes land.
    placements : collection of str, optional
        Limit the ladder (``clone``, ``insert``, ``move``, ``copy``; copy is
        always allowed), e.g. to compare placements in a benchmark. Default:
        every placement the filesystem allows, best first. One placement may
        be given as a string.
    timeout : float, optional
        Seconds to wait for another write of the same destination to finish.
        Default: do not wait (raise :class:`ConcurrentWriteError` at once).

    Returns
    -------
    WriteReport

    Raises
    ------
    InsufficientSpaceError
        Before anything is created, when the chosen placements cannot fit.
    OSError
        Any other failure, after everything was rolled back.
    """
    return write_files([(path, pieces)], consume=consume, chunk_size=chunk_size,
                       progress=progress, placements=placements, timeout=timeout)[0]


def write_files(outputs: Sequence[tuple[os.PathLike | str, Iterable[Piece]]], *,
                consume: bool = False, chunk_size: int | None = None,
                progress: ProgressCallback | None = None,
                placements: Collection[str] | str | None = None,
                timeout: float | None = None) -> list[WriteReport]:
    """Write several files as one transaction: all are published, or none changes.

    Every output is placed and verified in its temp file before the first
    rename. Parameters are as for :func:`write_file`.
    """
    return Transaction(outputs, consume=consume, chunk_size=chunk_size,
                       progress=progress, placements=placements, timeout=timeout).run()


def _check_pieces(dest: os.PathLike | str, pieces: object) -> None:
    """A bytes object is iterable (as ints): say what was meant instead of 'got int'."""
    if isinstance(pieces, (bytes, bytearray, memoryview, str, Blob, ExternalFile)):
        raise TypeError(f"pieces of {os.fspath(dest)} must be a list of pieces (bytes, Blob, "
                        f"ExternalFile), got a single {type(pieces).__name__}; wrap it: [data]")


class _Output:
    """One output while the transaction runs."""

    def __init__(self, dest: Path, layout: Layout) -> None:
        self.dest = dest
        self.layout = layout
        self.temp = dest  # named once the transaction has its token
        self.backup: Path | None = None
        self.temp_fd = -1
        self.lock_fd = -1
        self.lock_path = names.lock_path_of(dest)
        self.old_stat: os.stat_result | None = None
        self.report = WriteReport(dest, layout.size)
        self.renamed = False


class Transaction:
    """A write of one or more files; :meth:`run` is the only way in."""

    def __init__(self, outputs: Sequence[tuple[os.PathLike | str, Iterable[Piece]]], *,
                 consume: bool, chunk_size: int | None,
                 progress: ProgressCallback | None,
                 placements: Collection[str] | str | None = None,
                 timeout: float | None = None) -> None:
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if not outputs:
            raise ValueError("nothing to write: no outputs given")
        for path, pieces in outputs:
            _check_pieces(path, pieces)
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
        self.progress = progress
        self.outputs = [_Output(names.destination(p), Layout(pieces)) for p, pieces in outputs]
        for out in self.outputs:
            out.temp = names.temp_path(out.dest, self.token)
        self.plans: dict[int, list[tuple[Extent, PayloadPlan]]] = {}
        self.journal: Journal | None = None
        self.total = sum(o.layout.size for o in self.outputs)
        self.done = 0
        self.committed = False

    # -- the steps, in order -------------------------------------------------

    def run(self) -> list[WriteReport]:
        start = time.monotonic()
        try:
            self.validate()
            self.lock_destinations()
            try:
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
        seconds = time.monotonic() - start
        for out in self.outputs:
            out.report.seconds = seconds
        return [o.report for o in self.outputs]

    def validate(self) -> None:
        """Refuse bad destinations and sources before touching anything."""
        dests: dict[str, Path] = {}
        dest_stats = []
        for out in self.outputs:
            parent = out.dest.parent
            if not parent.is_dir():
                raise FileNotFoundError(errno.ENOENT,
                                        f"cannot write {out.dest}: its directory does not exist",
                                        os.fspath(parent))
            if os.statvfs(parent).f_flag & os.ST_RDONLY:
                raise OSError(errno.EROFS, f"cannot write {out.dest}: its filesystem is mounted "
                              "read-only", os.fspath(parent))
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES,
                                      f"cannot write {out.dest}: its directory is not writable",
                                      os.fspath(parent))
            if out.dest.is_dir():
                raise IsADirectoryError(errno.EISDIR, f"cannot write {out.dest}: it is a "
                                        "directory; give a file name", os.fspath(out.dest))
            key = os.fspath(out.dest)
            if key in dests:
                raise ValueError(f"{out.dest} is named twice among the outputs")
            dests[key] = out.dest
            with contextlib.suppress(FileNotFoundError):
                out.old_stat = os.stat(out.dest)
                dest_stats.append((out.dest, out.old_stat))
        self._check_inodes()
        for out in self.outputs:
            for ext in out.layout.payloads:
                src = _source_path(ext.piece)
                try:
                    st = os.stat(src)
                except FileNotFoundError:
                    raise FileNotFoundError(
                        errno.ENOENT, f"piece {ext.index} of {out.dest}: source file is gone",
                        os.fspath(src)) from None
                if not fs.is_regular(st):
                    raise ValueError(f"piece {ext.index} of {out.dest}: {src} is not a "
                                     "regular file")
                if st.st_size != ext.size:
                    raise SourceChangedError(
                        src, f"piece {ext.index} of {out.dest}: it is {st.st_size} bytes, but "
                        f"{ext.size} were planned")
                for dest, dst_st in dest_stats:
                    if fs.same_file(st, dst_st):
                        raise ValueError(
                            f"cannot write {dest}: it is (or links to) the source of piece "
                            f"{ext.index}, {src}; write to another path")
        for dest, dst_st in dest_stats:
            owner = live_blob(dst_st)
            if owner is not None:
                # Not a piece of this write, but some store's blob all the same:
                # its bytes would be overwritten under a Blob that keeps its old
                # size and digests, and closing it would delete the output.
                raise ValueError(f"cannot write {dest}: it is (or links to) the file of a live "
                                 f"blob, {owner.path}; write to another path")

    def _check_inodes(self) -> None:
        """Refuse, naming the cause, a write whose lock, journal and temp files cannot be created.

        Out of inodes, the first ``open(O_CREAT)`` fails with a bare ENOSPC on
        an internal name, which reads like a full disk that ``df`` denies.
        """
        per_dir: dict[Path, int] = {}
        for out in self.outputs:
            per_dir[out.dest.parent] = per_dir.get(out.dest.parent, 0) + 4  # lock, journal,
        for parent, n in per_dir.items():                                    # temp, backup
            st = os.statvfs(parent)
            if st.f_files and st.f_favail < n:  # f_files 0: no inode limit (btrfs)
                raise OSError(errno.ENOSPC, f"cannot write into {parent}: its filesystem has "
                              f"{st.f_favail} free inodes (files) left, the write needs {n}; "
                              "delete files there (disk space is not the problem)",
                              os.fspath(parent))

    def lock_destinations(self) -> None:
        """Take a per-destination lock, so two writers never race for one file."""
        for out in self.outputs:
            out.lock_fd = lock_file(out.lock_path, out.dest, self.timeout)
            recover_destination(out.dest)

    def choose_placements(self) -> None:
        """Pick, per payload, the best placement allowed, and say why."""
        uses: dict[str, int] = {}
        for out in self.outputs:
            for ext in out.layout.payloads:
                key = os.fspath(_source_path(ext.piece))
                uses[key] = uses.get(key, 0) + 1
        for i, out in enumerate(self.outputs):
            plans = []
            for ext in out.layout.payloads:
                piece = ext.piece
                placement, reason = self._choose(out, ext, uses[os.fspath(_source_path(piece))])
                digest_chunk, digests = _digests(piece)
                step = transfer.move_step(self.chunk_size, digest_chunk)
                plan = PayloadPlan(
                    source=os.fspath(_source_path(piece)), offset=ext.offset, size=ext.size,
                    placement=placement, reason=reason, chunk_size=digest_chunk,
                    chunk_digests=list(digests) if digests is not None else None, step=step,
                    identity=list(piece.identity) if isinstance(piece, Blob) else None,
                    consumed=placement in ("move", "insert") or (
                        placement == "clone" and self.consume and isinstance(piece, Blob)
                        and uses[os.fspath(piece.path)] == 1))
                plans.append((ext, plan))
                log.info("%s: piece %d (%d bytes from %s) by %s: %s", out.dest, ext.index,
                         ext.size, plan.source, placement, reason)
            self.plans[i] = plans
            self._choose_host(out, plans)
            for ext, plan in plans:
                if plan.placement in ("clone", "insert") and isinstance(ext.piece, Blob):
                    # A zero-copy placement never reads the payload: the file
                    # must still be the one sealed (checked again as it is placed).
                    ext.piece.check_identity()

    def _choose_host(self, out: _Output, plans: list[tuple[Extent, PayloadPlan]]) -> None:
        """Let the largest movable payload become the output file itself (insert).

        Renaming it into place and inserting room for what precedes it moves no
        payload byte at all; it needs a block-aligned offset and a filesystem
        that inserts ranges (ext4, XFS).
        """
        movable = [p for _, p in plans if p.placement == "move"]
        if not movable or "insert" not in self.allowed:
            return
        host = max(movable, key=lambda p: p.size)
        bs = fs.block_size(out.dest.parent)
        if host.offset % bs:
            host.reason += (f"; no insert: offset {host.offset} is not a multiple of the "
                            f"{bs}-byte block (export with segment_alignment=4096)")
            return
        try:
            why = fs.probe_insert_range(out.dest.parent)
        except PlacementUnavailable as exc:
            host.reason += f"; no insert: {exc.reason}"
            return
        host.placement = "insert"
        host.reason = f"the largest payload hosts the file: {why}; {host.reason}"
        log.info("%s: %s becomes the output file (insert)", out.dest, host.source)

    def _choose(self, out: _Output, ext: Extent, uses: int) -> tuple[str, str]:
        """The best placement allowed for one payload, with why, and why not better.

        Ladder, best first: clone (shares blocks, needs a reflink filesystem
        and a block-aligned offset), move (needs consume and one filesystem),
        copy. Capabilities are found by trying, never predicted.
        """
        piece = ext.piece
        source = _source_path(piece)
        bs = fs.block_size(out.dest.parent)
        if "clone" not in self.allowed:
            no_clone = "no clone: not among the placements allowed"
        elif ext.offset % bs:
            no_clone = (f"no clone: offset {ext.offset} is not a multiple of the {bs}-byte "
                        "block (export with segment_alignment=4096)")
        else:
            try:
                return "clone", fs.probe_clone(source, out.dest.parent)
            except PlacementUnavailable as exc:
                no_clone = f"no clone: {exc.reason}"
        if isinstance(piece, ExternalFile):
            return "copy", f"not owned by a blob store, so only copied; {no_clone}"
        if not self.consume:
            return "copy", f"consume=False: sources are left intact; {no_clone}"
        if uses > 1:
            return "copy", f"the blob is used more than once, so it must survive; {no_clone}"
        if "move" not in self.allowed:
            return "copy", f"move is not among the placements allowed; {no_clone}"
        unchanged = piece.identity_matches()
        try:
            why, placement = fs.probe_same_filesystem(source, out.dest.parent), "move"
        except PlacementUnavailable as exc:
            why, placement = exc.reason, "copy"
        if unchanged:
            piece.reseal()  # the probe's own link and unlink changed only its ctime
        return placement, f"{why}; {no_clone}"

    def preflight(self) -> None:
        """Fail before creating anything if the placements cannot fit."""
        need: dict[int, tuple[int, Path]] = {}
        for i, out in enumerate(self.outputs):
            bs = fs.block_size(out.dest.parent)
            n = sum(round_up(e.size, bs) for e in out.layout.inline)
            moves = [p for _, p in self.plans[i] if p.placement == "move"]
            n += sum(round_up(p.size, bs) for _, p in self.plans[i] if p.placement == "copy")
            n += sum(bs for _, p in self.plans[i] if p.placement == "clone")  # unaligned tail
            if moves:
                n += transfer.move_peak(max(p.step for p in moves)) + bs * 2 * len(moves)
            # insert: the header's blocks are counted with the inline bytes
            dev = os.stat(out.dest.parent).st_dev
            prev, _ = need.get(dev, (SLACK_BYTES, out.dest))
            need[dev] = (prev + n, out.dest)
        for needed, dest in need.values():
            available = fs.free_bytes(dest.parent)
            if needed > available:
                raise InsufficientSpaceError(needed, available, dest, self._space_hint())

    def _space_hint(self) -> str | None:
        """What would make the write fit, if anything: never advice it already follows."""
        copied = [(ext, p) for plans in self.plans.values() for ext, p in plans
                  if p.placement == "copy" and isinstance(ext.piece, Blob)]
        if not copied:
            return None
        if not self.consume:
            return "consume=True needs only one chunk extra"
        return ("the blobs are copied because they are on another filesystem than the output; "
                "stage them on the output's filesystem to move them")

    def digest_sources(self) -> None:
        """Digest adopted blobs that a move or copy will read anyway (adopt reads nothing).

        Their digests go into the journal, so a move is verified as it goes,
        and a rollback or a recovery can check what it gives back.
        """
        for plans in self.plans.values():
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
        for plans in self.plans.values():
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
            inline = [InlinePlan(e.offset, e.size, chunk_digest(_bytes(e.piece)))
                      for e in out.layout.inline]
            outputs.append(OutputPlan(
                dest=os.fspath(out.dest), temp=os.fspath(out.temp),
                backup=os.fspath(out.backup) if out.backup else None, size=out.layout.size,
                inline=inline, payloads=[p for _, p in self.plans[i]]))
        first = self.outputs[0]
        path = names.journal_path(first.dest, self.token)
        pin_dirs = sorted({os.path.dirname(p.source) for plans in self.plans.values()
                           for ext, p in plans if isinstance(ext.piece, Blob)})
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
                                            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                            0o644)
            self._keep_mode_and_owner(out)
            # Pre-sizing keeps XFS from speculative preallocation past EOF,
            # which would cost a move a second chunk of disk.
            fs.calls.ftruncate(out.temp_fd, out.layout.size)
            for ext in out.layout.inline:
                data = _bytes(ext.piece)
                if data.strip(b"\0"):  # zero padding stays a hole
                    fs.pwrite_all(out.temp_fd, data, ext.offset)
                out.report.inline_bytes += ext.size
                self._advance(ext.size)

    def _keep_mode_and_owner(self, out: _Output) -> None:
        """Give the new file the old one's mode and owner, as an in-place save keeps them."""
        st = out.old_stat
        if st is None:
            return
        try:
            fs.calls.fchown(out.temp_fd, st.st_uid, st.st_gid)
        except PermissionError:
            # Only root may give a file away; an unprivileged writer keeps its
            # own ownership, as any replace-by-rename does.
            log.info("%s: cannot keep its owner %d:%d (not permitted); the new file is ours",
                     out.dest, st.st_uid, st.st_gid)
        # After the chown, which clears set-id bits.
        fs.calls.fchmod(out.temp_fd, stat.S_IMODE(st.st_mode))

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
        for plans in self.plans.values():
            for ext, p in plans:
                if p is plan:
                    return ext.piece if isinstance(ext.piece, Blob) else None
        return None

    def place(self) -> None:
        """Place every payload, from the end of each file toward the front."""
        for i, out in enumerate(self.outputs):
            for ext, plan in sorted(self.plans[i], key=lambda ep: -ep[1].offset):
                if plan.placement == "insert":  # already in place since create_temps
                    out.report.placements.append(PlacementRecord(
                        ext.index, plan.source, plan.offset, plan.size, "insert", plan.reason))
                    self._advance(plan.size)
                    continue
                record = PlacementRecord(ext.index, plan.source, plan.offset, plan.size,
                                         plan.placement, plan.reason)
                t0 = time.monotonic()
                record.bytes_written = self._place_one(out, plan)
                record.seconds = time.monotonic() - t0
                record.placement, record.reason = plan.placement, plan.reason
                # A clone shares the source's blocks: no byte passed through us to check.
                record.verified = plan.chunk_digests is not None and plan.placement != "clone"
                out.report.placements.append(record)
                log.info("%s: placed %d bytes at %d by %s in %.3f s", out.dest, plan.size,
                         plan.offset, plan.placement, record.seconds)
            out.report.placements.sort(key=lambda r: r.offset)

    def _place_one(self, out: _Output, plan: PayloadPlan) -> int:
        flags = os.O_RDWR if plan.placement == "move" else os.O_RDONLY
        src_fd = fs.calls.open(plan.source, flags | os.O_CLOEXEC)
        try:
            if plan.placement == "clone":
                blob = self._blob_of(plan)
                try:
                    # Nothing is read: the sealed identity, before and after,
                    # is what says the shared blocks are the staged bytes.
                    if blob is not None:
                        blob.check_identity(os.fstat(src_fd))
                    written = transfer.clone(src_fd, out.temp_fd, plan.offset, plan.size,
                                             block=fs.block_size(out.dest.parent),
                                             src_path=plan.source, progress=self._advance)
                    if blob is not None:
                        blob.check_identity(os.fstat(src_fd))
                    return written
                except PlacementUnavailable as exc:
                    # Only to copy: the journal promised the source stays intact.
                    log.warning("%s: clone of %s failed before changing anything (%s); "
                                "copying instead", out.dest, plan.source, exc.reason)
                    plan.placement = "copy"
                    plan.reason = f"clone failed ({exc.reason}); copied"
                    fs.capabilities.put(("clone", fs.fs_identity(plan.source),
                                         fs.fs_identity(out.dest.parent)), False, exc.reason)
            if plan.placement == "move":
                return transfer.move(src_fd, out.temp_fd, plan.offset, plan.size, step=plan.step,
                                     digests=plan.chunk_digests, digest_chunk=plan.chunk_size,
                                     src_path=plan.source, progress=self._advance)
            return transfer.copy(src_fd, out.temp_fd, plan.offset, plan.size,
                                 chunk=self.chunk_size, digests=plan.chunk_digests,
                                 digest_chunk=plan.chunk_size, src_path=plan.source,
                                 dst_path=os.fspath(out.temp), progress=self._advance)
        finally:
            fs.calls.close(src_fd)

    def publish(self) -> None:
        """Make every temp file durable, then rename each over its destination."""
        for out in self.outputs:
            fs.calls.fsync(out.temp_fd)
        assert self.journal is not None
        self.journal.mark(PUBLISHING)
        for out in self.outputs:
            if out.backup is not None:
                with contextlib.suppress(FileNotFoundError):
                    fs.calls.link(os.fspath(out.dest), os.fspath(out.backup))
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
        return [ext.piece for plans in self.plans.values() for ext, plan in plans
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
                step = max((p.step for plans in self.plans.values() for _, p in plans
                            if p.placement == "move"), default=0)
                exc.add_note(f"giving moved bytes back to their sources needs {step} bytes "
                             f"free; free that much on the filesystem of {directory}, then run "
                             f"`trtet-store recover {directory}`. Until then every byte is in "
                             "its source or in the temp file, as the journal there records.")
            return
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            exc.add_note(f"the filesystem of {', '.join(os.fspath(o.dest) for o in self.outputs)} "
                         "filled up during the write, after the preflight had found enough "
                         "space (something else took it meanwhile); the write was rolled back: "
                         "the sources and the destinations are as they were")

    def _reseal_restored(self) -> None:
        """Blobs a rollback gave back (verified moves, exactly undone inserts) are sealed anew.

        Our own truncation, rename and collapse changed their files' identity;
        without this a retry could not place them by clone or insert.
        """
        for plans in self.plans.values():
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
                with contextlib.suppress(OSError):
                    os.unlink(out.lock_path)
                os.close(out.lock_fd)
                out.lock_fd = -1


def _source_path(piece: Blob | ExternalFile) -> Path:
    return Path(piece.path).absolute()


def _digests(piece: Blob | ExternalFile) -> tuple[int, Sequence[int] | None]:
    if isinstance(piece, Blob):
        # An adopted blob has none until a placement that reads it asks (digest_sources).
        return piece.chunk_size, piece.chunk_digests if piece.has_digests else None
    return MiB, None


def _bytes(piece: Piece) -> bytes:
    return bytes(piece) if not isinstance(piece, bytes) else piece
