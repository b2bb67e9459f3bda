"""The cache directory's identity: the cache works only in a directory it made (or an empty one).

Opening a cache removes what its recovery does not recognise, so a cache
pointed at a project directory, or at a link another user planted, would
delete someone's files. Before anything is read, created or removed:

- the path is ``lstat``-ed and a symbolic link is refused; the directory is
  then opened with ``O_NOFOLLOW`` and checked through that handle (``fstat``:
  our own uid, not writable by group or others), and each subdirectory is
  checked under the handle too;
- it must carry our marker, a ``CACHEDIR.TAG`` (the Cache Directory Tagging
  Specification, https://bford.info/cachedir/, so backup tools skip it)
  whose comment line ``# trtet_store cache format: N`` gives our format;
- an empty directory is adopted (the tag is written on a write open);
- a directory made by the previous release (no tag) is adopted only when
  every entry in it is one of our layout's names, of the right type, owned
  by us, and every record in ``keys/`` parses; anything else in it and it is
  refused, never adopted. The tag is then written on the first write open;
  a read-only open (``cache list``, ``stats``) writes nothing.

Anything else is :class:`CacheDirectoryError`. This is the one place the
cache checks a directory; an io primitive for dir_fd work can replace it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from trtet_store.cache.layout import (
    DOWNLOADS,
    PENDING,
    REMOTE_JOURNAL,
    SUBDIRS,
    check_key,
    is_blob_name,
    refuse_foreign,
)
from trtet_store.io import SafeDir

log = logging.getLogger("trtet_store.cache")

TAG_NAME = "CACHEDIR.TAG"
#: The specification's signature: a tag file must begin with exactly this line.
SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
#: The version of the directory's layout; a tag naming a newer one is refused.
FORMAT = 1
FORMAT_LINE = "# trtet_store cache format: "
TAG_TEXT = (f"{SIGNATURE}\n"
            "# This file is a cache directory tag created by trtet_store (its engine cache).\n"
            "# For information about cache directory tags, see https://bford.info/cachedir/\n"
            f"{FORMAT_LINE}{FORMAT}\n")
# The tag is written to a temp name, then renamed: a concurrent opener that sees the
# temp alone takes the directory for an empty one, never for a foreign one. The name is
# io's write_atomic's (``.CACHEDIR.TAG.<12 hex>.tmp``) or, left by an earlier release,
# ``.CACHEDIR.TAG.<32 hex>``.
_TAG_TEMP = re.compile(r"\.CACHEDIR\.TAG\.(?:[0-9a-f]{32}|[0-9a-f]{12}\.tmp)")
#: Directories that callers of the cache kept in it in the previous release (the engine
#: cache's downloads and shared-tier journals): a legacy cache may hold them.
CALLER_DIRS = (DOWNLOADS, REMOTE_JOURNAL, PENDING)
_TMP_NAME = re.compile(r"[0-9]+-[0-9a-f]{32}")
_JOURNAL_NAME = re.compile(r"[0-9a-f]{32}\.publish\.[A-Za-z0-9._-]+")
_RECORD_CAP = 1 << 20


class CacheDirectoryError(PermissionError):
    """A directory the cache refuses to use: a link, or not a trtet_store cache.

    Nothing in it was read beyond its listing, and nothing was created or removed.
    """

    def __init__(self, path: os.PathLike | str, problem: str, advice: str) -> None:
        super().__init__(errno.EACCES, f"{os.fspath(path)} {problem}; {advice}",
                         os.fspath(path))

    def __str__(self) -> str:
        return self.strerror


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and each missing parent with mode 0700, whatever the umask.

    ``os.makedirs`` gives parents the umask's mode (0777 under ``umask 000``),
    so ``~/.cache/trtet_store`` would be open to everyone; each missing
    component is made here with ``mkdir(0o700)`` (a umask only removes bits).
    """
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(p, 0o700)


