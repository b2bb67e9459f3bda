"""Refuse a write whose destinations or sources are wrong, before anything is touched.

Step 1 of the transaction (DESIGN.md): each check names the cause and what
to do, where the first system call that would fail would only say ENOENT,
EACCES or ENOSPC on an internal name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from trtet_store.io import fs
from trtet_store.io.blob import Blob, live_blob
from trtet_store.io.errors import SourceChangedError
from trtet_store.io.ladder import source_path
from trtet_store.io.layout import ExternalFile, Layout


def check_pieces(dest: os.PathLike | str, pieces: object) -> None:
    """A bytes object is iterable (as ints): say what was meant instead of 'got int'."""
    if isinstance(pieces, (bytes, bytearray, memoryview, str, Blob, ExternalFile)):
        raise TypeError(f"pieces of {os.fspath(dest)} must be a list of pieces (bytes, Blob, "
                        f"ExternalFile), got a single {type(pieces).__name__}; wrap it: [data]")


def validate(outputs: Sequence[tuple[Path, Layout]],
             follow_links: Sequence[bool] | None = None) -> list[os.stat_result | None]:
    """Refuse bad destinations and sources before touching anything.

    Parameters
    ----------
    outputs : sequence of (pathlib.Path, Layout)
        Each destination (resolved) with its layout.
    follow_links : sequence of bool, optional
        Per output; False: the destination is looked at with ``lstat``, and a
        symbolic link there is no old file (it is replaced, never written
        through: the new file gets no mode or owner from it or its target).

    Returns
    -------
    list of os.stat_result or None
        Per output, its old file's status, or None where there is none yet.
    """
    dests: set[str] = set()
    old: list[os.stat_result | None] = []
    follow = [True] * len(outputs) if follow_links is None else list(follow_links)
    for (dest, _), follows in zip(outputs, follow, strict=True):
        parent = dest.parent
        if not parent.is_dir():
            raise FileNotFoundError(errno.ENOENT,
                                    f"cannot write {dest}: its directory does not exist",
                                    os.fspath(parent))
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, f"cannot write {dest}: its filesystem is mounted "
                          "read-only", os.fspath(parent))
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES,
                                  f"cannot write {dest}: its directory is not writable",
                                  os.fspath(parent))
        st = None
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(dest) if follows else os.lstat(dest)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"cannot write {dest}: it is a "
                                    "directory; give a file name", os.fspath(dest))
        key = os.fspath(dest)
        if key in dests:
            raise ValueError(f"{dest} is named twice among the outputs")
        dests.add(key)
        if st is not None and stat.S_ISLNK(st.st_mode):
            st = None  # a link that the rename replaces: no old file of ours
        old.append(st)
    dest_stats = [(dest, st) for (dest, _), st in zip(outputs, old, strict=True) if st is not None]
    _check_inodes([dest for dest, _ in outputs])
    for dest, layout in outputs:
        for ext in layout.payloads:
            piece = ext.piece
            external = isinstance(piece, ExternalFile)
            # A user's file is only read, before any rename: it may be an old
            # destination itself (a file rewritten from its own bytes).
            _check_source(dest, ext.index, source_path(piece),
                          piece.file_size if external else ext.size,
                          [] if external else dest_stats)
    for dest, dst_st in dest_stats:
        owner = live_blob(dst_st)
        if owner is not None:
            # Not a piece of this write, but some store's blob all the same:
            # its bytes would be overwritten under a Blob that keeps its old
            # size and digests, and closing it would delete the output.
            raise ValueError(f"cannot write {dest}: it is (or links to) the file of a live "
                             f"blob, {owner.path}; write to another path")
    return old


def _check_source(dest: Path, index: int, src: Path, size: int,
                  dest_stats: list[tuple[Path, os.stat_result]]) -> None:
    """The source of piece ``index`` is there, regular, of its planned size, and no output."""
    try:
        st = os.stat(src)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, f"piece {index} of {dest}: source file is gone",
            os.fspath(src)) from None
    if not fs.is_regular(st):
        raise ValueError(f"piece {index} of {dest}: {src} is not a regular file")
    if st.st_size != size:
        raise SourceChangedError(
            src, f"piece {index} of {dest}: it is {st.st_size} bytes, but {size} were planned")
    for other, dst_st in dest_stats:
        if fs.same_file(st, dst_st):
            raise ValueError(
                f"cannot write {other}: it is (or links to) the source of piece "
                f"{index}, {src}; write to another path")


def _check_inodes(dests: Sequence[Path]) -> None:
    """Refuse, naming the cause, a write whose lock, journal and temp files cannot be created.

    Out of inodes, the first ``open(O_CREAT)`` fails with a bare ENOSPC on
    an internal name, which reads like a full disk that ``df`` denies.
    """
    per_dir: dict[Path, int] = {}
    for dest in dests:
        per_dir[dest.parent] = per_dir.get(dest.parent, 0) + 4  # lock, journal, temp, backup
    for parent, n in per_dir.items():
        st = os.statvfs(parent)
        if st.f_files and st.f_favail < n:  # f_files 0: no inode limit (btrfs)
            raise OSError(errno.ENOSPC, f"cannot write into {parent}: its filesystem has "
                          f"{st.f_favail} free inodes (files) left, the write needs {n}; "
                          "delete files there (disk space is not the problem)",
                          os.fspath(parent))
