"""The placements: how a payload's bytes get from its source file into the output.

Each function works on open file descriptors and one payload. Moves are
resumable in both directions: the source's length is the progress marker, so
:func:`move` and :func:`unmove` continue from wherever a previous call (or a
process that died) stopped.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from trtet_store.io import fs, pagecache
from trtet_store.io.digests import chunk_digest
from trtet_store.io.errors import PlacementUnavailable, VerificationError
from trtet_store.io.units import MiB

Progress = Callable[[int], None]


def verify_chunks(data: bytes | memoryview, start: int, chunk_size: int,
                  digests: Sequence[int] | None, what: str, path: str) -> None:
    """Check ``data``, which begins at payload offset ``start``, against chunk digests.

    ``start`` must be a chunk boundary; ``data`` must end on one or at the
    payload's end.
    """
    if digests is None:
        return
    if start % chunk_size:
        raise ValueError(f"{what}: offset {start} is not a multiple of chunk {chunk_size}")
    view = memoryview(data)
    first = start // chunk_size
    for k in range(0, len(view), chunk_size):
        j = first + k // chunk_size
        if j >= len(digests) or chunk_digest(view[k:k + chunk_size]) != digests[j]:
            raise VerificationError(what, j, path)


def _windows(fd: int, base: int, start: int, end: int, chunk_size: int, path: str,
             read_size: int) -> Iterator[tuple[int, memoryview]]:
    """Payload bytes ``[start, end)`` stored in ``fd`` at ``base + start``, read in
    whole chunks of about ``read_size`` bytes: ``(payload offset, bytes)`` each."""
    step = max(chunk_size, read_size // chunk_size * chunk_size)
    for pos in range(start, end, step):
        yield pos, memoryview(fs.pread_exact(fd, min(step, end - pos), base + pos, path))


def verify_range(fd: int, base: int, start: int, end: int, chunk_size: int,
                 digests: Sequence[int] | None, what: str, path: str,
                 read_size: int = 8 * MiB) -> None:
    """Check payload bytes ``[start, end)``, stored in ``fd`` at ``base + start``.

    ``start`` must be a chunk boundary of the payload.
    """
    if digests is None:
        return
    for pos, data in _windows(fd, base, start, end, chunk_size, path, read_size):
        verify_chunks(data, pos, chunk_size, digests, what, path)


def range_chunk_digests(fd: int, base: int, size: int, chunk_size: int, path: str,
                        read_size: int = 8 * MiB) -> list[int]:
    """The chunk digests of payload bytes ``[0, size)``, stored in ``fd`` at ``base``."""
    return [chunk_digest(data[k:k + chunk_size])
            for _, data in _windows(fd, base, 0, size, chunk_size, path, read_size)
            for k in range(0, len(data), chunk_size)]


def copy(src_fd: int, dst_fd: int, dst_offset: int, size: int, *, chunk: int,
         digests: Sequence[int] | None, digest_chunk: int, src_path: str, dst_path: str,
         progress: Progress | None = None, src_offset: int = 0) -> int:
    """Copy ``size`` source bytes from ``src_offset`` to ``dst_offset``; the source is left intact.

    Tries ``copy_file_range`` (the kernel copies, or reflinks where it can),
    falling back to pread/pwrite only if the first call fails before copying a
    byte for a reason that means "not here". Either way the bytes go in
    windows of at most 8 MiB (``chunk`` if smaller), writeback of each started
    as soon as it is written, so the disk writes while the source is read and
    the publish's ``fsync`` finds little left. The kernel's copy is checked
    against the recorded digests window by window, reading each window back
    in a second thread while the next one is copied; the fallback checks the
    bytes it read before writing them.

    Returns
    -------
    int
        Bytes copied.
    """
    window = max(digest_chunk, min(chunk, WINDOW) // digest_chunk * digest_chunk)
    try:
        _copy_file_range(src_fd, dst_fd, dst_offset, size, window, src_path, dst_path, progress,
                         src_offset, digests=digests, digest_chunk=digest_chunk)
    except PlacementUnavailable:
        _copy_pread_pwrite(src_fd, dst_fd, dst_offset, size, window, digests, digest_chunk,
                           src_path, progress, src_offset)
    return size


def _copy_file_range(src_fd: int, dst_fd: int, dst_offset: int, size: int, chunk: int,
                     src_path: str, dst_path: str, progress: Progress | None,
                     src_offset: int = 0, *, digests: Sequence[int] | None = None,
                     digest_chunk: int = 0) -> int:
    """The kernel's copy; :class:`PlacementUnavailable` if it cannot start here.

    Copies windows of ``chunk`` bytes, starts each one's writeback, and
    verifies it against ``digests`` (read back in the background, one window
    behind the copy). A verdict is kept in :data:`fs.capabilities`, keyed by
    both filesystems' identity (not ``st_dev``, which a loop device hands on
    to the next filesystem made on it).
    """
    key = ("copy_file_range", fs.fs_identity(src_path), fs.fs_identity(dst_path))
    known = fs.capabilities.get(key)
    if known is not None and not known[0]:
        raise PlacementUnavailable(known[1])
    what = f"copy of {src_path} into {dst_path}"
    write_behind = True
    done = 0
    with _Behind() as behind:
        while done < size:
            end = min(size, done + chunk)
            pos = done
            while done < end:
                try:
                    n = fs.calls.copy_file_range(src_fd, dst_fd, end - done, src_offset + done,
                                                 dst_offset + done)
                except OSError as exc:
                    if done == 0 and exc.errno in fs.UNSUPPORTED_ERRNOS:
                        why = f"copy_file_range: {os.strerror(exc.errno)}"
                        fs.capabilities.put(key, False, why)
                        raise PlacementUnavailable(why, exc.errno) from None
                    raise
                if n == 0:
                    raise OSError(errno.EIO, f"source ended at {done} of {size} bytes", src_path)
                done += n
                if progress:
                    progress(n)
            if write_behind:
                write_behind = pagecache.supported(fs.calls.sync_file_range, dst_fd,
                                                   dst_offset + pos, end - pos,
                                                   fs.SYNC_FILE_RANGE_WRITE)
            if digests is not None:
                behind.submit(functools.partial(verify_range, dst_fd, dst_offset, pos, end,
                                                digest_chunk, digests, what, dst_path))
        behind.wait()
    fs.capabilities.put(key, True, "copy_file_range works")
    return done


def _copy_pread_pwrite(src_fd: int, dst_fd: int, dst_offset: int, size: int, chunk: int,
                       digests: Sequence[int] | None, digest_chunk: int, src_path: str,
                       progress: Progress | None, src_offset: int = 0) -> None:
    step = max(digest_chunk, chunk // digest_chunk * digest_chunk)
    write_behind = True
    for pos in range(0, size, step):
        n = min(step, size - pos)
        data = fs.pread_exact(src_fd, n, src_offset + pos, src_path)
        verify_chunks(data, pos, digest_chunk, digests, f"source {src_path}", src_path)
        fs.pwrite_all(dst_fd, data, dst_offset + pos)
        if write_behind:
            write_behind = pagecache.supported(fs.calls.sync_file_range, dst_fd,
                                               dst_offset + pos, n, fs.SYNC_FILE_RANGE_WRITE)
        if progress:
            progress(n)


class _Behind:
    """One background thread that runs jobs in order, at most one at a time.

    :meth:`submit` first waits for the job before (raising its error), so the
    caller can work on step k+1 while step k's job runs, and never further
    ahead. Leaving the ``with`` block waits for the job still running, also
    when the caller failed: nothing of a step happens after its caller returned.
    Jobs that make system calls only release the GIL while in them, which is
    where they spend their time (the copy's read-back and digest of a window:
    xxhash releases the GIL too). The move has stages of its own
    (:class:`_MoveStages`).
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._job: Future | None = None

    def __enter__(self) -> _Behind:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # an error it raised is the caller's to collect

    def submit(self, job: Callable[[], object]) -> object:
        """Wait for the job before (its result, or its error raised), then start ``job``."""
        result = self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtet-io")
        self._job = self._pool.submit(job)
        return result

    def wait(self) -> object:
        """The running job's result (None if there is none); its error raised."""
        job, self._job = self._job, None
        return None if job is None else job.result()


