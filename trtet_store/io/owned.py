"""Files we read back to decide something: ours, or left alone.

A journal, a lock, a set record, a seal, a reference, a config or key file:
each is a file the engine reads back and then acts on. In a directory others
can write (``/tmp``, a team's scratch directory) any of them may have been
planted there by somebody else, and acting on a planted journal renames,
unlinks and chmods whatever its plan names. So, as git refuses a repository
another user owns (``safe.directory``) and OpenSSH refuses a key file it does
not trust, every such read goes through one rule:

- the file is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused, not
  followed; a FIFO cannot hang the open), by a directory handle when the
  caller has checked one;
- ``fstat`` on that very descriptor (never a second lookup of the name) must
  show a regular file owned by the effective uid (root too: root acts only on
  root's files here) or, where the caller allows it, by root;
- its size is capped before a byte is read, and the bytes are read from that
  same descriptor, never more than the cap.

Anything else raises :class:`NotOursError`, whose one-line message says whose
the file is and that it is left alone; callers report it and never act on it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from trtet_store.io.errors import StorageError

#: Open flags of every read back: no link followed, no FIFO waited on.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


_OWNED_BY = "owned by uid "


class NotOursError(StorageError, PermissionError):
    """A file we would read back to decide something is not one we made.

    Its message is one line: the file, why it is not ours ("owned by uid
    1001", "a symbolic link", "a FIFO, not a regular file", "4096 bytes, over
    the 1024 a journal may hold") and "left alone".

    Attributes
    ----------
    path : str
        The file refused.
    reason : str
        Why, without the path.
    """

    def __init__(self, path: os.PathLike | str, reason: str, what: str = "file") -> None:
        self.reason = reason
        self.what = what
        super().__init__(errno.EPERM, f"{what} {os.fspath(path)} is not ours: {reason}; "
                         "left alone", os.fspath(path))

    def __str__(self) -> str:  # one line: the path is in the message already
        return self.strerror

    @property
    def other_owner(self) -> bool:
        """Whether the file is another user's (not a link, a FIFO or one too big)."""
        return self.reason.startswith(_OWNED_BY)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def ours_problem(st: os.stat_result, *, limit: int | None = None,
                 allow_root: bool = False) -> str | None:
    """Why a file with this ``fstat`` is not ours to act on, or None when it is.

    Parameters
    ----------
    st : os.stat_result
        The ``fstat`` of the descriptor that will be read (not an ``lstat`` of
        its name: the name may have been swapped since).
    limit : int, optional
        The most bytes such a file may hold.
    allow_root : bool
        Also accept a file owned by root (a key file an administrator put
        there); the effective uid's own files are always accepted.
    """
    if not stat.S_ISREG(st.st_mode):
        return f"{_kind(st.st_mode)}, not a regular file"
    euid = os.geteuid()
    if st.st_uid != euid and not (allow_root and st.st_uid == 0):
        return f"{_OWNED_BY}{st.st_uid}, not by uid {euid}"
    if limit is not None and st.st_size > limit:
        return f"{st.st_size} bytes, over the {limit} such a file may hold"
    return None


@contextmanager
def open_ours(path: os.PathLike | str, *, dir_fd: int | None = None,
              limit: int | None = None, allow_root: bool = False,
              what: str = "file") -> Iterator[int]:
    """Open a file we made, checked on its descriptor; yield the descriptor.

    Parameters
    ----------
    path : path-like
        The file; a bare name when ``dir_fd`` is given.
    dir_fd : int, optional
        A directory handle the caller has checked; the name is opened under it.
    limit, allow_root
        As :func:`ours_problem`.
    what : str
        What the file is, for the message ("write journal", "set record").

    Raises
    ------
    NotOursError
        A link, not a regular file, another user's, or over ``limit``.
    FileNotFoundError
        Nothing is there.
    """
    try:
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOursError(path, "a symbolic link", what) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO with O_NONBLOCK on some systems
            raise NotOursError(path, "not a regular file", what) from None
        raise
    try:
        problem = ours_problem(os.fstat(fd), limit=limit, allow_root=allow_root)
        if problem is not None:
            raise NotOursError(path, problem, what)
        # The descriptor was opened non-blocking only to keep a FIFO from hanging
        # the open; a regular file reads the same either way.
        yield fd
    finally:
        os.close(fd)


def read_fd_capped(fd: int, limit: int, path: os.PathLike | str, what: str = "file") -> bytes:
    """All of ``fd`` from its start, refusing more than ``limit`` bytes.

    The size was checked on ``fstat``; the read is capped too, since a file
    can grow between the two.
    """
    chunks = []
    total = 0
    offset = 0
    while True:
        chunk = os.pread(fd, min(1 << 20, limit + 1 - total), offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        offset += len(chunk)
        if total > limit:
            raise NotOursError(path, f"grew past the {limit} bytes such a file may hold", what)


def read_ours(path: os.PathLike | str, *, limit: int, dir_fd: int | None = None,
              allow_root: bool = False, what: str = "file") -> bytes:
    """The bytes of a file we made: :func:`open_ours`, then at most ``limit`` bytes read.

    Raises
    ------
    NotOursError
        As :func:`open_ours`, or the file grew past ``limit`` while read.
    FileNotFoundError
        Nothing is there.
    """
    with open_ours(path, dir_fd=dir_fd, limit=limit, allow_root=allow_root, what=what) as fd:
        return read_fd_capped(fd, limit, path, what)
