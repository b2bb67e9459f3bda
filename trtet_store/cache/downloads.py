"""Partial downloads in ``<cache>/downloads/``: counted; removed when no download holds them.

A remote hit downloads into ``downloads/<key>/``; the fetch stages its bytes in
``downloads/<key>/.trtet-staging/`` with a resume journal, and holds
``fetch-<id>.lock`` there while it runs. A hit cut off mid-download keeps the
directory so that the next hit of the key resumes it; one that is never hit
again would strand its (fully allocated) files, so ``stats`` counts them and
``clear``, ``prune`` and ``recover`` remove each one whose fetch locks are all
free. A lock someone holds (a download running in another process) keeps its
directory, and that is said.

Only partial downloads (a directory with a staging directory) are judged: a
finished download waiting to be linked in, or served once from there, holds
no fetch lock and is its process's to remove.

This module knows the fetch's files only by io's names (``STAGING_DIR``, the
lock file pattern): the cache never imports the remote layer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.cache.layout import DOWNLOADS, refuse_foreign
from trtet_store.io import (
    FETCH_LOCK_PREFIX,
    FETCH_LOCK_SUFFIX,
    STAGING_DIR,
    UnsafeLockFileError,
    release,
    try_lock,
)

log = logging.getLogger("trtet_store.cache")


@dataclass
class DownloadSweep:
    """What a sweep of ``downloads/`` did: directories removed (and their bytes), kept held."""

    removed: list[Path] = field(default_factory=list)
    removed_bytes: int = 0
    held: list[Path] = field(default_factory=list)


def _partials(directory: Path) -> list[Path]:
    """Each ``downloads/<key>/`` that holds a staging directory (a partial download)."""
    root = directory / DOWNLOADS
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        path = root / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # a hit that finished meanwhile removed its own download
        if not stat.S_ISDIR(st.st_mode):
            continue
        refuse_foreign(path, st, "download directory")
        if os.path.lexists(path / STAGING_DIR):
            out.append(path)
    return out


def disk_bytes(path: Path) -> int:
    """The bytes ``path``'s files occupy on disk (allocated blocks; links not followed)."""
    total = 0
    for top, _, files in os.walk(path):  # links to directories are not entered
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(top, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_blocks * 512
    return total


def downloads_bytes(directory: Path) -> int:
    """The bytes under ``<directory>/downloads/`` (partial and finished downloads)."""
    root = directory / DOWNLOADS
    return disk_bytes(root) if os.path.isdir(root) else 0


def _fetch_locks(staging: Path) -> list[Path]:
    try:
        names = os.listdir(staging)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [staging / n for n in sorted(names)
            if n.startswith(FETCH_LOCK_PREFIX) and n.endswith(FETCH_LOCK_SUFFIX)]


def _remove(path: Path) -> None:
    """Remove a download directory, its staging directory last: one that fails half-way
    still holds it, so it stays a partial download that the next sweep retries."""
    for name in sorted(os.listdir(path), key=lambda n: n == STAGING_DIR):
        child = path / name
        if stat.S_ISDIR(os.lstat(child).st_mode):
            shutil.rmtree(child)
        else:
            os.unlink(child)
    os.rmdir(path)


def remove_unheld(directory: Path) -> DownloadSweep:
    """Remove each partial download under ``<directory>/downloads/`` no live fetch holds.

    Each fetch lock in its staging directory is taken (never waited for)
    and kept while the directory goes, so no fetch starts in it meanwhile.
    A lock another process holds keeps the directory (listed in ``held``).
    Another user's directory raises PermissionError, never removed.
    """
    sweep = DownloadSweep()
    for path in _partials(directory):
        fds: list[int] = []
        try:
            held = False
            for lock in _fetch_locks(path / STAGING_DIR):
                try:
                    fd = try_lock(lock, create=False)
                except (FileNotFoundError, UnsafeLockFileError):
                    continue  # gone meanwhile; a link is no lock (removed with the rest)
                if fd is None:
                    held = True
                    break
                fds.append(fd)
            if held:
                sweep.held.append(path)
                log.warning("engine cache: kept the partial download %s: a download running "
                            "in another process holds it", path)
                continue
            size = disk_bytes(path)
            try:
                _remove(path)
            except OSError as exc:  # said, and the directory stays a partial one to retry
                log.warning("engine cache: could not remove the partial download %s: %s",
                            path, exc)
                continue
            sweep.removed.append(path)
            sweep.removed_bytes += size
        finally:
            for fd in fds:
                release(fd)
    if sweep.removed:
        log.info("engine cache: removed %d partial downloads no download holds (%d bytes)",
                 len(sweep.removed), sweep.removed_bytes)
    return sweep
