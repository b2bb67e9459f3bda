"""Owned blob files: a staging directory whose files are released with their owner.

A :class:`BlobStore` owns every file it names ``<token>-<n>.blob`` in its
directory, and holds an exclusive ``flock`` on ``.store-<token>.lock`` for its
lifetime. The kernel drops that lock when the process dies, so the next store
in the directory can tell a live owner from a dead one without trusting PIDs,
and keeps the dead owner's blobs as *orphans*: a staged blob may be hours of
TensorRT build, so it is never deleted behind the user's back. They are
listed (:meth:`BlobStore.orphans`, and by ``recover``), taken over without a
copy (:meth:`BlobStore.adopt_orphan`), and removed only by an explicit call
(:meth:`BlobStore.remove_orphans`) or an age the user sets
(``BlobStore(..., orphan_max_age=...)``).

Each blob has a sidecar ``<token>-<n>.blob.meta`` (JSON): its size, its
identity (device, inode, size, mtime, ctime as sealed), its digests, who
staged it and when, where an adopted file came from, and a small user
``metadata`` dict (e.g. a build fingerprint). It is what makes an orphan
recognisable and adoptable without reading it.

Every release runs only in the process that created the store or blob: a
forked child that exits never deletes its parent's files or lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from trtet_store.io import fs, names, pagecache
from trtet_store.io.errors import BlobChangedError
from trtet_store.io.names import BLOB_PART_SUFFIX, BLOB_SUFFIX, META_SUFFIX, PART_SUFFIX
from trtet_store.io.units import MiB, format_mib

log = logging.getLogger("trtet_store.blobstore")

DEFAULT_CHUNK_SIZE = MiB
META_VERSION = 1

# Every live blob of every store in this process, by (st_dev, st_ino), so a
# write can refuse a destination that is some blob's file (or a link to it).
_LIVE: weakref.WeakValueDictionary[tuple[int, int], Blob] = weakref.WeakValueDictionary()
_LIVE_MUTEX = threading.Lock()


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The identity a blob is sealed with: device, inode, size, mtime_ns, ctime_ns.

    Any write, truncate, ``touch`` or replacement of the file changes one of
    them, and comparing them costs one ``stat``, whatever the file's size.
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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


def _release_file(owner_pid: int, path: str, state: dict) -> None:
    """Finalizer of a :class:`Blob`: delete its file, or give an adopted file back.

    Runs only in the process that created the blob: a forked child shares
    the files but not their ownership (invariant 7), so its exit, its GC and
    its ``close()`` leave them alone.
    """
    if os.getpid() != owner_pid:
        return
    origin = state.get("give_back")
    if origin and os.path.exists(path):  # gone: placed by an insert or a move
        try:
            # link, not rename: never replace a file the user put there since
            os.link(path, origin)
        except OSError as exc:
            # e.g. its directory is gone, or the name is taken: keep the bytes
            log.warning("could not give the adopted file %s back to %s (%s); it stays in the "
                        "store directory as an orphan (BlobStore.orphans)", path, origin, exc)
            return
        else:
            log.info("gave the adopted file %s back to %s", path, origin)
    _unlink_quietly(path)
    _unlink_quietly(names.meta_path_of(path))


class Blob:
    """A file owned by a :class:`BlobStore`, with its size, identity and content digests.

    The file is deleted when the blob is released: :meth:`close`, leaving a
    ``with`` block, garbage collection, or interpreter exit, whichever is first
    (in the process that created it; never in a forked child). An adopted file
    that no write consumed is given back to the path it was adopted from
    instead (if that name is free again; otherwise it stays in the store as an
    orphan).

    Attributes
    ----------
    path : pathlib.Path
        Where the bytes are.
    size : int
        Length in bytes, recorded when the blob was sealed.
    identity : tuple of int
        ``(st_dev, st_ino, size, st_mtime_ns, st_ctime_ns)`` when sealed; a
        zero-copy placement checks it before and after placing.
    digest : str
        xxh3-128 of the content, hex (computed on first use for an adopted file).
    chunk_size : int
        The span each entry of ``chunk_digests`` covers (the last may be short).
    chunk_digests : tuple[int, ...]
        xxh3-64 of each chunk, recorded as the bytes went in (for an adopted
        file: on first use, by a placement that reads the bytes anyway); a
        placement verifies the payload against them.
    metadata : dict
        The user's metadata recorded with the blob (see :meth:`BlobStore.put`).
    origin : str or None
        For a file adopted by rename: where it came from (it goes back there
        unless a write consumes it).
    """

    def __init__(
        self,
        store: BlobStore,
        path: Path,
        size: int,
        digest: str | None,
        chunk_size: int,
        chunk_digests: tuple[int, ...] | None,
        identity: tuple[int, ...] | None = None,
        origin: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.path = path
        self.size = size
        self._digest = digest
        self.chunk_size = chunk_size
        self._chunk_digests = chunk_digests
        self.identity = identity if identity is not None else file_identity(os.stat(path))
        self.origin = origin
        self.metadata = dict(metadata or {})
        self._state = {"give_back": origin}
        self._consumed = False
        self._finalizer = weakref.finalize(self, _release_file, os.getpid(), os.fspath(path),
                                           self._state)

    @property
    def consumed(self) -> bool:
        """Whether a published write took this blob's bytes (they belong to an output now)."""
        return self._consumed

    @consumed.setter
    def consumed(self, value: bool) -> None:
        self._consumed = value
        if value:
            # What is left of the file (an emptied move source) is not the
            # user's file any more: never give it back under their name.
            self._state["give_back"] = None

    @property
    def digest(self) -> str:
        """xxh3-128 of the content (an adopted file is read once, on first use)."""
        if self._digest is None:
            self.ensure_digests()
        return self._digest

    @property
    def chunk_digests(self) -> tuple[int, ...]:
        """Per-chunk xxh3-64 digests (an adopted file is read once, on first use)."""
        if self._chunk_digests is None:
            self.ensure_digests()
        return self._chunk_digests

    @property
    def has_digests(self) -> bool:
        """Whether the digests are known without reading the file."""
        return self._chunk_digests is not None

    def check_identity(self, st: os.stat_result | None = None, *, ctime: bool = True) -> None:
        """Raise :class:`BlobChangedError` unless the file is still the one sealed.

        ``ctime=False`` skips the change time, for a check right after our own
        rename of the file (a rename updates it).
        """
        if st is None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                raise BlobChangedError(self.path, "the file is gone") from None
        now = file_identity(st)
        n = 5 if ctime else 4
        if now[:n] != tuple(self.identity[:n]):
            names = ("device", "inode", "size", "mtime", "ctime")
            what = ", ".join(f"{k} {a} -> {b}" for k, a, b in zip(names, self.identity, now,
                                                                  strict=True)
                             if a != b)
            raise BlobChangedError(self.path, what)

    def identity_matches(self) -> bool:
        """Whether the file is still the one sealed (see :meth:`check_identity`)."""
        try:
            self.check_identity()
        except BlobChangedError:
            return False
        return True

    def reseal(self) -> None:
        """Record the file's identity again, after a rollback of our own put it back."""
        self.identity = file_identity(os.stat(self.path))

    def ensure_digests(self) -> None:
        """Read the file once to compute its digests, checking it is still as sealed."""
        if self._chunk_digests is not None:
            return
        self.check_identity()
        digest, chunks, size = _digest_file(self.path, self.chunk_size, self.store.drop_behind)
        self.check_identity()
        if size != self.size:
            raise BlobChangedError(self.path, f"read {size} bytes, sealed {self.size}")
        self._digest, self._chunk_digests = digest, chunks
        with contextlib.suppress(OSError):
            self.store._write_meta(self)

    @property
    def closed(self) -> bool:
        """Whether the blob was released (its file is gone)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the blob: delete its file (give an adopted one back). Idempotent."""
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


