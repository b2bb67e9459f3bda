"""The storage engine's errors: one base, :class:`StorageError`, an ``OSError``.

Each carries ``errno`` and the path it is about where there is one, and its
message says what to do. Some are also ``ValueError`` (or ``BlockingIOError``)
because that is what they were before the base existed, and callers catch that.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from trtet_store.io.units import format_mib


class StorageError(OSError):
    """Base of every error the storage engine raises on purpose."""


class PlacementUnavailable(Exception):  # noqa: N818 - a signal, caught inside io/
    """This placement or capability is not possible here; raised only before anything changed.

    The one "not possible here" signal of every placement rung and capability
    probe. The writer catches it and takes the next rung; it never reaches a
    caller of the package.
    """

    def __init__(self, reason: str, errno_: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.errno = errno_


class InsufficientSpaceError(StorageError):
    """A write cannot fit: raised before anything is created (the preflight), or
    before a fallback placement writes its first byte (a clone refused at
    placement and copied instead), after which the write rolls back.

    Attributes
    ----------
    needed : int
        Bytes the chosen placements need on the destination filesystem.
    available : int
        Bytes free to an unprivileged writer there when it was checked.
    path : str
        The destination the space was needed for.
    """

    def __init__(self, needed: int, available: int, path: os.PathLike | str,
                 hint: str | None = "consume=True needs only one chunk extra") -> None:
        # The hint is the caller's: "consume=True ..." only helps a write that
        # does not consume yet and could move its blobs.
        super().__init__(
            errno.ENOSPC,
            f"not enough free space for {os.fspath(path)}: needs {format_mib(needed)}, "
            f"{format_mib(available)} available; free {format_mib(needed - available)} or "
            "write to another filesystem" + (f" ({hint})" if hint else ""),
            os.fspath(path),
        )
        self.needed = needed
        self.available = available
        self.path = os.fspath(path)


class VerificationError(StorageError):
    """Bytes did not match the digests recorded when the blob was staged."""

    def __init__(self, what: str, chunk: int | None, path: str) -> None:
        # None: checked against one digest of all the chunk digests (a clone's
        # journal entry), which cannot say which chunk differs.
        which = f"chunk {chunk} does not" if chunk is not None else "the bytes do not"
        super().__init__(
            errno.EIO,
            f"{what}: {which} match the digest recorded when the blob was staged (the file "
            "changed after staging, or the disk returned other bytes)",
            path,
        )
        self.chunk = chunk


class SourceChangedError(VerificationError, ValueError):
    """A source is not the file that was staged: its size or identity changed since.

    Whether found by its size, by its identity (device, inode, size, mtime,
    ctime; zero-copy placements never read the payload) or, as a
    :class:`VerificationError`, by its bytes. Also a ``ValueError``, as a
    changed size was reported before.
    """

    def __init__(self, path: os.PathLike | str, what: str) -> None:
        StorageError.__init__(self, errno.ESTALE, f"{os.fspath(path)} changed after it was "
                              f"staged ({what}); stage it again", os.fspath(path))
        self.chunk = None


# The name it has had since blobs were sealed; the same class.
BlobChangedError = SourceChangedError


class ConcurrentWriteError(StorageError, BlockingIOError):
    """Another transaction is writing the same destination right now.

    Pass ``timeout=`` (seconds) to the write functions to wait for it instead.
    """


class JournalError(StorageError, ValueError):
    """A journal whose plan line is complete but cannot be read (damaged, or another version).

    It may describe where a dead write left bytes, so nothing deletes it: the
    message names the file and what to do.
    """

    def __init__(self, path: os.PathLike | str, why: str) -> None:
        super().__init__(
            f"write journal {os.fspath(path)} cannot be read ({why}). It records an "
            "interrupted write of the file its name starts with; writes of other files are "
            "not affected. If no interrupted write of that file matters, move it away (or "
            "delete it); otherwise keep it and run `trtet-store recover` with a trtet_store "
            "version that wrote it.")
        self.path = Path(path)


class IncompleteJournal(StorageError, ValueError):
    """The plan line never reached the journal whole.

    The writer writes and syncs the plan before it creates a temp file, pins
    a source or moves a byte, so such a journal stands for a write that did
    nothing yet: either its writer died, or it is alive and about to lock
    and fill it (recovery tells the two apart by the destination's lock).
    """
