"""Where a fetch's downloaded bytes wait, and the journal that lets a fetch resume.

Beside the destination, in ``.trtet-staging/`` (the staging directory that
``trtet_store.recover`` looks in), a fetch keeps:

- one staged file per run (a contiguous interval it downloads), created
  allocated at the run's size and adopted into a :class:`~trtet_store.io.BlobStore`
  at once, with metadata naming the fetch. The blob is what the final
  ``write_files(..., consume=True)`` places (insert, clone or move: its bytes
  are never copied a second time). A fetch that fails gives the file back to
  its own name (``fetch-<id>-<object>-<offset>.run``); one that is killed
  leaves it as an orphan blob, which ``trtet-store recover`` lists with that
  metadata, and the next fetch takes it over;
- ``fetch-<id>.journal``: JSON lines, an :class:`~trtet_store.io.RecordFile`
  (its head replaced atomically and durably, directory fsync included, as
  the publish journal's). The first names the version (the
  manifest's or the object's ETag) and the runs; then each run file's inode,
  recorded before it is adopted (a kill inside ``adopt``, between its rename
  and its sidecar, leaves a blob without metadata: its inode says it is
  ours); then each range written, with its checksum (a range longer than
  a piece: each piece as it is written, then the range's own line after
  its last piece, :mod:`.ranges`). A resumed fetch re-reads and re-checks
  every recorded range or piece before trusting it, so neither a range nor
  its line needs an fsync: a range a crash lost is fetched again;
- ``fetch-<id>.lock``: held (``flock``, taken with :func:`trtet_store.io.lock.try_lock`,
  so only on the file at that path now) while a fetch of this destination runs.

``<id>`` is a digest of the destination's absolute path, so anyone can
compute these names: the directory is opened and checked before anything is
written in it (:func:`trtet_store.io.staging_directory`: a link, another
user's directory, or one writable by group or others is refused), and every
file of ours in it is created under that handle with ``O_EXCL | O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from trtet_store.io import (
    FETCH_LOCK_PREFIX,
    FETCH_LOCK_SUFFIX,
    STAGING_DIR,
    Blob,
    BlobStore,
    ConcurrentWriteError,
    RecordFile,
    SafeDir,
    pwrite_all,
    read_records,
    recover,
    release,
    staging_directory,
    try_lock,
    unlock_file,
)
from trtet_store.remote.download.plan import ObjectPlan, Range, Run

log = logging.getLogger("trtet_store.remote.download.receive")

METADATA_KEY = "trtet_fetch"


#: What a refused staging directory's message tells the user to do (fetch stages beside
#: its destination: there is no other staging directory to pass).
STAGING_TODO = "remove it, or fetch into another directory"


def fetch_id(dest: Path) -> str:
    """The id of a fetch into ``dest``: names its journal, lock and staged files."""
    return hashlib.sha256(os.fsencode(dest.absolute())).hexdigest()[:16]


def fetch_lock_name(fid: str) -> str:
    """The file a fetch of id ``fid`` holds locked while it runs (io.names' pattern)."""
    return f"{FETCH_LOCK_PREFIX}{fid}{FETCH_LOCK_SUFFIX}"


def run_key(run: Run) -> tuple[int, int, int]:
    return (run.obj, run.offset, run.size)


@dataclass
class StagedRun:
    run: Run
    blob: Blob
    fd: int = -1


class Staging:
    """The staged runs and the journal of one fetch; see the module docstring.

    Open it with :meth:`open`; it holds the fetch's lock until :meth:`close`.
    """

    def __init__(self, dest: Path, directory: SafeDir, fid: str, lock_fd: int) -> None:
        self.dest = dest
        self.sdir = directory  # the checked handle every file of ours is made under
        self.directory = directory.path
        self.id = fid
        self.lock_fd = lock_fd
        self.journal_path = self.directory / f"fetch-{fid}.journal"
        self.store: BlobStore | None = None
        self.runs: dict[tuple[int, int, int], StagedRun] = {}
        self.done: dict[tuple[int, int, int], int] = {}  # (obj, offset, size) -> crc
        self.resumed_bytes = 0
        self._journal = RecordFile(self.journal_path, mode=0o644)
        self._mutex = threading.Lock()

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(cls, dest: Path, url: str, version: str, plans: list[ObjectPlan]) -> Staging:
        """Take the fetch's lock, resume what a fetch of ``version`` staged, stage the rest.

        Raises
        ------
        ConcurrentWriteError
            Another fetch into ``dest`` is running.
        UnsafeDirectoryError
            The staging directory is a link, another user's, or writable by
            others: nothing was written in it.
        """
        fid = fetch_id(dest)
        lock_path = dest.parent / STAGING_DIR / fetch_lock_name(fid)
        directory = None
        for attempt in range(3):
            if directory is not None:
                directory.close()
            directory = staging_directory(dest.parent / STAGING_DIR, todo=STAGING_TODO)
            try:
                # The lock on the file that is at the path now (io.lock): the fetch
                # before us unlinks its lock file while it holds it, so a lock
                # taken on the inode we opened earlier would be a second holder.
                lock_fd = try_lock(lock_path, create=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    directory.close()
                    raise
                # The fetch before us removed the (then empty) staging directory
                # between our mkdir and our open: make it again.
            except BaseException:
                directory.close()
                raise
        if lock_fd is None:
            directory.close()
            raise ConcurrentWriteError(errno.EBUSY, f"another fetch into {dest} is running; "
                                       "wait for it to finish", os.fspath(dest))
        self = cls(dest, directory, fid, lock_fd)
        try:
            self.store = BlobStore(self.directory)
            self._resume_or_start(url, version, plans)
        except BaseException:
            self.close()
            raise
        return self

    def _origin(self, run: Run) -> Path:
        return self.directory / f"fetch-{self.id}-{run.obj}-{run.offset}-{run.size}.run"

    def _read_journal(self) -> tuple[dict | None, dict[tuple[int, int, int], int],
                                     dict[tuple[int, int], tuple[int, int, int]]]:
        """``(head, done ranges -> crc, (st_dev, st_ino) -> run key)`` of the journal there."""
        # Every line is checked: a damaged one (a kill mid-append, or lines a
        # power cut zeroed, none of them synced) costs only its range, fetched again.
        records = read_records(self.journal_path, skip_damaged=True)
        if not records or "fetch" not in records[0]:
            return None, {}, {}  # no head (or a damaged one): start over
        head = records[0]
        done, inodes = {}, {}
        for d in records[1:]:
            try:
                if "inode" in d:
                    inodes[tuple(d["inode"])] = tuple(d["run"])
                else:
                    done[(d["obj"], d["offset"], d["size"])] = int(d["crc"])
            except (ValueError, KeyError, TypeError):
                continue  # not a record of ours: that range is fetched again
        return head, done, inodes

    def _ours(self, inodes: dict) -> list[tuple[tuple[int, int, int], object]]:
        """This fetch's orphans, with their run keys: by their metadata, or by their inode.

        A kill inside ``adopt`` (after its rename, before its sidecar) leaves a
        blob without metadata; the journal recorded each run file's inode
        before adopting it, and a rename keeps the inode.
        """
        assert self.store is not None
        out = []
        for o in self.store.orphans():
            meta = o.metadata.get(METADATA_KEY, {})
            if meta.get("id") == self.id:
                out.append((tuple(meta["run"]), o))
                continue
            try:
                st = os.stat(o.path)
            except FileNotFoundError:
                continue
            key = inodes.get((st.st_dev, st.st_ino))
            if key is not None and not o.metadata and st.st_size == key[2]:
                out.append((key, o))
        return out

    def _resume_or_start(self, url: str, version: str, plans: list[ObjectPlan]) -> None:
        assert self.store is not None
        head, done, inodes = self._read_journal()
        wanted = {run_key(r): r for p in plans for r in p.runs}
        same_version = head is not None and head.get("version") == version
        orphans = self._ours(inodes)
        if any(o.pinned for _, o in orphans):
            # A write of ours died holding them: finish or undo it first.
            recover(self.dest.parent)
            orphans = self._ours(inodes)
        stale: list[Blob] = []
        for key, o in orphans:
            blob = self.store.adopt_orphan(o)
            if same_version and key in wanted and key not in self.runs:
                self.runs[key] = StagedRun(wanted[key], blob)
            else:
                stale.append(blob)
        for path in self.directory.glob(f"fetch-{self.id}-*.run"):
            parts = path.name[:-len(".run")].split("-")[2:]
            key = tuple(int(x) for x in parts) if len(parts) == 3 else None
            if same_version and key in wanted and key not in self.runs and \
                    _own_file(self.sdir, path.name):
                self.runs[key] = StagedRun(wanted[key], self._adopt(path, wanted[key], url,
                                                                    version))
            else:
                self.sdir.unlink(path.name)  # a link is removed itself, never followed
        for blob in stale:
            origin = blob.origin
            blob.close()  # gives it back to its origin name: remove that too
            if origin:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(origin)
        if same_version:
            self.done = {k: crc for k, crc in done.items()
                         if any(k[0] == r.obj and r.offset <= k[1] and k[1] + k[2]
                                <= r.offset + r.size for r in
                                (s.run for s in self.runs.values()))}
        kept = [{"run": list(key), "inode": _inode(s.blob.path)} for key, s in self.runs.items()]
        kept += [{"obj": obj, "offset": offset, "size": size, "crc": crc}
                 for (obj, offset, size), crc in self.done.items()]
        self._write_head(url, version, plans, kept)
        for key, run in wanted.items():
            if key not in self.runs:
                path = self._origin(run)
                fd = self.sdir.create_replacing(path.name, os.O_WRONLY, 0o644)
                try:
                    # Allocated now (the preflight counted it): ranges written in
                    # parallel then fill one extent, and XFS reserves nothing more
                    # for delayed allocation (it held 256 MiB more at the peak).
                    if run.size:
                        os.posix_fallocate(fd, 0, run.size)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                self._append({"run": list(key), "inode": [st.st_dev, st.st_ino]})
                self.runs[key] = StagedRun(run, self._adopt(path, run, url, version))
        for staged in self.runs.values():
            staged.run = wanted[run_key(staged.run)]
            staged.fd = os.open(staged.blob.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if self.done:
            log.info("%s: resuming: %d ranges (%d bytes) staged by an earlier fetch", self.dest,
                     len(self.done), sum(k[2] for k in self.done))

    def _adopt(self, path: Path, run: Run, url: str, version: str) -> Blob:
        assert self.store is not None
        return self.store.adopt(path, metadata={METADATA_KEY: {
            "id": self.id, "url": url, "dest": os.fspath(self.dest), "version": version,
            "run": list(run_key(run))}})

    def _write_head(self, url: str, version: str, plans: list[ObjectPlan],
                    lines: list[dict]) -> None:
        head = {"fetch": 1, "url": url, "dest": os.fspath(self.dest), "version": version,
                "objects": [{"name": p.spec.name, "size": p.spec.size, "etag": p.spec.etag}
                            for p in plans],
                "runs": [list(run_key(r)) for p in plans for r in p.runs]}
        # Durable before any run file is made: tmp, fsync, rename, directory fsync.
        self._journal.start([head, *lines])

    # -- while fetching ---------------------------------------------------------

    def write(self, run: Run, rng: Range, data: memoryview) -> None:
        """Write a downloaded range into its run's staged file (every byte, or raise)."""
        fd = self.runs[run_key(run)].fd
        base = rng.offset - run.offset
        pwrite_all(fd, data, base)  # a short count is retried; no progress is ENOSPC
        # Start writing it back now, while the next ranges download, and drop
        # it from the page cache once written (nothing reads it again but a
        # resume). No fdatasync per range: each would commit the filesystem's
        # journal; a range a crash loses fails its digests on resume and is
        # fetched again, and the final write syncs the run before placing it.
        os.posix_fadvise(fd, base, len(data), os.POSIX_FADV_DONTNEED)

    def read(self, run: Run, rng: Range) -> bytes:
        path = self.runs[run_key(run)].blob.path
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return os.pread(fd, rng.size, rng.offset - run.offset)
        finally:
            os.close(fd)

    def record(self, rng: Range, crc: int) -> None:
        """Journal a range as written (one ``O_APPEND`` write: a kill cuts at most this line)."""
        line = {"obj": rng.obj, "offset": rng.offset, "size": rng.size, "crc": crc}
        with self._mutex:
            self.done[(rng.obj, rng.offset, rng.size)] = crc
        self._append(line)

    def forget(self, rng: Range) -> None:
        """A recorded range turned out wrong on re-reading: it is fetched again."""
        with self._mutex:
            self.done.pop((rng.obj, rng.offset, rng.size), None)

    def _append(self, line: dict) -> None:
        # One O_APPEND write; a failed or short one raises OSError naming the
        # journal, so that the caller can say which file the disk failed.
        self._journal.append(line)

    # -- the end ------------------------------------------------------------------

    def blobs(self) -> dict[tuple[int, int, int], Blob]:
        """The staged runs as blobs, sealed anew after our own writes, for ``write_files``."""
        out = {}
        for key, staged in self.runs.items():
            if staged.fd >= 0:
                os.close(staged.fd)
                staged.fd = -1
            staged.blob.reseal()
            out[key] = staged.blob
        return out

    def remove(self) -> None:
        """After the write published: the journal goes (the blobs were consumed)."""
        # Not RecordFile.remove: its directory fsync would widen the window
        # between this unlink and close()'s lock removal, and a fetch killed in
        # it leaves lock files that only the next fetch's tidy removes. A
        # journal a power cut brings back only makes the next fetch clean up.
        self._journal.close()
        self.sdir.unlink(self.journal_path.name)

    def discard(self) -> None:
        """Drop every staged byte and the journal (a version that is no longer wanted)."""
        for staged in self.runs.values():
            if staged.fd >= 0:
                os.close(staged.fd)
                staged.fd = -1
            origin = staged.blob.origin
            staged.blob.close()
            if origin:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(origin)
        self.runs.clear()
        self.done.clear()
        self.remove()

    def close(self) -> None:
        """Release the store (unconsumed staged files go back to ``.run`` names) and the lock."""
        for staged in self.runs.values():
            if staged.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(staged.fd)
                staged.fd = -1
        self._journal.close()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.lock_fd >= 0:
            if not self.journal_path.exists():
                # Nothing to resume: leave no trace. Unlinked while held, then
                # released (io.lock's protocol): a fetch that opened the old file
                # meanwhile finds it gone from the path once it gets its lock, and
                # takes the file that is there instead (try_lock), so no two hold.
                unlock_file(self.lock_fd, self.directory / fetch_lock_name(self.id))
            else:
                release(self.lock_fd)
            self.lock_fd = -1
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only when empty
        self.sdir.close()


def _inode(path: os.PathLike | str) -> list[int]:
    st = os.lstat(path)
    return [st.st_dev, st.st_ino]


def _own_file(directory: SafeDir, name: str) -> bool:
    """``name`` is a regular file of ours (a run a fetch of ours left), not a link."""
    try:
        st = directory.lstat(name)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def write_new_file(directory: Path, name: str, data: bytes) -> None:
    """``name`` in the staging ``directory``, created anew (never through a link) with ``data``.

    The directory is checked as :meth:`Staging.open` checks it and is not
    created: a missing one raises FileNotFoundError.
    """
    with staging_directory(directory, create=False, todo=STAGING_TODO) as d:
        fd = d.create_replacing(name, os.O_WRONLY, 0o600)
        try:
            pwrite_all(fd, data, 0)
        finally:
            os.close(fd)