def open_cache_directory(path: Path, *, create: bool) -> bool:
    """Check that ``path`` is our cache (see the module doc); with ``create``, make it one.

    Returns whether the cache can be written (False: a read-only open, or a
    read-only filesystem or directory). With ``create``, the directory, its
    0700 parents, the tag and :data:`SUBDIRS` are created where missing.

    Raises
    ------
    CacheDirectoryError
        A link, or a directory that is not a trtet_store cache.
    PermissionError
        Another user's directory (or subdirectory), or one writable by others.
    NotADirectoryError, FileNotFoundError
        Not a directory; missing (without ``create``).
    """
    if create:
        make_private_dirs(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no engine cache at {path}: the directory does "
                                "not exist", os.fspath(path)) from None
    if stat.S_ISLNK(st.st_mode):
        raise CacheDirectoryError(
            path, f"is not a trtet_store cache directory: it is a symbolic link (to "
            f"{os.readlink(path)})", "pass the cache directory itself (links are never "
            "followed: another user could point one at your files)")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"the engine cache {path} is not a directory",
                                 os.fspath(path))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise CacheDirectoryError(path, "was replaced while it was opened",
                                      "check who else writes to its parent directory")
        refuse_foreign(path, fst, "directory")
        _refuse_writable_by_others(path, fst)
        vfs = os.statvfs(fd)
        writable = create and not (vfs.f_flag & os.ST_RDONLY) and os.access(path, os.W_OK)
        names = [n for n in os.listdir(fd) if not _TAG_TEMP.fullmatch(n)]
        if TAG_NAME in names:
            _check_tag(path, fd)
        elif names:
            problem = _legacy_problem(fd, names)
            if problem is not None:
                raise CacheDirectoryError(
                    path, f"is not a trtet_store cache (no {TAG_NAME}): {problem}",
                    "pass an empty or new directory for the cache (nothing here was "
                    "changed)")
            if writable:
                _write_tag(fd, path)
                log.info("engine cache %s: a cache of the previous release, adopted (%s "
                         "written)", path, TAG_NAME)
        elif writable:
            _write_tag(fd, path)
        _check_subdirs(path, fd, writable)
    finally:
        os.close(fd)
    return bool(writable)


