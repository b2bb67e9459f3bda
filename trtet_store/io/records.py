"""A durable record file: JSON lines begun atomically, then appended.

The one primitive under every resume journal (a publish's, a fetch's), as
Git builds its lockfile on its tempfile:

- :meth:`RecordFile.start` writes the first records to a temporary file
  beside the path, fsyncs it, renames it over the path and fsyncs the
  directory, so the file is either the old one or the new head, whole. All
  of it under one checked handle of the directory (:class:`~trtet_store.io.safedir.SafeDir`):
  the temp file is created ``O_EXCL | O_NOFOLLOW`` (a name planted there,
  a link to another user's file, is removed, never written through), and
  the file is reopened to append without following a link;
- :meth:`RecordFile.append` adds one record with one ``O_APPEND`` write (a
  kill cuts at most that line), raising on a short write, and syncs it when
  asked;
- :func:`read_records` reads every whole record back; a torn last line (a
  kill mid-append) is skipped, since what it announced had not happened yet.

It knows nothing of what the records mean; locking is the caller's
(:mod:`trtet_store.io.lock`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

from trtet_store.io.fs import fsync_dir, pwrite_all
from trtet_store.io.safedir import SafeDir


class DamagedRecordsError(ValueError):
    """A line other than the last of a record file is not a record.

    Attributes
    ----------
    path, line
        The file and the 1-based line; callers say what the file was for.
    """

    def __init__(self, path: os.PathLike | str, line: int) -> None:
        super().__init__(f"record file {os.fspath(path)} is damaged at line {line}")
        self.path = Path(path)
        self.line = line


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def read_records(path: os.PathLike | str, *, skip_damaged: bool = False) -> list[dict[str, Any]]:
    """Every whole record of ``path`` ([] if it does not exist).

    Parameters
    ----------
    path
        The record file.
    skip_damaged
        Skip every line that is not a record instead of raising: for a file
        whose records are each checked again before they are trusted (a
        fetch's ranges are re-read and re-digested), where a lost line costs
        only that work done again.

    Raises
    ------
    DamagedRecordsError
        A line other than the last is not a JSON object (unless
        ``skip_damaged``): the file was damaged by something other than a kill
        mid-append.
    """
    try:
        # Not through a link: a record file is ours, made by RecordFile.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    with open(fd, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if i == len(lines) - 1:  # torn by a kill mid-append: never acted on
                break
            if skip_damaged:
                continue
            raise DamagedRecordsError(path, i + 1)
        records.append(record)
    return records


class RecordFile:
    """One record file, open for appending after :meth:`start` or :meth:`reopen`.

    Parameters
    ----------
    path
        The file. Its directory is created (0700) by :meth:`start` if missing,
        and refused (:class:`~trtet_store.io.safedir.UnsafeDirectoryError`)
        when it is a link, another user's, or writable by others and not
        sticky.
    mode
        Permission bits of a new file.
    """

    def __init__(self, path: os.PathLike | str, *, mode: int = 0o600) -> None:
        self.path = Path(path)
        self.mode = mode
        self._fd: int | None = None
        self._mutex = threading.Lock()

    def start(self, records: list[dict[str, Any]]) -> None:
        """Replace the file atomically and durably with ``records``, then open it to append."""
        self.close()
        tmp = self.path.name + ".tmp"
        with SafeDir.open(self.path.parent, create=True) as d:
            # A leftover temp file (ours, or a link someone planted) is unlinked
            # and the name created anew: never truncated, never followed.
            fd = d.create_replacing(tmp, os.O_WRONLY, self.mode)
            try:
                try:
                    pwrite_all(fd, b"".join(_line(r) for r in records), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                d.rename(tmp, self.path.name)
            except BaseException:
                d.unlink(tmp)
                raise
            d.fsync()
            with self._mutex:
                self._fd = d.open_existing(self.path.name, os.O_WRONLY | os.O_APPEND)

    def reopen(self) -> None:
        """Continue appending to the existing file."""
        with self._mutex:
            if self._fd is None:
                self._fd = os.open(self.path,
                                   os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        """Append one record (thread-safe); ``durable``: fdatasync it before returning.

        Raises
        ------
        OSError
            The write failed, or was short (``ENOSPC``): a torn line is
            skipped on reading, a silent one would hide that the record is
            missing. Its ``filename`` is this file, so that a caller can say
            which file the disk failed.
        """
        data = _line(record)
        with self._mutex:
            if self._fd is None:
                raise ValueError(f"record file {self.path} is not open")
            try:
                n = os.write(self._fd, data)
            except OSError as exc:
                if exc.filename is not None:
                    raise
                raise OSError(exc.errno, exc.strerror, os.fspath(self.path)) from exc
            if n != len(data):
                raise OSError(errno.ENOSPC, f"short write ({n} of {len(data)} bytes)",
                              os.fspath(self.path))
            if durable:
                os.fdatasync(self._fd)

    def close(self) -> None:
        """Close the file (it stays on disk)."""
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def remove(self) -> None:
        """Close and delete the file, and make the deletion durable where the directory allows."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)