CLONE_RANGE = 256 * MiB
"""Bytes per FICLONERANGE call.

The calls are what a large clone's time grows with, and the size of a call
bounds how much free space an XFS clone takes for a moment. Each remap
transaction there first reserves as many free blocks as the extent it remaps
(``xfs_reflink_remap_extent``; where that much is not free it reserves a
bmbt split only, so a clone never fails for it) and gives them back when it
commits, microseconds later; an extent remapped is never longer than the
call. ``statvfs`` shows the reservation: a process polling it beside clones
of a 256 MiB extent saw free space dip by 256 MiB in calls of 256 MiB and by
16 MiB in calls of 16 MiB, and a full test run once caught a 168 MiB dip.
Smaller calls cost more than the dip is worth: from a 256 MiB to a 16 GiB
engine, ``compile_and_save`` on XFS grew 1.27x in calls of 256 MiB (4.8 to
6.1 ms), 1.88x in 64 MiB and 3.78x in 16 MiB (5.2 to 19.7 ms), medians of 5
(benchmarks/zero_copy_entry_points.py, benchmarks/README.md)."""


def clone(src_fd: int, dst_fd: int, dst_offset: int, size: int, *, block: int,
          src_path: str, progress: Progress | None = None, src_offset: int = 0) -> int:
    """Share the source's blocks into ``dst_offset``: zero-copy, the source left intact.

    Whole blocks are cloned, in calls of :data:`CLONE_RANGE` bytes; a tail
    shorter than a block (which the kernel will not clone mid-file) is
    written. Raises :class:`PlacementUnavailable` before changing anything
    where cloning cannot work here.

    Returns
    -------
    int
        Bytes written (only the tail).
    """
    if dst_offset % block:
        raise PlacementUnavailable(
            f"offset {dst_offset} is not a multiple of the {block}-byte block "
            "(export with segment_alignment=4096 to allow reflinks)")
    if src_offset % block:
        raise PlacementUnavailable(
            f"source offset {src_offset} is not a multiple of the {block}-byte block")
    whole = size // block * block
    if whole == 0:
        raise PlacementUnavailable(f"the payload is smaller than one block ({block} bytes)")
    step = max(block, CLONE_RANGE // block * block)
    for pos in range(0, whole, step):
        n = min(step, whole - pos)
        try:
            fs.calls.clone_range(src_fd, src_offset + pos, n, dst_fd, dst_offset + pos)
        except OSError as exc:
            # Only the first call fails before anything changed.
            if pos == 0 and exc.errno in fs.UNSUPPORTED_ERRNOS:
                raise PlacementUnavailable(f"FICLONERANGE: {os.strerror(exc.errno)}",
                                           exc.errno) from exc
            raise
        if progress:
            progress(n)
    tail = size - whole
    if tail:
        fs.pwrite_all(dst_fd, fs.pread_exact(src_fd, tail, src_offset + whole, src_path),
                      dst_offset + whole)
        if progress:
            progress(tail)
    return tail


def move_step(chunk: int, digest_chunk: int) -> int:
    """The move granularity for a peak-disk budget of ``chunk`` bytes.

    The caller copies a step while the steps before it are checked, synced
    and cut from the source behind it (:class:`_MoveStages`), and copies no
    further ahead than three steps from the source's length: the step it
    copies and two whose source is not yet cut. A step is a third of the budget,
    rounded down to whole digest chunks (at least one), which lets a move
    verify every chunk as it passes. A move syncs at most once per step.
    """
    return max(digest_chunk, chunk // 3 // digest_chunk * digest_chunk)


def move_peak(step: int) -> int:
    """Extra disk a move with steps of ``step`` bytes may use at its peak: three steps."""
    return 3 * step


#: Bytes per read/write call inside a move step; writeback is started after each,
#: as the blob writer does per window.
WINDOW = pagecache.WINDOW

# struct btrfs_ioctl_... : START_SYNC returns the transaction id, WAIT_SYNC waits for it.
BTRFS_IOC_START_SYNC = 0x80089418  # _IOR(0x94, 24, __u64)
BTRFS_IOC_WAIT_SYNC = 0x40089416  # _IOW(0x94, 22, __u64)


class _Committer:
    """Commits the filesystem transaction of a file where truncation frees nothing until then.

    btrfs returns a truncated source's extents to free space only when its
    transaction commits (every 30 s by default): a move of 2 GiB was seen to
    peak at 1 GiB. ``BTRFS_IOC_START_SYNC`` + ``WAIT_SYNC`` commit the
    current transaction without flushing other files' dirty data (unlike
    ``syncfs``); once per step cost no measurable time on a 1 GiB move
    (benchmarks/README.md). Found by trying: elsewhere the ioctl fails with
    ENOTTY and is not tried again for this move.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.enabled = True

    def commit(self) -> None:
        if not self.enabled:
            return
        buf = bytearray(8)
        try:
            fcntl.ioctl(self.fd, BTRFS_IOC_START_SYNC, buf, True)
        except OSError as exc:
            if exc.errno not in fs.UNSUPPORTED_ERRNOS:
                raise
            self.enabled = False
            return
        fcntl.ioctl(self.fd, BTRFS_IOC_WAIT_SYNC, bytes(buf))


class _MoveStages:
    """A move's stages, in three threads: copy (the caller), check, and sync-then-cut.

    Progress is four payload offsets, each only going down: ``copied``
    (bytes ``[copied, size)`` are written to the destination: the writes
    returned), ``checked`` (``[checked, size)`` match their digests, as read
    from the source), ``durable`` (``[durable, size)`` synced: an
    ``fdatasync`` of the destination that began after they were copied
    returned) and ``cut`` (the source's length). The source is cut only to
    an offset that is both checked and durable (invariant 1).

    The sync thread syncs every step copied since its last sync with one
    ``fdatasync`` (where a sync takes longer than a step's copy, as through
    a loop device to the host's disk, one sync covers several steps), then
    cuts the source to what it made durable once the check thread has
    checked it. The check thread digests the bytes the caller read, beside
    the sync. A cut in a thread of its own, beside the next sync, was
    measured and not kept: on ext4 a truncation and a journal commit wait
    for each other (a commit waits for the truncation's open handle), and
    on a plain ext4 disk the move took 1.66 s that way against 1.57 s
    (benchmarks/README.md, issue 26).

    The caller copies a step only once ``cut - start <= room``: the bytes in
    both files, the step about to be copied included, never exceed ``room``
    (three steps, :func:`move_peak`). Blocks cut from the source count as
    free at once: ext4 and XFS show them free in ``statvfs`` at once, and
    where an allocation needs them before the journal has committed the
    truncation they commit it and allocate (``ext4_should_retry_alloc``,
    XFS's busy-extent flush); btrfs frees them at its transaction commit,
    which the sync thread asks for after each truncation (:class:`_Committer`).

    Leaving the ``with`` block stops the threads after the call each is in,
    also when the caller failed: nothing of the move happens after it returned.
    """

    def __init__(self, src_fd: int, dst_fd: int, length: int, room: int,
                 check: Callable[[list[tuple[int, bytes]]], None], dst_offset: int = 0) -> None:
        self.src_fd, self.dst_fd, self.room, self.check = src_fd, dst_fd, room, check
        self.dst_offset, self.top = dst_offset, length
        self._drop = True  # the synced steps leave the page cache, where the file can do that
        self.copied = self.checked = self.durable = self.cut = length
        self._cut_reported = length
        self._to_check: list[tuple[int, list[tuple[int, bytes]]]] = []
        self._to_sync: list[int] = []
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._committer = _Committer(src_fd)
        self._threads = [threading.Thread(target=self._run, args=(job,), name=f"trtet-{name}")
                         for name, job in (("check", self._check), ("sync", self._sync))]

    def __enter__(self) -> _MoveStages:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()

    def _run(self, job: Callable[[], bool]) -> None:
        try:
            while job():
                pass
        except BaseException as exc:  # the caller raises it
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Wait (holding the lock) until ``ready()``; False once the move stops or failed."""
        while True:
            if self._error is not None or self._stop:
                return False
            if ready():
                return True
            self._cond.wait()

    def _check(self) -> bool:
        with self._cond:
            if not self._wait(lambda: bool(self._to_check)):
                return False
            steps, self._to_check = self._to_check, []
        for _, data in steps:
            self.check(data)
        with self._cond:
            self.checked = steps[-1][0]
            self._cond.notify_all()
        return True

    def _sync(self) -> bool:
        with self._cond:
            if not self._wait(lambda: bool(self._to_sync)):
                return False
            starts, self._to_sync = self._to_sync, []
            synced_end = self.durable
        fs.calls.fdatasync(self.dst_fd)
        with self._cond:
            self.durable = starts[-1]
            self._cond.notify_all()
            if not self._wait(lambda: self.checked <= self.durable):
                return False
        # Invariant 1: the bytes cut are durable in the destination (and were
        # what the source was meant to hold).
        fs.calls.ftruncate(self.src_fd, self.durable)
        if self.durable:
            self._committer.commit()
        with self._cond:
            self.cut = self.durable
            self._cond.notify_all()
        # After the cut, which the caller may be waiting for: this waits for nothing.
        self._drop_synced(starts[-1], synced_end)
        return True

    def _drop_synced(self, start: int, end: int) -> None:
        """Drop the destination's pages of payload ``[start, end)``, just synced.

        The output is not read again here, and its pages are clean, so dropping
        them waits for nothing; measured on the device's plain disk, the move
        is a little faster with it (benchmarks/README.md, issue 26), and a
        move of tens of GiB does not evict everything else the machine had
        cached. (The copy does not drop: there a drop must wait for writeback,
        and measured it was slower.)

        The page a step shares with the step below it is not written in full
        yet, so it stays (:func:`pagecache.drop_clean` drops whole pages). The
        range ends :data:`pagecache.LARGEST_FOLIO` above ``end`` (no higher
        than the move's top), where the steps synced before lie: each step's
        first write begins a folio inside a page, which also holds the last
        bytes of the step below, and that folio goes with this sync.
        """
        if self._drop:
            self._drop = pagecache.drop_clean(
                self.dst_fd, self.dst_offset + start,
                self.dst_offset + min(self.top, end + pagecache.LARGEST_FOLIO))

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def wait_for_room(self, start: int) -> None:
        """Wait until the step from ``start`` fits beside what the source still holds."""
        with self._cond:
            self._raise()
            self._cond.wait_for(lambda: self._error is not None or self.cut - start <= self.room)
            self._raise()

    def copied_to(self, start: int, data: list[tuple[int, bytes]]) -> None:
        """The step from ``start`` is in the destination (its writes returned): check, sync it."""
        with self._cond:
            self._raise()
            self.copied = start
            self._to_check.append((start, data))
            self._to_sync.append(start)
            self._cond.notify_all()

    def finish(self) -> None:
        """Wait until the whole source is cut."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or self.cut == self.copied)
            self._raise()

    def newly_cut(self) -> int:
        """Bytes cut from the source since the last call."""
        with self._cond:
            n, self._cut_reported = self._cut_reported - self.cut, self.cut
        return n


def move(src_fd: int, dst_fd: int, dst_offset: int, size: int, *, step: int,
         digests: Sequence[int] | None, digest_chunk: int, src_path: str,
         progress: Progress | None = None) -> int:
    """Move the source into ``[dst_offset, dst_offset+size)``, back to front.

    The caller copies the source's last ``step`` bytes to their place, then
    the ``step`` before them, and so on; behind it, one thread checks each
    copied step against its digests, and a second makes the steps durable
    (one ``fdatasync`` for every step copied since its last one) and then
    truncates the source to what is both (:class:`_MoveStages`). The
    source's length is the progress marker: bytes ``[len, size)`` are in the
    destination. A truncation is not synced: it becomes durable with the
    next ``fdatasync`` (ext4 and XFS commit their journals in order), and a
    power cut that loses it only leaves the source longer, with its bytes
    intact (freed blocks are reused only after the commit), so the move
    copies those bytes again.

    Inside a step the bytes go in windows of 8 MiB, front to back; writeback
    of each window starts as soon as it is written (``sync_file_range``), and
    the next step of the source is read ahead (``POSIX_FADV_WILLNEED``), so
    a sync finds little left to write.

    Extra disk at any instant: three steps (see :func:`move_step`). Where the
    filesystem frees truncated blocks only at a transaction commit (btrfs),
    each truncation commits it.

    Returns
    -------
    int
        Bytes moved by this call (a resumed move moves only what was left).
    """
    length = os.fstat(src_fd).st_size
    if length > size:
        raise OSError(errno.EINVAL, f"source is {length} bytes, planned {size}", src_path)
    if length == 0:
        return 0
    window = max(digest_chunk, WINDOW // digest_chunk * digest_chunk)
    write_behind = True
    first = (length - 1) // step * step
    read_ahead = pagecache.supported(fs.calls.fadvise, src_fd, first, length - first,
                                     os.POSIX_FADV_WILLNEED)
    moved = 0

    def check(data: list[tuple[int, bytes]]) -> None:
        for pos, chunk in data:
            verify_chunks(chunk, pos, digest_chunk, digests, f"source {src_path}", src_path)

    def report(n: int) -> None:
        nonlocal moved
        if n:
            moved += n
            if progress:
                progress(n)

    with _MoveStages(src_fd, dst_fd, length, move_peak(step), check, dst_offset) as stages:
        while length > 0:
            start = (length - 1) // step * step
            stages.wait_for_room(start)
            report(stages.newly_cut())
            if read_ahead and start:
                # Ask for the next step now: it is read while this one is copied.
                before = max(0, start - step)
                read_ahead = pagecache.supported(fs.calls.fadvise, src_fd, before,
                                                 start - before, os.POSIX_FADV_WILLNEED)
            fs.allocate(dst_fd, dst_offset + start, length - start)
            # Front to back inside the step, so that the kernel's readahead of an
            # uncached source works with us; only the steps go back to front.
            data = []
            for pos in range(start, length, window):
                end = min(length, pos + window)
                chunk = fs.pread_exact(src_fd, end - pos, pos, src_path)
                fs.pwrite_all(dst_fd, chunk, dst_offset + pos)
                if write_behind:
                    write_behind = pagecache.supported(fs.calls.sync_file_range, dst_fd,
                                                       dst_offset + pos, end - pos,
                                                       fs.SYNC_FILE_RANGE_WRITE)
                data.append((pos, chunk))
            stages.copied_to(start, data)
            length = start
        stages.finish()
    report(stages.newly_cut())
    return moved


def unmove(src_fd: int, dst_fd: int, dst_offset: int, size: int, *, step: int,
           digests: Sequence[int] | None, digest_chunk: int, dst_path: str,
           src_path: str) -> int:
    """Undo :func:`move`: give the source back the bytes it lost, front to back.

    The source grows from its current length (still the progress marker), each
    step made durable before its copy in the destination is punched out, so a
    rollback on a full disk needs one step of space, like the move.

    Returns
    -------
    int
        Bytes returned to the source.
    """
    length = os.fstat(src_fd).st_size
    if length < size:
        # A step cut short by a crash leaves a partial chunk: its bytes are
        # still in the destination (punched only after a synced step), so
        # start again from the chunk boundary.
        length = length // digest_chunk * digest_chunk
    restored = 0
    while length < size:
        end = min(size, (length // step + 1) * step)
        data = fs.pread_exact(dst_fd, end - length, dst_offset + length, dst_path)
        verify_chunks(data, length, digest_chunk, digests,
                      f"rollback of {src_path} from {dst_path}", dst_path)
        fs.pwrite_all(src_fd, data, length)
        fs.calls.fdatasync(src_fd)
        fs.punch_hole(dst_fd, dst_offset + length, end - length)
        restored += end - length
        length = end
    return restored
