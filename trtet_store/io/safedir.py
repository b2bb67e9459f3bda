"""Files created under one checked directory handle, never through a link.

A path names a file only as long as nobody replaces a component of it, and in
a directory that someone else can write to (``/tmp``, a team's scratch
directory, a ``.trtet-staging`` that someone else made), ``open(path,
O_CREAT | O_TRUNC)`` writes wherever a planted link points. As Go's
``os.Root`` and ``openat2(RESOLVE_NO_SYMLINKS)`` do, every name here is
resolved under one open directory:

- :meth:`SafeDir.open` opens the directory with ``O_DIRECTORY | O_NOFOLLOW``
  (a link is refused, not followed), creating the missing components 0700
  and ``lstat``-ing each one it made, then checks the handle itself (its
  ``fstat``, so the check is of the very directory used): owned by our
  effective uid, not writable by group or others unless it is a sticky
  directory of ours (``/tmp`` as root);
- every file is created by ``dir_fd`` with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` (:meth:`SafeDir.create`): a name that exists, link or not, is
  never written through; :meth:`SafeDir.create_replacing` removes such a name
  (by ``dir_fd``, which unlinks a link itself) and creates it anew;
- opens of existing files, renames, links and unlinks go by
  the same handle (:meth:`open_existing`, :meth:`rename`, :meth:`link`,
  :meth:`unlink`);
- :meth:`SafeDir.write_atomic` is an atomic small-file write on top: a fresh
  temp file, fsync, rename (or link if absent), fsync of the directory.

Staging directories (``.trtet-staging``, a publish's staging) hold hours of
build and are checked strictly (:func:`staging_directory`): no sticky
exception, since another user could still plant names in them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path

from trtet_store.io.errors import StorageError

#: Flags of every creation: a new file, never one that is there, never through a link.
CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDirectoryError(StorageError, PermissionError):
    """A directory we would write in is a link, another user's, or writable by others.

    Attributes
    ----------
    path : str
        The directory refused; its message says why and what to do.
    """

    def __init__(self, path: os.PathLike | str, what: str, problem: str, todo: str) -> None:
        super().__init__(errno.EACCES, f"refusing the {what} {os.fspath(path)}: {problem}; "
                         f"{todo}", os.fspath(path))

    def __str__(self) -> str:  # one line: the path is in the message already
        return self.strerror


def directory_problem(st: os.stat_result, *, allow_sticky: bool) -> str | None:
    """Why a directory with status ``st`` (of its handle, or an ``lstat``) is unsafe, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022 and not (allow_sticky and st.st_mode & stat.S_ISVTX):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _open_directory(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _make_parents(path: Path, mode: int) -> None:
    """Create the missing components of ``path`` (``mode`` whatever the umask), each one
    ``lstat``-ed after we made it: a link or another's directory put there is refused."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            continue  # made meanwhile: checked when it is opened (the last) or used
        st = os.lstat(p)
        problem = directory_problem(st, allow_sticky=False)
        if problem:
            raise UnsafeDirectoryError(p, "directory", f"{problem} right after we made it",
                                       "remove it, or use another directory")
        if stat.S_IMODE(st.st_mode) != mode:  # the umask took bits away
            os.chmod(p, mode)


class SafeDir:
    """One open, checked directory; every name under it resolved by ``dir_fd``.

    Make one with :meth:`open`; close it (or use it as a context manager).
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: os.PathLike | str, *, create: bool = False, mode: int = 0o700,
             allow_sticky: bool = True, what: str = "directory",
             todo: str = "remove it, or use another directory") -> SafeDir:
        """Open ``path`` without following a link and check it.

        Parameters
        ----------
        path
            The directory. Only its last component is opened without following
            links: the components above it are the caller's choice of place.
        create
            Create it and its missing parents, mode ``mode`` whatever the umask.
        allow_sticky
            Accept a directory of ours that others may write to when it is
            sticky (they cannot remove or rename our files there).
        what, todo
            How the refusal names the directory, and what it tells the user to do.

        Raises
        ------
        UnsafeDirectoryError
            It is a link, not a directory, another user's, or writable by others.
        FileNotFoundError
            It is missing (without ``create``).
        """
        path = Path(path).absolute()
        if create:
            _make_parents(path, mode)
        try:
            fd = _open_directory(os.fspath(path))
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                problem = directory_problem(os.lstat(path), allow_sticky=allow_sticky)
                raise UnsafeDirectoryError(path, what, problem or "it is not a directory",
                                           todo) from None
            raise
        problem = directory_problem(os.fstat(fd), allow_sticky=allow_sticky)
        if problem:
            os.close(fd)
            raise UnsafeDirectoryError(path, what, problem, todo)
        return cls(fd, path)

    # -- files -----------------------------------------------------------------

    def create(self, name: str, flags: int = os.O_WRONLY, mode: int = 0o600) -> int:
        """A new file ``name`` (``O_CREAT | O_EXCL | O_NOFOLLOW``): FileExistsError if
        anything, a link included, is there. Returns its descriptor."""
        return os.open(name, flags | CREATE_FLAGS, mode, dir_fd=self.fd)

    def create_replacing(self, name: str, flags: int = os.O_WRONLY, mode: int = 0o600) -> int:
        """A new file ``name``; whatever was there (a leftover of ours, a planted link) is
        unlinked first, never written through or truncated."""
        for _ in range(8):
            try:
                return self.create(name, flags, mode)
            except FileExistsError:
                self.unlink(name)
        raise FileExistsError(errno.EEXIST, "keeps being created by someone else",
                              os.fspath(self.path / name))

    def open_existing(self, name: str, flags: int = os.O_RDONLY) -> int:
        """Open the existing ``name`` without following a link (ELOOP if it is one)."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def rename(self, src: str, dst: str) -> None:
        """Rename within this directory (over ``dst``: a link there is replaced, not followed)."""
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def link(self, src: str, dst: str) -> None:
        """Hard-link ``src`` as ``dst`` if ``dst`` is absent (FileExistsError otherwise)."""
        os.link(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def unlink(self, name: str, *, missing_ok: bool = True) -> None:
        """Remove ``name`` (a link itself, never its target)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def fsync(self) -> None:
        """Make renames, links and unlinks in this directory durable."""
        os.fsync(self.fd)

    def write_atomic(self, name: str, data: bytes, *, mode: int = 0o600,
                     replace: bool = True, temp_dir: SafeDir | None = None) -> None:
        """``name`` holds ``data`` whole, durably, or is unchanged.

        A fresh temp file (:meth:`create`), fsynced, renamed over ``name``
        (``replace``) or linked to it only if absent (FileExistsError
        otherwise), then the directory fsynced. The temp file is made in
        ``temp_dir`` (a directory of the same filesystem) when given, so that
        what a kill leaves is where its owner's recovery looks, else here.
        """
        where = self if temp_dir is None else temp_dir
        tmp = f".{name}.{uuid.uuid4().hex[:12]}.tmp"
        fd = where.create(tmp, os.O_WRONLY, mode)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.rename(tmp, name, src_dir_fd=where.fd, dst_dir_fd=self.fd)
            else:
                os.link(tmp, name, src_dir_fd=where.fd, dst_dir_fd=self.fd,
                        follow_symlinks=False)
                where.unlink(tmp)
        except BaseException:
            where.unlink(tmp)
            raise
        self.fsync()

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"SafeDir({os.fspath(self.path)!r}, fd={self.fd})"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n == 0:
            raise OSError(errno.ENOSPC, "short write (0 bytes)")
        view = view[n:]


