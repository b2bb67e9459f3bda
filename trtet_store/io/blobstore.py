"""Owned blob files: a staging directory whose files are released with their owner.

A :class:`BlobStore` owns every file it names ``<token>-<n>.blob`` in its
directory, and holds an exclusive ``flock`` on ``.store-<token>.lock`` for its
lifetime. The kernel drops that lock when the process dies, so the next store
in the directory can tell a live owner from a dead one without trusting PIDs,
and collects the dead owner's files unless a write journal still pins them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import tempfile
import threading
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import xxhash

from trtet_store.io import fs, pagecache

log = logging.getLogger("trtet_store.blobstore")

DEFAULT_CHUNK_SIZE = 1 << 20
BLOB_SUFFIX = ".blob"
PART_SUFFIX = ".blob.part"
LOCK_PREFIX = ".store-"
LOCK_SUFFIX = ".lock"
PIN_PREFIX = ".trtet-pin-"


class Digester:
    """xxh3-128 of a whole stream plus xxh3-64 of each ``chunk_size`` chunk of it."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.total = xxhash.xxh3_128()
        self.chunks: list[int] = []
        self._chunk = xxhash.xxh3_64()
        self._fill = 0
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.total.update(view)
        self.size += len(view)
        while len(view):
            take = min(len(view), self.chunk_size - self._fill)
            self._chunk.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == self.chunk_size:
                self.chunks.append(self._chunk.intdigest())
                self._chunk = xxhash.xxh3_64()
                self._fill = 0

    def finish(self) -> tuple[str, tuple[int, ...]]:
        if self._fill:
            self.chunks.append(self._chunk.intdigest())
            self._fill = 0
        return self.total.hexdigest(), tuple(self.chunks)


def chunk_digest(data: bytes | memoryview) -> int:
    """The per-chunk digest recorded in :attr:`Blob.chunk_digests`."""
    return xxhash.xxh3_64_intdigest(data)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class Blob:
    """A file owned by a :class:`BlobStore`, with its size and content digests.

    The file is deleted when the blob is released: :meth:`close`, leaving a
    ``with`` block, garbage collection, or interpreter exit, whichever is first.

    Attributes
    ----------
    path : pathlib.Path
        Where the bytes are.
    size : int
        Length in bytes, recorded when the blob was sealed.
    digest : str
        xxh3-128 of the content, hex.
    chunk_size : int
        The span each entry of ``chunk_digests`` covers (the last may be short).
    chunk_digests : tuple[int, ...]
        xxh3-64 of each chunk, recorded as the bytes went in; a placement
        verifies the payload against them.
    """

    def __init__(
        self,
        store: BlobStore,
        path: Path,
        size: int,
        digest: str,
        chunk_size: int,
        chunk_digests: tuple[int, ...],
    ) -> None:
        self.store = store
        self.path = path
        self.size = size
        self.digest = digest
        self.chunk_size = chunk_size
        self.chunk_digests = chunk_digests
        self.consumed = False
        self._finalizer = weakref.finalize(self, _unlink_quietly, os.fspath(path))

    @property
    def closed(self) -> bool:
        """Whether the blob was released (its file is gone)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the blob: delete its file. Idempotent."""
        self._finalizer()

    def mark_consumed(self) -> None:
        """Record that a write moved this blob's bytes into an output, and release it."""
        self.consumed = True
        self.close()

    def __enter__(self) -> Blob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        state = " consumed" if self.consumed else " closed" if self.closed else ""
        return f"Blob({os.fspath(self.path)!r}, size={self.size}{state})"


