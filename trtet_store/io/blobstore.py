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
(``BlobStore(..., orphan_max_age=...)``). Finding them is
:mod:`trtet_store.io.orphans`' job.

Each blob has a sidecar ``<token>-<n>.blob.meta`` (:mod:`trtet_store.io.sidecar`)
recording its size, identity, digests (:mod:`trtet_store.io.digests`), who
staged it and a small user ``metadata`` dict. It is what makes an orphan
recognisable and adoptable without reading it.

Every release runs only in the process that created the store or blob: a
forked child that exits never deletes its parent's files or lock.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtet_store.io import fs, names, pagecache
from trtet_store.io.blob import Blob, live_blob, register_live
from trtet_store.io.digests import DEFAULT_CHUNK_SIZE, Digester, Digests, file_identity
from trtet_store.io.lock import try_lock, unlock_file
from trtet_store.io.orphans import Orphan, collect_stale, list_orphans
from trtet_store.io.safedir import SafeDir
from trtet_store.io.seal import same_identity
from trtet_store.io.sidecar import read_meta, write_meta
from trtet_store.io.units import format_mib

# Blob is defined in trtet_store.io.blob; this is where users import it from.
__all__ = ["Blob", "BlobStore", "BlobWriter", "default_directory"]

log = logging.getLogger("trtet_store.blobstore")


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)



def _close_quietly(fd: int) -> None:
    """A shared blob's finalizer: close its pin (already closed is fine)."""
    with contextlib.suppress(OSError):
        os.close(fd)