def live_blob(st: os.stat_result) -> Blob | None:
    """The live blob (of any store in this process) whose file is ``st``'s inode, if any."""
    with _LIVE_MUTEX:
        blob = _LIVE.get((st.st_dev, st.st_ino))
    # A consumed blob's file (an insert's host) is an output now, not a blob.
    return blob if blob is not None and not blob.closed and not blob.consumed else None


@dataclass(frozen=True)
class Orphan:
    """A staged blob whose store died (its process exited or crashed) without releasing it.

    Attributes
    ----------
    path : pathlib.Path
        The blob file.
    size : int
        Its length now.
    age : float
        Seconds since it was last modified.
    created : float or None
        When it was sealed (Unix time), from its sidecar.
    pid, host : int or None, str or None
        The process (and machine) that staged it, from its sidecar.
    origin : str or None
        Where an adopted file came from.
    metadata : dict
        The user's metadata recorded with it (e.g. a build fingerprint).
    pinned : bool
        A write journal still needs it: run ``recover`` on that write's output
        directory first; until then it can be neither adopted nor removed.
    sealed_identity : tuple or None
        Its identity when sealed; when it still matches, its recorded digests
        are trusted on adoption.
    """

    path: Path
    size: int
    age: float
    created: float | None = None
    pid: int | None = None
    host: str | None = None
    origin: str | None = None
    metadata: dict = field(default_factory=dict)
    pinned: bool = False
    sealed_identity: tuple | None = None