def _check_tag(path: Path, fd: int) -> None:
    """Our own tag (a regular file of ours, the signature, a format we read), else refused."""
    try:
        tfd = os.open(TAG_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:  # ELOOP: a link
        raise CacheDirectoryError(path, f"has a {TAG_NAME} that cannot be read ({exc.strerror})",
                                  "pass another directory for the cache") from None
    try:
        tst = os.fstat(tfd)
        if not stat.S_ISREG(tst.st_mode):
            raise CacheDirectoryError(path, f"has a {TAG_NAME} that is not a file",
                                      "pass another directory for the cache")
        refuse_foreign(path / TAG_NAME, tst, "tag")
        text = os.read(tfd, 4096).decode("utf-8", "replace")
    finally:
        os.close(tfd)
    lines = text.splitlines()
    version = next((line[len(FORMAT_LINE):].strip() for line in lines
                    if line.startswith(FORMAT_LINE)), None)
    if not lines or lines[0] != SIGNATURE or version is None:
        raise CacheDirectoryError(
            path, f"is another program's cache (its {TAG_NAME} is not trtet_store's)",
            "pass a directory of its own for the trtet_store cache")
    if not version.isdigit() or int(version) > FORMAT:
        raise CacheDirectoryError(
            path, f"is a trtet_store cache of format {version}, newer than this version "
            f"reads ({FORMAT})", "upgrade trtet_store or pass another directory")


def _write_tag(fd: int, path: Path) -> None:
    """Write the tag complete or not at all, under the handle ``fd`` of ``path``
    (io's :meth:`~trtet_store.io.SafeDir.write_atomic`: a temp name, then a rename)."""
    with SafeDir(os.dup(fd), path) as directory:
        directory.write_atomic(TAG_NAME, TAG_TEXT.encode())


def _check_subdirs(path: Path, fd: int, writable: bool) -> None:
    """Each of :data:`SUBDIRS` a real directory of ours (made when ``writable`` and missing)."""
    for sub in SUBDIRS:
        if writable:
            with contextlib.suppress(FileExistsError):
                os.mkdir(sub, 0o700, dir_fd=fd)
        try:
            sst = os.lstat(sub, dir_fd=fd)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(sst.st_mode):
            raise CacheDirectoryError(path / sub, "is not a directory (a link?)",
                                      "remove it, or pass another directory for the cache")
        refuse_foreign(path / sub, sst, "directory")
        # Ours but writable by others: anyone could plant a record, a seal or a link in it.
        _refuse_writable_by_others(path / sub, sst)


def _refuse_writable_by_others(path: Path, st: os.stat_result) -> None:
    if st.st_mode & 0o022:
        raise PermissionError(
            errno.EACCES,
            f"refusing the engine cache directory {path}: it is writable by others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); chmod 700 it or use another directory",
            os.fspath(path))


def _legacy_problem(fd: int, names: Iterable[str]) -> str | None:
    """Why the untagged ``names`` are not a previous release's cache, or None when they are.

    Every entry must be one of our names, of its type, ours; every record must parse.
    """
    uid = os.geteuid()
    names = sorted(names)
    if not {"keys", "blobs"} <= set(names):
        return f"it holds {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
    for name in names:
        st = os.lstat(name, dir_fd=fd)
        if name == "lock":
            ok = stat.S_ISREG(st.st_mode)
        elif name in SUBDIRS or name in CALLER_DIRS:
            ok = stat.S_ISDIR(st.st_mode)
        else:
            return f"it holds {name}, which no trtet_store cache holds"
        if not ok or st.st_uid != uid:
            return f"its {name} is not the cache's own {'file' if name == 'lock' else 'directory'}"
    for sub in [n for n in names if n in SUBDIRS or n in CALLER_DIRS]:
        sfd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            for child in sorted(os.listdir(sfd)):
                if not _legacy_child_ok(sfd, sub, child, uid):
                    return f"it holds {sub}/{child}, which no trtet_store cache holds"
        finally:
            os.close(sfd)
    return None


def _legacy_child_ok(sfd: int, sub: str, child: str, uid: int) -> bool:
    """Whether ``sub/child`` is a name, type and owner the previous release wrote there."""
    st = os.lstat(child, dir_fd=sfd)
    if st.st_uid != uid:
        return False
    if sub == "downloads":  # one directory per key
        return stat.S_ISDIR(st.st_mode) and _is_key(child)
    if sub == "remote-pending":  # one empty mark per key
        return stat.S_ISREG(st.st_mode) and st.st_size == 0 and _is_key(child)
    if sub == "remote-journal":  # publish journals and their locks: <32 hex>.publish.*
        return stat.S_ISREG(st.st_mode) and _JOURNAL_NAME.fullmatch(child) is not None
    if not stat.S_ISREG(st.st_mode):
        return False
    if sub == "tmp":
        return _TMP_NAME.fullmatch(child) is not None
    if sub == "flights":
        return child.endswith(".lock") and _is_key(child[:-5]) and st.st_size == 0
    if sub == "blobs":
        return is_blob_name(child.removesuffix(".json"))
    if child.endswith(".use"):  # keys/
        return _is_key(child[:-4])
    if not child.endswith(".json") or not _is_key(child[:-5]) or st.st_size > _RECORD_CAP:
        return False
    rfd = os.open(child, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
    try:
        raw = json.loads(os.read(rfd, _RECORD_CAP))
        return (isinstance(raw, dict) and raw.get("key") == child[:-5]
                and isinstance(raw.get("blob"), str) and is_blob_name(raw["blob"])
                and isinstance(raw.get("size"), int) and isinstance(raw.get("metadata"), dict))
    except (ValueError, RecursionError):
        return False
    finally:
        os.close(rfd)


def _is_key(name: str) -> bool:
    try:
        check_key(name)
    except ValueError:
        return False
    return True