class BlobWriter:
    """Streams bytes into a new blob; see :meth:`BlobStore.writer`."""

    def __init__(self, store: BlobStore, final: Path,
                 metadata: Mapping[str, Any] | None = None) -> None:
        self._store = store
        self._final = final
        self._metadata = metadata
        self._part = names.part_path_of(final)
        # Through fs.calls, like every call of the engine, so fault tests reach it.
        self._fd = fs.calls.open(os.fspath(self._part), os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                 | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self._digester = Digester(store.chunk_size)
        self._behind = pagecache.DropBehind(self._fd) if store.drop_behind else None
        self._allocated = 0  # the file is allocated (and sized) up to here
        self.blob: Blob | None = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; every byte is written or an error is raised."""
        offset = self._digester.size
        if offset + len(data) > self._allocated:
            self._allocate(offset + len(data))
        fs.pwrite_all(self._fd, data, offset)
        self._digester.update(data)
        if self._behind is not None:
            self._behind.advance(self._digester.size)
        return len(data)

    def _allocate(self, end: int) -> None:
        """Allocate the file, one window at a time, before the bytes up to ``end`` are written.

        Appending writes let XFS preallocate speculatively past the end of the
        file, up to the file's size again, trimmed only at close: staging 1
        GiB there peaked at 1.8-2 GiB used. Written inside an allocated range,
        nothing is preallocated, so the file never holds more than one window
        beyond its bytes (cut off again when it is sealed). A full disk fails
        here, before the bytes; a window that would not fit is retried as
        exactly the bytes asked for. Where the filesystem cannot allocate,
        the writes allocate as they always did.
        """
        target = max(end, self._allocated + pagecache.WINDOW)
        try:
            fs.allocate(self._fd, self._allocated, target - self._allocated)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or target == end:
                raise
            fs.allocate(self._fd, self._allocated, end - self._allocated)
            target = end
        self._allocated = target

    def _seal(self) -> Blob:
        if self._allocated > self._digester.size:
            # The window allocated past the last byte goes (the size with it).
            fs.calls.ftruncate(self._fd, self._digester.size)
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
    by others is refused rather than used (the one check of io's
    :mod:`~trtet_store.io.safedir`, which staging directories share).
    """
    SafeDir.open(path, create=True, allow_sticky=False, what="default blob store",
                 todo="remove it, or pass a directory (or set TRTET_STORE_DIR)").close()
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
        register_live(blob)
        self._write_meta(blob)
        return blob

    def _write_meta(self, blob: Blob) -> None:
        """Write the blob's sidecar (replaced whole by a rename, so never torn)."""
        write_meta(blob.path, size=blob.size, identity=blob.identity, origin=blob.origin,
                   metadata=blob.metadata, chunk_size=blob.chunk_size, digest=blob._digest,
                   chunk_digests=blob._chunk_digests)

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
              metadata: Mapping[str, Any] | None = None, give_back: bool = True,
              digests: Digests | None = None) -> Blob:
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
        rolls back therefore never costs the adopted file. ``give_back=False``:
        the file is the store's from now on (a scratch file the caller made
        for it), deleted when the blob is released, like a written blob.

        ``digests``: the file's :class:`~trtet_store.io.Digests`, known to the
        caller without reading it (a clone of a file whose identity still
        matched its seal): recorded as the blob's, so neither a placement nor
        :attr:`Blob.digest` reads the file for them. Refused (ValueError)
        when the file's size, or its identity where they name one, is not
        theirs. Chunk digests of another span than the store's
        ``chunk_size`` are not taken (a placement that reads the bytes
        computes its own). Where the file is copied in, the copy's digest
        must be theirs, else ValueError and nothing is adopted.
        """
        self._check_open()
        src = Path(path).absolute()
        st = os.stat(src)
        if not fs.is_regular(st):
            raise ValueError(f"cannot adopt {src}: not a regular file")
        if live_blob(st) is not None:
            raise ValueError(f"cannot adopt {src}: it is already a live blob's file")
        known = _known_digests(digests, st, self.chunk_size, src)
        dest = self._next_path()
        try:
            fs.calls.rename(os.fspath(src), os.fspath(dest))
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            log.info("adopt %s: other filesystem than %s, copying", src, self.directory)
            blob = self._copy_in(src, metadata)
            if known is not None and blob.digest != known[0]:
                blob.close()
                raise ValueError(f"cannot adopt {src}: its bytes digest {blob.digest}, the "
                                 f"caller said {known[0]}; nothing was adopted") from None
            return blob
        try:
            if self.drop_behind:
                # Drops only what is cached (no read): ext4's insert would
                # otherwise drop the host's cached pages itself, in its time.
                fd = fs.calls.open(os.fspath(dest), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    pagecache.drop(fd, 0, 0)
                finally:
                    fs.calls.close(fd)
            digest, chunks = known if known is not None else (None, None)
            return self._register(dest, st.st_size, digest, self.chunk_size, chunks,
                                  origin=os.fspath(src) if give_back else None,
                                  metadata=metadata)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(dest, src)
            _unlink_quietly(names.meta_path_of(dest))
            raise

    def share(self, path: os.PathLike | str, fd: int, *, digest: str, chunk_size: int,
              chunk_digests: tuple[int, ...],
              metadata: Mapping[str, Any] | None = None) -> Blob:
        """A blob of a file another owner keeps (a cache's entry), placed from where it is.

        Nothing is copied or read: a write places it by clone or copy, never
        by move or insert (it is never consumed), and releasing the blob never
        deletes the file. ``fd`` is an open descriptor of ``path`` whose lock
        pins it with its owner (a cache hit's): it is duplicated, and the
        duplicate (so the pin) is held until the blob is released. The
        digests are the owner's, checked by it (the file's identity is
        recorded now and checked by every placement).
        """
        self._check_open()
        pin = os.dup(fd)
        try:
            st = os.fstat(pin)
            if not os.path.samestat(st, os.stat(path)):
                raise ValueError(f"cannot share {path}: the descriptor is another file")
            blob = Blob(self, Path(path), st.st_size, digest, chunk_size, tuple(chunk_digests),
                        identity=file_identity(st), metadata=metadata)
        except BaseException:
            os.close(pin)
            raise
        blob._finalizer.detach()  # never its file's deleter: releasing it closes the pin
        blob._finalizer = weakref.finalize(blob, _close_quietly, pin)
        blob.shared = True
        self._blobs[os.fspath(path)] = blob
        register_live(blob)
        return blob

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
        meta = read_meta(path)
        digest = chunks = None
        chunk_size = self.chunk_size
        sealed = meta.get("identity")
        # Trust recorded digests only for the very file they were taken of,
        # unchanged since (ctime excluded: the store's own rename updated it).
        if sealed and same_identity(sealed, st, relink=True) and meta.get("chunk_digests"):
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


def _known_digests(digests: Digests | None, st: os.stat_result, chunk_size: int,
                   src: Path) -> tuple[str, tuple[int, ...] | None] | None:
    """``adopt``'s ``digests=`` checked against the file: ``(digest, chunk digests)``, or None.

    Chunk digests of another span than ``chunk_size`` are dropped: a
    placement checks chunks of the blob's own span.
    """
    if digests is None:
        return None
    if not isinstance(digests, Digests):
        raise TypeError(f"digests must be a trtet_store.io.Digests, got {type(digests).__name__}")
    if digests.size != st.st_size:
        raise ValueError(f"cannot adopt {src}: {st.st_size} bytes, its digests are of "
                         f"{digests.size}; nothing was adopted")
    if digests.identity is not None and tuple(digests.identity) != file_identity(st):
        raise ValueError(f"cannot adopt {src}: it changed since its digests were taken "
                         "(its identity differs); nothing was adopted")
    return digests.digest, digests.chunks_for(chunk_size)


def _lock_own_file(lock_path: Path) -> int:
    """Create and lock the store's lock file; retake it if a collector unlinked it meanwhile.

    Between our create and our ``flock`` another store's ``collect_stale`` may
    find the file unlocked, take it for a dead store's and unlink it: a lock on
    that deleted inode would leave our live blobs looking orphaned.
    """
    fd = try_lock(lock_path, create=True, wait=True)
    assert fd is not None  # waited for it
    return fd


def _release_store(owner_pid: int, lock_fd: int, lock_path: str) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child: the lock (shared with the parent) stays the parent's
    unlock_file(lock_fd, lock_path)