def write_atomic(path: os.PathLike | str, data: bytes, *, mode: int = 0o600,
                 replace: bool = True, temp_dir: os.PathLike | str | None = None) -> None:
    """Write ``data`` to ``path`` atomically and durably, never through a link.

    Its directory (and ``temp_dir``, where the temp file is made if given) is
    opened and checked as :meth:`SafeDir.open` does (UnsafeDirectoryError),
    then :meth:`SafeDir.write_atomic`.
    """
    path = Path(path)
    with SafeDir.open(path.parent) as d:
        if temp_dir is None:
            d.write_atomic(path.name, data, mode=mode, replace=replace)
            return
        with SafeDir.open(temp_dir) as t:
            d.write_atomic(path.name, data, mode=mode, replace=replace, temp_dir=t)


STAGING_TODO = "remove it, or pass another staging directory"


def staging_directory(path: os.PathLike | str, *, create: bool = True,
                      todo: str = STAGING_TODO) -> SafeDir:
    """Open (create 0700) a staging directory, strictly checked: a link, another user's
    directory, or one writable by group or others (sticky or not) is refused.

    Raises
    ------
    UnsafeDirectoryError
        One line naming it and saying what to do (``todo``).
    """
    return SafeDir.open(path, create=create, allow_sticky=False, what="staging directory",
                        todo=todo)


def check_staging_directory(path: os.PathLike | str, *, todo: str = STAGING_TODO) -> None:
    """Refuse ``path`` as :func:`staging_directory` does, if it exists (a dangling link
    included); create nothing."""
    if not os.path.lexists(path):
        return
    staging_directory(path, create=False, todo=todo).close()