class BlobWriter:
    """Streams bytes into a new blob; see :meth:`BlobStore.writer`."""

    def __init__(self, store: BlobStore, final: Path,
                 metadata: Mapping[str, Any] | None = None) -> None:
        self._store = store
        self._final = final
        self._metadata = metadata
        self._part = names.part_path_of(final)
        # Through fs.calls, like every call of the engine, so fault tests reach it.
        self._fd = fs.calls.open(os.fspath(self._part),
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
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
        fd, self._fd = self._fd, -1
        fs.calls.close(fd)
        fs.calls.rename(os.fspath(self._part), os.fspath(self._final))
        digest, chunks = self._digester.finish()
        # Identity after the rename: a rename updates the inode's ctime.
        self.blob = self._store._register(
            self._final, self._digester.size, digest, self._store.chunk_size, chunks,
            metadata=self._metadata)
        return self.blob

    def _abandon(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                fs.calls.close(fd)
        _unlink_quietly(os.fspath(self._part))


def default_directory() -> Path:
    """The default store directory: ``<tmp>/trtet-store-<uid>``, private to this user."""
    return Path(tempfile.gettempdir(), f"trtet-store-{os.getuid()}")


def _private_directory(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check that it is this user's own private directory.

    The default store sits in a shared temporary directory: anyone could
    create the name first (and then read, replace or delete the engines
    staged there), so a directory that is a symlink, not ours, or writable
    by others is refused rather than used.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "it is not a directory (a symlink?)"
    elif st.st_uid != os.getuid():
        problem = f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"it is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise PermissionError(errno.EACCES, f"refusing the default blob store {path}: {problem}; "
                              "remove it, or pass a directory (or set TRTET_STORE_DIR)",
                              os.fspath(path))
    return path


class BlobStore:
    """A staging directory of owned files, for payloads too large for memory.

    Parameters
    ----------
    directory : path-like, optional
        Where blobs live. Put it on the output's filesystem when you can: that
        is what lets a write move a blob instead of copying it. Defaults to
        ``$TRTET_STORE_DIR`` or ``<tmp>/trtet-store-<uid>``, a directory private
        to the user (created with mode 0700; one owned by someone else,
        writable by others or a symlink is refused). Created if missing.
    chunk_size : int
        The span of each per-chunk digest. A move places a blob in multiples
        of it, so it bounds how finely a crash can interrupt a move.
    drop_behind : bool
        Write blobs back and drop them from the page cache while they are
        written, and drop adopted files' cached pages (see
        :mod:`trtet_store.io.pagecache`). On by default: a staged engine is
        only placed, never read again, and a cached one makes ext4's insert
        placement cost time in proportion to its size. Turn it off to read
        blobs back right after writing them.
    orphan_max_age : float, optional
        Seconds. When given, orphans (blobs of dead stores, see below) last
        modified longer ago than this are removed when the store opens.
        Default: orphans are kept until :meth:`remove_orphans` is called.

    Notes
    -----
    **Orphans.** A store that dies without releasing its blobs (its process
    crashed or was killed) leaves them in the directory. They are kept: a
    staged TensorRT engine can be hours of build. :meth:`orphans` lists them
    with their size, age, who staged them and the ``metadata`` recorded with
    them; :meth:`adopt_orphan` takes one over (a rename, no copy);
    :meth:`remove_orphans` removes them (all, or those older than an age).
    ``trtet_store.recover`` and ``trtet-store recover DIR`` report them too.
    A blob a dead write's journal still needs is *pinned*: recover that
    write first.

    **Metadata.** ``writer(metadata=...)``, ``put(..., metadata=...)`` and
    ``adopt(..., metadata=...)`` record a small JSON-serializable dict with
    the blob (e.g. a fingerprint of the exported graph, the build settings
    and the TensorRT version). It is in :attr:`Blob.metadata` and in the
    orphan listing, so a re-run after a crash can find the engines it would
    otherwise build again.

    Examples
    --------
    >>> with BlobStore("/data/staging") as store:          # doctest: +SKIP
    ...     with store.writer(metadata={"fingerprint": fp}) as w:
    ...         for part in engine_parts:
    ...             w.write(part)
    ...     blob = w.blob
    >>> with BlobStore("/data/staging") as store:          # doctest: +SKIP
    ...     reuse = [o for o in store.orphans() if o.metadata.get("fingerprint") == fp]
    ...     blob = store.adopt_orphan(reuse[0]) if reuse else build()
    """

    def __init__(self, directory: os.PathLike | str | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, drop_behind: bool = True,
                 orphan_max_age: float | None = None) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if directory is None and os.environ.get("TRTET_STORE_DIR"):
            directory = os.environ["TRTET_STORE_DIR"]
        if directory is None:
            self.directory = _private_directory(default_directory())
        else:
            self.directory = Path(directory).absolute()
            self.directory.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.drop_behind = drop_behind
        self.token = uuid.uuid4().hex[:16]
        self._seq = 0
        self._mutex = threading.Lock()
        self._blobs: weakref.WeakValueDictionary[str, Blob] = weakref.WeakValueDictionary()
        lock_path = names.store_lock_path(self.directory, self.token)
        lock_fd = _lock_own_file(lock_path)
        self._finalizer = weakref.finalize(self, _release_store, os.getpid(), lock_fd,
                                           os.fspath(lock_path))
        self.collected = collect_stale(self.directory)
        if orphan_max_age is not None:
            self.collected += self.remove_orphans(older_than=orphan_max_age)
        kept = self.orphans()
        if kept:
            pinned = sum(o.pinned for o in kept)
            log.warning("%s holds %d staged blob(s) of dead stores (%s), kept: list them "
                        "with BlobStore.orphans(), take one over with adopt_orphan(), remove "
                        "them with remove_orphans()%s", self.directory, len(kept),
                        format_mib(sum(o.size for o in kept)),
                        f"; {pinned} of them an interrupted write still needs: run "
                        "`trtet-store recover` on its output directory" if pinned else "")

    # -- creating blobs -------------------------------------------------------

    def _next_path(self) -> Path:
        with self._mutex:
            self._seq += 1
            return names.blob_path(self.directory, self.token, self._seq)

    def _register(self, path: Path, size: int, digest: str | None, chunk_size: int,
                  chunks: tuple[int, ...] | None, *, origin: str | None = None,
                  metadata: Mapping[str, Any] | None = None,
                  identity: tuple[int, ...] | None = None) -> Blob:
        blob = Blob(self, path, size, digest, chunk_size, chunks, identity=identity,
                    origin=origin, metadata=metadata)
        self._blobs[os.fspath(path)] = blob
        with _LIVE_MUTEX:
            _LIVE[tuple(blob.identity[:2])] = blob
        self._write_meta(blob)
        return blob

    def _write_meta(self, blob: Blob) -> None:
        """Write the blob's sidecar (replaced whole by a rename, so never torn)."""
        record = {
            "version": META_VERSION, "size": blob.size, "identity": list(blob.identity),
            "created": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
            "origin": blob.origin, "metadata": blob.metadata, "chunk_size": blob.chunk_size,
            "digest": blob._digest,
            "chunk_digests": list(blob._chunk_digests) if blob._chunk_digests is not None
            else None,
        }
        meta = names.meta_path_of(blob.path)
        part = meta + PART_SUFFIX
        try:
            text = json.dumps(record, separators=(",", ":"))
        except TypeError as exc:
            raise TypeError(f"blob metadata must be JSON-serializable: {exc}") from None
        fd = fs.calls.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            try:
                fs.pwrite_all(fd, text.encode(), 0)
            finally:
                fs.calls.close(fd)
            fs.calls.rename(part, meta)
        except BaseException:
            _unlink_quietly(part)
            raise

    @contextlib.contextmanager
    def writer(self, *, metadata: Mapping[str, Any] | None = None) -> Iterator[BlobWriter]:
        """Stream bytes into a new blob.

        The blob exists, as ``writer.blob``, once the block exits cleanly; an
        exception inside the block leaves no file behind. ``metadata`` (a
        small JSON-serializable dict) is recorded with it in its sidecar.
        """
        self._check_open()
        w = BlobWriter(self, self._next_path(), metadata)
        try:
            yield w
        except BaseException:
            w._abandon()
            raise
        try:
            w._seal()
        except BaseException:
            w._abandon()
            if w.blob is not None:
                w.blob.close()
            _unlink_quietly(os.fspath(w._final))
            _unlink_quietly(names.meta_path_of(w._final))
            raise

    def put(self, data: bytes | bytearray | memoryview, *,
            metadata: Mapping[str, Any] | None = None) -> Blob:
        """Store ``data`` as a new blob, with optional ``metadata`` (see :meth:`writer`)."""
        with self.writer(metadata=metadata) as w:
            w.write(data)
        assert w.blob is not None
        return w.blob

    def adopt(self, path: os.PathLike | str, *,
              metadata: Mapping[str, Any] | None = None) -> Blob:
        """Take ownership of an existing regular file, without reading it.

        On the store's filesystem the file is renamed into the store (O(1),
        the original name disappears) and its identity (device, inode, size,
        mtime, ctime) is recorded at once; its digests are computed only if a
        placement reads the bytes anyway (move, copy). Zero-copy placements
        (clone, insert) check the identity instead, before and after placing.
        Elsewhere it is copied in (and digested on the way) and the original
        is left alone.

        If no write consumes the blob, releasing it gives the file back to
        ``path`` (when that name is still free; otherwise it stays in the
        store directory, listed by :meth:`orphans`). A write that fails and
        rolls back therefore never costs the adopted file.
        """
        self._check_open()
        src = Path(path).absolute()
        st = os.stat(src)
        if not fs.is_regular(st):
            raise ValueError(f"cannot adopt {src}: not a regular file")
        if live_blob(st) is not None:
            raise ValueError(f"cannot adopt {src}: it is already a live blob's file")
        dest = self._next_path()
        try:
            fs.calls.rename(os.fspath(src), os.fspath(dest))
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            log.info("adopt %s: other filesystem than %s, copying", src, self.directory)
            return self._copy_in(src, metadata)
        try:
            if self.drop_behind:
                # Drops only what is cached (no read): ext4's insert would
                # otherwise drop the host's cached pages itself, in its time.
                fd = fs.calls.open(os.fspath(dest), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    pagecache.drop(fd, 0, 0)
                finally:
                    fs.calls.close(fd)
            return self._register(dest, st.st_size, None, self.chunk_size, None,
                                  origin=os.fspath(src), metadata=metadata)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(dest, src)
            _unlink_quietly(names.meta_path_of(dest))
            raise

    def _copy_in(self, src: Path, metadata: Mapping[str, Any] | None) -> Blob:
        with self.writer(metadata=metadata) as w, open(src, "rb") as f:
            while chunk := f.read(self.chunk_size):
                w.write(chunk)
        assert w.blob is not None
        return w.blob

    # -- orphans --------------------------------------------------------------

    def orphans(self) -> list[Orphan]:
        """Staged blobs of dead stores in this directory, oldest first (see the class notes)."""
        return list_orphans(self.directory)

    def adopt_orphan(self, orphan: Orphan | os.PathLike | str) -> Blob:
        """Take over an orphan: rename it into this store (no copy, no read).

        Its recorded digests and metadata come with it when its identity
        still matches the sidecar (otherwise the digests are computed when a
        placement reads it). A pinned orphan is refused: recover the
        interrupted write that needs it first.
        """
        self._check_open()
        path = Path(orphan.path if isinstance(orphan, Orphan) else orphan).absolute()
        current = {o.path: o for o in self.orphans()}
        o = current.get(path)
        if o is None:
            raise ValueError(f"{path} is not an orphan of {self.directory} (its store is alive, "
                             "it was taken over already, or it is not a blob there)")
        if o.pinned:
            raise ValueError(f"{path} is still needed by an interrupted write; run "
                             "`trtet-store recover` on that write's output directory first")
        st = os.stat(path)
        meta = _read_meta(path)
        digest = chunks = None
        chunk_size = self.chunk_size
        sealed = meta.get("identity")
        # Trust recorded digests only for the very file they were taken of,
        # unchanged since (ctime excluded: the store's own rename updated it).
        if sealed and tuple(sealed[:4]) == file_identity(st)[:4] and meta.get("chunk_digests"):
            digest, chunks = meta.get("digest"), tuple(meta["chunk_digests"])
            chunk_size = meta.get("chunk_size", chunk_size)
        dest = self._next_path()
        fs.calls.rename(os.fspath(path), os.fspath(dest))
        _unlink_quietly(names.meta_path_of(path))
        blob = self._register(dest, st.st_size, digest, chunk_size, chunks,
                              origin=meta.get("origin"), metadata=meta.get("metadata"))
        log.info("took over orphan %s as %s", path, dest)
        return blob

    def remove_orphans(self, older_than: float | None = None) -> list[Path]:
        """Delete orphans (not pinned ones) last modified more than ``older_than`` seconds ago.

        Parameters
        ----------
        older_than : float, optional
            Seconds; default: every orphan.

        Returns
        -------
        list of pathlib.Path
            The blob files deleted.
        """
        removed = []
        for o in self.orphans():
            if o.pinned or (older_than is not None and o.age < older_than):
                continue
            _unlink_quietly(os.fspath(o.path))
            _unlink_quietly(names.meta_path_of(o.path))
            removed.append(o.path)
        if removed:
            log.warning("removed %d orphaned blob(s) from %s", len(removed), self.directory)
        return removed

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
        """Release every blob the store still owns, then the store itself.

        In a forked child this releases nothing: the files belong to the parent.
        """
        for blob in list(self._blobs.values()):
            blob.close()
        self._finalizer()

    def __enter__(self) -> BlobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlobStore({os.fspath(self.directory)!r}, blobs={len(self.blobs())})"


def _lock_own_file(lock_path: Path) -> int:
    """Create and lock the store's lock file; retake it if a collector unlinked it meanwhile.

    Between our create and our ``flock`` another store's ``collect_stale`` may
    find the file unlocked, take it for a dead store's and unlink it: a lock on
    that deleted inode would leave our live blobs looking orphaned.
    """
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if fs.same_file(os.fstat(fd), os.stat(lock_path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _release_store(owner_pid: int, lock_fd: int, lock_path: str) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child: the lock (shared with the parent) stays the parent's
    _unlink_quietly(lock_path)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


def _digest_file(path: Path, chunk_size: int,
                 drop_cached: bool) -> tuple[str, tuple[int, ...], int]:
    d = Digester(chunk_size)
    fd = fs.calls.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        step = max(chunk_size, 8 * MiB) // chunk_size * chunk_size
        pos = 0
        while chunk := fs.calls.pread(fd, step, pos):
            d.update(chunk)
            pos += len(chunk)
        if drop_cached:
            pagecache.drop(fd, 0, 0)
    finally:
        fs.calls.close(fd)
    digest, chunks = d.finish()
    return digest, chunks, d.size


def _read_meta(blob_path: Path) -> dict:
    """A blob's sidecar record, or {} when it is missing or unreadable."""
    try:
        raw = json.loads(Path(names.meta_path_of(blob_path)).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def pinned_paths(directory: Path) -> set[str]:
    """Files in ``directory`` that a live write journal still names.

    A transaction leaves a pin (a symlink to its journal) in each source
    directory; the journal lists the sources. A pin whose journal is gone is
    itself stale.
    """
    from trtet_store.io import journal  # journal imports fs only; no cycle at import time

    pinned: set[str] = set()
    for pin in directory.glob(names.pin_glob()):
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


class _Liveness:
    """Which store tokens in a directory are alive (their lock is held), asked once each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._known: dict[str, bool] = {}

    def alive(self, token: str) -> bool:
        if token not in self._known:
            self._known[token] = _token_alive(self.directory, token)
        return self._known[token]


def _token_alive(directory: Path, token: str) -> bool:
    lock_path = names.store_lock_path(directory, token)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def list_orphans(directory: os.PathLike | str) -> list[Orphan]:
    """Blobs in ``directory`` whose store is dead, oldest first; nothing is changed.

    A store is dead when its lock file can be locked (or is gone): the kernel
    released the owner's ``flock`` when the owner exited, however it exited.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    live = _Liveness(directory)
    pinned: set[str] | None = None
    now = time.time()
    found = []
    for path in directory.glob(f"*{BLOB_SUFFIX}"):
        token = names.blob_token(path.name)
        if token is None or live.alive(token):
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # taken over or removed meanwhile
        if pinned is None:
            pinned = pinned_paths(directory)
        meta = _read_meta(path)
        found.append(Orphan(
            path=path.absolute(), size=st.st_size, age=max(0.0, now - st.st_mtime),
            created=meta.get("created"), pid=meta.get("pid"), host=meta.get("host"),
            origin=meta.get("origin"), metadata=meta.get("metadata") or {},
            pinned=os.fspath(path) in pinned or os.fspath(path.absolute()) in pinned,
            sealed_identity=tuple(meta["identity"]) if meta.get("identity") else None))
    return sorted(found, key=lambda o: -o.age)


def describe_orphan(o: Orphan) -> str:
    """One line about an orphan, for logs and ``trtet-store recover``."""
    parts = [f"{o.size} bytes", f"age {_age(o.age)}"]
    if o.pid is not None:
        parts.append(f"staged by pid {o.pid}" + (f" on {o.host}" if o.host else ""))
    if o.origin:
        parts.append(f"adopted from {o.origin}")
    if o.metadata:
        parts.append("metadata " + json.dumps(o.metadata, sort_keys=True))
    if o.pinned:
        parts.append("pinned by an interrupted write (recover it first)")
    return "; ".join(parts)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def collect_stale(directory: Path) -> list[Path]:
    """Tidy up after dead stores in ``directory``; their blobs are kept (orphans).

    Removes what no one can use: half-written blobs (``.blob.part``) and
    sidecars whose blob is gone, of dead stores only; and the dead stores'
    lock files. A store is dead when its lock file can be locked.

    Returns
    -------
    list of pathlib.Path
        The files deleted (never a sealed blob).
    """
    removed: list[Path] = []
    live = _Liveness(directory)
    pinned: set[str] | None = None
    for f in list(directory.iterdir()):
        token = names.blob_token(f.name)
        if token is None or live.alive(token):
            continue
        name = f.name
        if name.endswith(BLOB_SUFFIX + META_SUFFIX):
            blob = f.with_name(name[: -len(META_SUFFIX)])
            if pinned is None:
                pinned = pinned_paths(directory)
            # A blob an interrupted write renamed away (an insert's host)
            # comes back when it is undone: its sidecar must be there then.
            if blob.exists() or os.fspath(blob) in pinned:
                continue
        elif not (name.endswith(BLOB_PART_SUFFIX) or name.endswith(META_SUFFIX + PART_SUFFIX)):
            continue
        _unlink_quietly(os.fspath(f))
        removed.append(f)
    for lock_path in directory.glob(names.store_lock_glob()):
        token = names.store_lock_token(lock_path.name)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Unlinked while we hold it, so no one is left holding a lock on
            # a deleted file; a dead token stays dead without its lock file.
            if fs.same_file(os.fstat(fd), os.stat(lock_path)):
                os.unlink(lock_path)
        except (BlockingIOError, FileNotFoundError):
            pass  # owner alive, or removed meanwhile
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d unfinished file(s) of dead stores in %s", len(removed), directory)
    return removed