class BlobWriter:
    """Streams bytes into a new blob; see :meth:`BlobStore.writer`."""

    def __init__(self, store: BlobStore, final: Path) -> None:
        self._store = store
        self._final = final
        self._part = final.with_name(final.name[: -len(BLOB_SUFFIX)] + PART_SUFFIX)
        self._fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._digester = Digester(store.chunk_size)
        self._behind = pagecache.DropBehind(self._fd) if store.drop_behind else None
        self.blob: Blob | None = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; every byte is written or an error is raised."""
        offset = self._digester.size
        fs.pwrite_all(self._fd, data, offset)
        self._digester.update(data)
        if self._behind is not None:
            self._behind.advance(self._digester.size)
        return len(data)

    def _seal(self) -> Blob:
        if self._behind is not None:
            self._behind.finish(self._digester.size)
        os.close(self._fd)
        self._fd = -1
        os.rename(self._part, self._final)
        digest, chunks = self._digester.finish()
        self.blob = self._store._register(
            self._final, self._digester.size, digest, self._store.chunk_size, chunks
        )
        return self.blob

    def _abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        _unlink_quietly(os.fspath(self._part))


class BlobStore:
    """A staging directory of owned files, for payloads too large for memory.

    Parameters
    ----------
    directory : path-like, optional
        Where blobs live. Put it on the output's filesystem when you can: that
        is what lets a write move a blob instead of copying it. Defaults to
        ``$TRTET_STORE_DIR`` or ``<tmp>/trtet-store``. Created if missing.
    chunk_size : int
        The span of each per-chunk digest. A move places a blob in multiples
        of it, so it bounds how finely a crash can interrupt a move.
    drop_behind : bool
        Write blobs back and drop them from the page cache while they are
        written, and drop adopted files once digested (see
        :mod:`trtet_store.io.pagecache`). On by default: a staged engine is
        only placed, never read again, and a cached one makes ext4's insert
        placement cost time in proportion to its size. Turn it off to read
        blobs back right after writing them.

    Examples
    --------
    >>> with BlobStore("/data/staging") as store:          # doctest: +SKIP
    ...     with store.writer() as w:
    ...         for part in engine_parts:
    ...             w.write(part)
    ...     blob = w.blob
    """

    def __init__(self, directory: os.PathLike | str | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, drop_behind: bool = True) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if directory is None:
            directory = os.environ.get("TRTET_STORE_DIR") or Path(tempfile.gettempdir(),
                                                                   "trtet-store")
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.drop_behind = drop_behind
        self.token = uuid.uuid4().hex[:16]
        self._seq = 0
        self._mutex = threading.Lock()
        self._blobs: weakref.WeakValueDictionary[str, Blob] = weakref.WeakValueDictionary()
        lock_path = self.directory / f"{LOCK_PREFIX}{self.token}{LOCK_SUFFIX}"
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        self._finalizer = weakref.finalize(self, _release_store, lock_fd, os.fspath(lock_path))
        self.collected = collect_stale(self.directory)

    # -- creating blobs -------------------------------------------------------

    def _next_path(self) -> Path:
        with self._mutex:
            self._seq += 1
            return self.directory / f"{self.token}-{self._seq}{BLOB_SUFFIX}"

    def _register(self, path: Path, size: int, digest: str, chunk_size: int,
                  chunks: tuple[int, ...]) -> Blob:
        blob = Blob(self, path, size, digest, chunk_size, chunks)
        self._blobs[os.fspath(path)] = blob
        return blob

    @contextlib.contextmanager
    def writer(self) -> Iterator[BlobWriter]:
        """Stream bytes into a new blob.

        The blob exists, as ``writer.blob``, once the block exits cleanly; an
        exception inside the block leaves no file behind.
        """
        self._check_open()
        w = BlobWriter(self, self._next_path())
        try:
            yield w
        except BaseException:
            w._abandon()
            raise
        try:
            w._seal()
        except BaseException:
            w._abandon()
            _unlink_quietly(os.fspath(w._final))
            raise

    def put(self, data: bytes | bytearray | memoryview) -> Blob:
        """Store ``data`` as a new blob."""
        with self.writer() as w:
            w.write(data)
        assert w.blob is not None
        return w.blob

    def adopt(self, path: os.PathLike | str) -> Blob:
        """Take ownership of an existing regular file.

        On the store's filesystem the file is renamed into the store (O(1), the
        original name disappears); elsewhere it is copied and the original is
        left alone. Either way its digests are computed by reading it once.
        """
        self._check_open()
        src = Path(path)
        st = os.stat(src)
        if not fs.is_regular(st):
            raise ValueError(f"cannot adopt {src}: not a regular file")
        dest = self._next_path()
        try:
            os.rename(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            log.info("adopt %s: other filesystem than %s, copying", src, self.directory)
            return self._copy_in(src)
        try:
            digest, chunks, size = _digest_file(dest, self.chunk_size, self.drop_behind)
        except BaseException:
            os.rename(dest, src)
            raise
        return self._register(dest, size, digest, self.chunk_size, chunks)

    def _copy_in(self, src: Path) -> Blob:
        with self.writer() as w, open(src, "rb") as f:
            while chunk := f.read(self.chunk_size):
                w.write(chunk)
        assert w.blob is not None
        return w.blob

    # -- lookup and lifetime --------------------------------------------------

    def find(self, path: os.PathLike | str) -> Blob | None:
        """The live blob of this store whose file is ``path``, if any."""
        return self._blobs.get(os.fspath(Path(path).absolute()))

    def blobs(self) -> list[Blob]:
        """The blobs this store still owns."""
        return [b for b in list(self._blobs.values()) if not b.closed]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("BlobStore is closed")

    def close(self) -> None:
        """Release every blob the store still owns, then the store itself."""
        for blob in list(self._blobs.values()):
            blob.close()
        self._finalizer()

    def __enter__(self) -> BlobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlobStore({os.fspath(self.directory)!r}, blobs={len(self.blobs())})"


def _release_store(lock_fd: int, lock_path: str) -> None:
    _unlink_quietly(lock_path)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


def _digest_file(path: Path, chunk_size: int,
                 drop_cached: bool) -> tuple[str, tuple[int, ...], int]:
    d = Digester(chunk_size)
    with open(path, "rb") as f:
        while chunk := f.read(max(chunk_size, 1 << 20)):
            d.update(chunk)
        if drop_cached:
            pagecache.drop(f.fileno(), 0, 0)
    digest, chunks = d.finish()
    return digest, chunks, d.size


def pinned_paths(directory: Path) -> set[str]:
    """Files in ``directory`` that a live write journal still names.

    A transaction leaves a pin (a symlink to its journal) in each source
    directory; the journal lists the sources. A pin whose journal is gone is
    itself stale.
    """
    from trtet_store.io import journal  # journal imports fs only; no cycle at import time

    pinned: set[str] = set()
    for pin in directory.glob(PIN_PREFIX + "*"):
        target = Path(os.readlink(pin)) if pin.is_symlink() else None
        if target is None or not target.exists():
            _unlink_quietly(os.fspath(pin))
            continue
        try:
            pinned.update(journal.source_paths(target))
        except (OSError, ValueError) as exc:
            # An unreadable journal still pins everything: deleting a file it
            # may need is the one mistake we must not make.
            log.warning("journal %s unreadable (%s); keeping all files in %s", target, exc,
                        directory)
            pinned.update(os.fspath(p) for p in directory.iterdir())
    return pinned


def collect_stale(directory: Path) -> list[Path]:
    """Delete files of dead stores in ``directory``, except those a journal pins.

    A store is dead when its lock file can be locked: the kernel released the
    owner's ``flock`` when the owner exited, however it exited.

    Returns
    -------
    list of pathlib.Path
        The files deleted.
    """
    removed: list[Path] = []
    pinned: set[str] | None = None
    for lock_path in directory.glob(f"{LOCK_PREFIX}*{LOCK_SUFFIX}"):
        token = lock_path.name[len(LOCK_PREFIX): -len(LOCK_SUFFIX)]
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # owner alive
            if pinned is None:
                pinned = pinned_paths(directory)
            kept = []
            for f in directory.glob(f"{token}-*"):
                if os.fspath(f) in pinned:
                    kept.append(f)
                    continue
                _unlink_quietly(os.fspath(f))
                removed.append(f)
            # A file an interrupted write renamed away (an insert's host) comes
            # back here when the write is undone: its owner's lock must still
            # be here then, or nothing would ever collect it.
            prefix = os.fspath(directory / f"{token}-")
            away = [p for p in pinned if p.startswith(prefix) and not os.path.exists(p)]
            if kept or away:
                log.warning("kept %d file(s) of a dead store in %s (and its lock, for %d "
                            "more an interrupted write holds): an interrupted write still "
                            "needs them; run `trtet-store recover` on its output directory",
                            len(kept), directory, len(away))
            else:
                _unlink_quietly(os.fspath(lock_path))
        finally:
            os.close(fd)
    if removed:
        log.info("collected %d stale file(s) of dead stores in %s", len(removed), directory)
    return removed
