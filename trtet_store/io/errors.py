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
        if needed > available:
            todo = f"free {format_mib(needed - available)} or write to another filesystem"
        else:  # taken during a write and given back since (see during_write)
            todo = "the space is free again now: try again, or write to another filesystem"
        super().__init__(
            errno.ENOSPC,
            f"not enough free space for {os.fspath(path)}: needs {format_mib(needed)}, "
            f"{format_mib(available)} available; {todo}" + (f" ({hint})" if hint else ""),
            os.fspath(path),
        )
        self.needed = needed
        self.available = available
        self.path = os.fspath(path)

    @classmethod
    def during_write(cls, exc: OSError, needed: int,
                     path: os.PathLike | str) -> InsufficientSpaceError:
        """The error for an ``ENOSPC`` met after the preflight had found enough space.

        Something else took the space during the write. ``needed`` is what the
        write needed (the caller knows: a file's size, say); what is free is
        read now, after the rollback gave back what the write had taken.
        Raise it ``from exc`` so that the kernel's error and the transaction's
        notes stay on the chain.
        """
        where = Path(path)
        probe = where.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            st = os.statvfs(probe)
            available = st.f_bavail * st.f_frsize
        except OSError:
            available = 0
        rolled = "; the write was rolled back" if any(
            "rolled back" in n for n in getattr(exc, "__notes__", ())) else ""
        return cls(needed, available, path,
                   hint=f"the preflight found enough space, and something else took it during "
                   f"the write ({exc.strerror or exc}){rolled}")


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


class UnsafeLockFileError(StorageError):
    """A lock file is a symbolic link or not a regular file (planted where a lock goes).

    Its ``errno`` is ``ELOOP`` (as the refused open's was); the message names
    the file and says to remove it.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(errno.ELOOP, f"refusing the lock file {path}: {problem} (trtet_store "
                         "makes lock files only as regular files); remove it, then try again",
                         path)

    def __str__(self) -> str:  # one line: the path is in the message already
        return self.strerror


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


class BlobInUseError(StorageError, ValueError):
    """A blob is taken by another write of this process right now.

    A consuming write (``consume=True``) takes its blobs for itself from
    before it checks them until it ends: it may move their bytes out and
    delete them. A second write of the same blob meanwhile is refused at
    once, before it locks, creates or moves anything. Also a ``ValueError``,
    like the refusal of a blob that was already released.
    """

    def __init__(self, path: os.PathLike | str, why: str) -> None:
        super().__init__(errno.EBUSY, f"{os.fspath(path)}: {why}", os.fspath(path))


class StuckJournalError(StorageError):
    """An interrupted write that recovery can neither finish nor roll back.

    A file it needs is gone (a blob's staging directory was deleted, say) or
    cannot be changed. Everything else was done, and what still holds bytes
    of the write (its journal, a temp file) is kept; the message says which
    file is the problem, what was done to the rest, and how to give up the
    rest explicitly (``recover(..., abandon=True)``, ``trtet-store recover
    --abandon``).

    Attributes
    ----------
    problems : list of str
        What could not be done, each naming its file.
    kept : list of str
        Files kept because they hold bytes of the write.
    """

    def __init__(self, problems: list[str], done: str, kept: list[str],
                 directory: os.PathLike | str, filename: str | None = None,
                 code: int = errno.ENOENT, retry: bool = False) -> None:
        where = os.fspath(directory)
        what_to_do = (f"fix that and run `trtet-store recover {where}` again; or, to give up "
                      "what it still holds" if retry else "to give up what it still holds")
        super().__init__(
            code,
            f"an interrupted write in {where} can be neither finished nor rolled back: "
            f"{'; '.join(problems)}. {done}"
            + (f" Kept, as they hold bytes of it: {', '.join(kept)}." if kept else "")
            + f" Its journal stays, so nothing more is lost; {what_to_do}, run "
            f"`trtet-store recover --abandon {where}` (trtet_store.recover(..., abandon=True))",
            filename)
        self.problems = problems
        self.kept = kept


class NeededByAnotherError(StorageError, FileExistsError):
    """A write would replace a ``.ptd`` that another ``.pte`` of its directory needs.

    ExecuTorch names data files by tag (``cpu.ptd``), not by program, so two
    programs written into one directory collide. Raised before anything is
    written (see :func:`trtet_store.inspector.neighbours.check_neighbours`).
    Also a ``FileExistsError``: the file is there and is not ours to replace.

    Attributes
    ----------
    path : str
        The ``.ptd`` that would be replaced.
    needed_by : list of str
        Each ``.pte`` that needs it (or could not be read, and so is taken to).
    writer : str or None
        The ``.pte`` being written, when one is.
    """

    def __init__(self, path: os.PathLike | str, needed_by: list[os.PathLike | str],
                 why: list[str], writer: os.PathLike | str | None = None) -> None:
        path = os.fspath(path)
        names = ", ".join(os.fspath(p) for p in needed_by)
        whose = f"{Path(os.fspath(writer)).name}'s " if writer is not None else "the "
        super().__init__(
            errno.EEXIST,
            f"writing {whose}{Path(path).name} would replace {path}, which {names} "
            f"need{'s' if len(needed_by) == 1 else ''} ({'; '.join(why)}): write this "
            "program into a separate directory, or pass replace_needed=True "
            "(--replace-needed) to replace it anyway, which breaks "
            f"{'that program' if len(needed_by) == 1 else 'those programs'}",
            path)
        self.path = path
        self.needed_by = [os.fspath(p) for p in needed_by]
        self.writer = os.fspath(writer) if writer is not None else None
