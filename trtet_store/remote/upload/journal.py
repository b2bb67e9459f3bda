"""The publish journal: what a resumed publish needs, made durable before each step.

One JSON-lines file per destination (bucket and program key, not the
endpoint: see :func:`journal_path`) in the journal directory (default
``$XDG_STATE_HOME/trtet_store/publish``, or
``~/.local/state/trtet_store/publish``), and beside it a lock file
(``*.publish.lock``) that its publish holds while it runs (:meth:`Journal.lock`),
so two publishes of one destination on one machine never share a journal.
Every record is appended, flushed and fsynced before the step it announces:

- ``plan``: the objects, their sizes, part sizes and each part's action
  (upload, or copy from which key, offset and ETag), and the ETags each
  conditional write was planned against; written before anything is created;
- ``upload``: an object's upload id, right after CreateMultipartUpload and
  before its first part;
- ``part``: a part's CRC64NVME, before it is sent (not synced, as ``sent``);
- ``sent``: the ETag the server answered for a part;
- ``completed``: an object's manifest entry, after its conditional Complete;
- ``committed``: the manifest's ETag; then the file is removed.

The file is an :class:`~trtet_store.io.RecordFile` (begun by a durable
atomic replace, then appended line by line), as the fetch's resume journal
is. A torn last line (a kill mid-append) is ignored: what it announced had not
happened yet. Anything else unreadable is a
:class:`~trtet_store.remote.errors.RemoteError` naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from trtet_store.io import (
    DamagedRecordsError,
    RecordFile,
    SafeDir,
    pwrite_all,
    read_records,
    try_lock,
    unlock_file,
)
from trtet_store.remote.errors import ConflictError, RemoteError

VERSION = 1
SUFFIX = ".publish.jsonl"
LOCK_SUFFIX = ".publish.lock"


def default_dir() -> Path:
    """Where journals live unless the caller says otherwise."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(state) / "trtet_store" / "publish"


def journal_path(directory: os.PathLike | str, bucket: str, key: str) -> Path:
    """The journal file of one destination: ``bucket`` and ``key`` name the upload.

    Not the endpoint URL: one server reached through another URL (a proxy, a
    DNS name, ``localhost`` for ``127.0.0.1``) holds the same uploads, and a
    journal keyed by URL would start over there and leave the first upload
    open and billed. S3 gives no server identity to key by (on AWS a bucket
    name is global); the endpoint a journal was written through is kept in
    its plan, and a resume asks this server for the journaled upload
    (ListParts) before it trusts it.
    """
    h = hashlib.sha256(f"{bucket}\0{key}".encode()).hexdigest()[:32]
    return Path(directory) / f"{h}{SUFFIX}"


def journals_of(directory: os.PathLike | str, bucket: str, key: str) -> list[Path]:
    """Every journal in ``directory`` whose plan is for ``bucket``/``key``.

    Besides :func:`journal_path`'s, journals named by an earlier scheme (by
    endpoint too) of the same destination: giving a publish up must remove
    them all, or ``recover`` keeps listing uploads that are gone. An
    unreadable journal is skipped (it names nothing we could act on).
    """
    out = []
    d = Path(directory)
    for path in sorted(d.glob(f"*{SUFFIX}")) if d.is_dir() else []:
        try:
            records = Journal.read(path)
        except RemoteError:
            continue
        if records and records[0].get("bucket") == bucket and records[0].get("key") == key:
            out.append(path)
    return out


class Journal:
    """An open journal: append records durably, read back the state of an earlier run."""

    def __init__(self, path: Path, context: dict[str, Any] | None = None) -> None:
        self.path = path
        #: written into the plan record besides the plan (e.g. the local sources' folders)
        self.context = dict(context or {})
        self._file = RecordFile(path)
        self._lock_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        """The lock file its publish holds while it runs."""
        return self.path.with_name(self.path.name[:-len(SUFFIX)] + LOCK_SUFFIX)

    def lock(self, what: str, key: str) -> None:
        """Hold this journal's lock until :meth:`unlock` (or the process's death).

        Taken before the journal is read: a second publish of the same
        destination on this machine (another process or thread) would
        otherwise take the first one's live journal for an interrupted one,
        send its own bytes into the first one's upload and break both.

        Raises
        ------
        ConflictError
            Another publish of ``what`` (the destination, for the message)
            holds it; nothing was read, sent or created.
        """
        if self._lock_fd is not None:
            raise RemoteError(f"publish journal {self.path} is locked already")
        # The journal directory is ours (made 0700; a link, another user's or
        # one others may write to without a sticky bit is refused), and the
        # lock file is opened without following a link.
        SafeDir.open(self.path.parent, create=True, what="publish journal directory",
                     todo="remove it, or pass another journal_dir").close()
        fd = try_lock(self.lock_path, create=True)
        if fd is None:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                pid = int(self.lock_path.read_text().strip() or "0")
                holder = f" (process {pid})" if pid else ""
            raise ConflictError(f"another publish of {what} is running on this machine"
                                f"{holder}; it holds {self.lock_path}. Wait for it to finish, "
                                "or stop it and publish again to resume its upload", key)
        # Who holds it, for the message above (best effort: the flock is the lock).
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            # Only a lock file of ours, of one name: never a hard link to another file.
            if st.st_uid == os.geteuid() and st.st_nlink == 1 and stat.S_ISREG(st.st_mode):
                os.ftruncate(fd, 0)
                pwrite_all(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Close the journal and release its lock (removing the lock file); idempotent."""
        self.close()
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            unlock_file(fd, self.lock_path)

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """Every whole record of ``path`` ([] if it does not exist)."""
        try:
            records = read_records(path)
        except DamagedRecordsError as exc:
            raise RemoteError(f"publish journal {path} is damaged at line {exc.line}; move "
                              "it away to start the publish over") from None
        if records and (records[0].get("t") != "plan" or records[0].get("version") != VERSION):
            raise RemoteError(f"publish journal {path} was written by another version; move "
                              "it away to start the publish over")
        return records

    def start(self, plan: dict[str, Any]) -> None:
        """Begin a new journal with ``plan`` (replacing any old one atomically and durably)."""
        self._file.start([{"t": "plan", "version": VERSION, **plan, **self.context}])

    def reopen(self) -> None:
        """Continue appending to an existing journal."""
        self._file.reopen()

    def append(self, record: dict[str, Any], *, durable: bool = True) -> None:
        """Append one record (thread-safe); ``durable``: fdatasync it before returning.

        A part's records are not synced one by one: a kill keeps them (they
        are in the page cache), and one that a power cut loses costs that
        part being matched by its MD5 or sent again, never a wrong object.
        """
        try:
            self._file.append(record, durable=durable)
        except ValueError:  # not open
            raise RemoteError(f"publish journal {self.path} is not open") from None

    def close(self) -> None:
        """Close the journal (it stays on disk for a resume)."""
        self._file.close()

    def remove(self) -> None:
        """Close and delete the journal (the publish committed, or was given up)."""
        self._file.remove()
