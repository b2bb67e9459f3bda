"""The publish journal: what a resumed publish needs, made durable before each step.

One JSON-lines file per destination (endpoint, bucket, program key) in the
journal directory (default ``$XDG_STATE_HOME/trtet_store/publish``, or
``~/.local/state/trtet_store/publish``). Every record is appended, flushed
and fsynced before the step it announces:

- ``plan``: the objects, their sizes, part sizes and each part's action
  (upload, or copy from which key, offset and ETag), and the ETags each
  conditional write was planned against; written before anything is created;
- ``upload``: an object's upload id, right after CreateMultipartUpload and
  before its first part;
- ``part``: a part's CRC64NVME, before it is sent (not synced, as ``sent``);
- ``sent``: the ETag the server answered for a part;
- ``completed``: an object's manifest entry, after its conditional Complete;
- ``committed``: the manifest's ETag; then the file is removed.

A torn last line (a kill mid-append) is ignored: what it announced had not
happened yet. Anything else unreadable is a
:class:`~trtet_store.remote.errors.RemoteError` naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from trtet_store.io import fsync_dir, pwrite_all
from trtet_store.remote.errors import RemoteError

VERSION = 1
SUFFIX = ".publish.jsonl"


def default_dir() -> Path:
    """Where journals live unless the caller says otherwise."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(state) / "trtet_store" / "publish"


def journal_path(directory: os.PathLike | str, endpoint: str, bucket: str, key: str) -> Path:
    """The journal file of one destination."""
    h = hashlib.sha256(f"{endpoint}\0{bucket}\0{key}".encode()).hexdigest()[:32]
    return Path(directory) / f"{h}{SUFFIX}"


class Journal:
    """An open journal: append records durably, read back the state of an earlier run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """Every whole record of ``path`` ([] if it does not exist)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        records = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                if i == len(lines) - 1:  # torn by a kill mid-append: never acted on
                    break
                raise RemoteError(f"publish journal {path} is damaged at line {i + 1}; move "
                                  "it away to start the publish over") from None
        if records and (records[0].get("t") != "plan" or records[0].get("version") != VERSION):
            raise RemoteError(f"publish journal {path} was written by another version; move "
                              "it away to start the publish over")
        return records

    def start(self, plan: dict[str, Any]) -> None:
        """Begin a new journal with ``plan`` (replacing any old one atomically)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        line = json.dumps({"t": "plan", "version": VERSION, **plan},
                          separators=(",", ":")).encode() + b"\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            pwrite_all(fd, line, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._open()

    def reopen(self) -> None:
        """Continue appending to an existing journal."""
        self._open()

    def _open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def append(self, record: dict[str, Any], *, durable: bool = True) -> None:
        """Append one record (thread-safe); ``durable``: fdatasync it before returning.

        A part's records are not synced one by one: a kill keeps them (they
        are in the page cache), and one that a power cut loses costs that
        part being matched by its MD5 or sent again, never a wrong object.
        """
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if self._fd is None:
                raise RemoteError(f"publish journal {self.path} is not open")
            n = os.write(self._fd, line)
            if n != len(line):
                raise OSError(f"short write to {self.path}: {n} of {len(line)} bytes")
            if durable:
                os.fdatasync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def remove(self) -> None:
        """Close and delete the journal (the publish committed, or was given up)."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)

