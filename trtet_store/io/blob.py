"""A blob: one file owned by a blob store, with its size, identity and digests.

The file lives as long as its :class:`Blob`; releasing the blob (closing it,
or letting it be collected) deletes the file, or gives an adopted file back
to where it came from. :func:`live_blob` finds the live blob behind a file,
so a write can refuse to overwrite one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from trtet_store.io import names
from trtet_store.io.digests import digest_file, file_identity
from trtet_store.io.errors import BlobChangedError, BlobInUseError
from trtet_store.io.seal import same_identity


class BlobOwner(Protocol):
    """What a blob asks of its store (a :class:`~.blobstore.BlobStore`, which imports this)."""

    drop_behind: bool

    def _write_meta(self, blob: Blob) -> None: ...


# The blob store's logger: these messages were the store's before they had a
# module, and users filter on its name.
log = logging.getLogger("trtet_store.blobstore")

# Every live blob of every store in this process, by (st_dev, st_ino), so a
# write can refuse a destination that is some blob's file (or a link to it).
_LIVE: weakref.WeakValueDictionary[tuple[int, int], Blob] = weakref.WeakValueDictionary()
_LIVE_MUTEX = threading.Lock()


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
    for name in (path, names.meta_path_of(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


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
        store: BlobOwner,
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
        #: The file is another owner's (a cache's entry, see BlobStore.share): placed by
        #: clone or copy only, never consumed, never deleted; releasing the blob unpins it.
        self.shared = False
        # Writes of this process using the blob now: -1 while a consuming one has it.
        self._claims = 0
        self._claim_mutex = threading.Lock()
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

    def claim(self, *, exclusive: bool) -> None:
        """Take the blob for one write, before the write checks or touches anything.

        A consuming write (``exclusive``) may move the bytes out and delete the
        file, so it must be the only write using the blob; writes that leave
        it intact may share it.

        Raises
        ------
        BlobInUseError
            Another write of this process has it in a way this one cannot share.
        ValueError
            The blob was released (a write consumed it, or it was closed).
        """
        with self._claim_mutex:
            if self.closed or self.consumed:
                raise ValueError(f"{self!r} was released: a write consumed it, or it was "
                                 "closed; stage its bytes again")
            if self._claims < 0 or (exclusive and self._claims):
                raise BlobInUseError(
                    self.path, "another write in this process is using this blob right now, "
                    + ("and this one would consume it (move its bytes out and delete it)"
                       if exclusive else "and consumes it (moves its bytes out and deletes it)")
                    + "; refused before anything was written. A blob is consumed by one write: "
                    "wait for that write, or stage the bytes again for this one")
            self._claims = -1 if exclusive else self._claims + 1

    def unclaim(self, *, exclusive: bool) -> None:
        """Give back what :meth:`claim` took, when the write ends (however it ends)."""
        with self._claim_mutex:
            self._claims = 0 if exclusive else max(0, self._claims - 1)

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
        if not same_identity(self.identity, now, relink=not ctime):
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

    def reseal(self, *, sidecar: bool = False) -> None:
        """Record the file's identity again, after a rollback of our own put it back.

        ``sidecar``: in the sidecar too (a file of our own store), for a caller
        that knows the file changed by nothing but its own link and unlink
        (only the ctime): an orphan whose sidecar names another identity is
        never trusted, so a kill after them would cost the build. Never by
        default: a rollback reseals blobs whose bytes it did not check, and
        a sidecar vouching for changed bytes would be trusted by the next
        process (the staging directory stays as it was after a failed write).
        """
        self.identity = file_identity(os.stat(self.path))
        if sidecar and not self.shared and not self.closed:
            with contextlib.suppress(OSError):
                self.store._write_meta(self)

    def ensure_digests(self) -> None:
        """Read the file once to compute its digests, checking it is still as sealed."""
        if self._chunk_digests is not None:
            return
        self.check_identity()
        digest, chunks, size = digest_file(self.path, self.chunk_size, self.store.drop_behind)
        self.check_identity()
        if size != self.size:
            raise BlobChangedError(self.path, f"read {size} bytes, sealed {self.size}")
        if self._digest is not None and digest != self._digest:
            # Adopted with a digest its holder vouched for: the bytes are not those.
            raise BlobChangedError(self.path, f"digest {digest}, adopted as {self._digest}")
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

    def keep(self) -> None:
        """Let the file outlive this Blob: closed without deleting it.

        What a caller does with engines it cannot place now but must not lose
        (an export that failed after hours of build): the file stays in the
        store's directory and, once the store is closed, is an orphan there,
        listed by :meth:`BlobStore.orphans`, reusable by a later build, removed
        only by :meth:`BlobStore.remove_orphans` or its age limit. A shared blob's
        file is its owner's, kept by it: keeping it only unpins it.
        """
        if self.shared:
            self.close()
            return
        self._finalizer.detach()

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


def register_live(blob: Blob) -> None:
    """Record ``blob`` as live in this process, for :func:`live_blob` (until it is collected)."""
    with _LIVE_MUTEX:
        _LIVE[tuple(blob.identity[:2])] = blob
