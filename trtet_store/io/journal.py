"""The intent journal: what a write transaction is doing, durable before it acts.

A journal is a JSON-lines file beside the first output's temp file. Line one
is the plan (outputs, temp names, every payload's source, offset, size,
placement and chunk digests, every inline extent's digest); each later line
records a state the transaction reached. A torn last line is ignored: the
state before it still holds. Like SQLite's journal it knows files and bytes,
never programs or engines; recovery needs nothing but the journal and the
files it names.

The writer holds an exclusive ``flock`` on the journal for the transaction's
lifetime, so a recovery can tell a live transaction from a dead one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import xxhash

from trtet_store.io import fs, names
from trtet_store.io.errors import IncompleteJournal, JournalError
from trtet_store.io.lock import lock_the_file_at, release, try_lock
from trtet_store.io.units import MiB

VERSION = 1

# Journal.create tries again when its new, empty journal was removed before
# it was locked; a file removed this often is a bug elsewhere.
_CREATE_ATTEMPTS = 3

# States, in the order a transaction reaches them.
PLACING = "placing"  # sources may be partly moved; roll back, or forward if all agrees
PUBLISHING = "publishing"  # every output placed and verified; renames may have started
DONE = "done"  # every output published; only cleanup is left
# A failure before the commit point, in the order a rollback records them:
UNPUBLISHING = "unpublishing"  # renames may have happened; taking them back (every temp
#                                existed when they began, so a missing temp is a renamed one)
ROLLING_BACK = "rolling_back"  # no output renamed any more; giving the sources their bytes


@dataclass
class PayloadPlan:
    """One file-backed piece of an output."""

    source: str
    offset: int
    size: int
    placement: str
    reason: str
    chunk_size: int
    chunk_digests: list[int] | None
    step: int = 0
    consumed: bool = False
    # (st_dev, st_ino, size, mtime_ns, ctime_ns) of a blob as sealed; None for user files
    identity: list[int] | None = None
    # What the journal records instead of chunk_digests for a placement that
    # never reads the bytes (see digest_of_chunks).
    chunks_digest: int | None = None
    # An insert's host as it was before it became the output: [permission
    # bits, uid, gid], what a rollback gives back with the file.
    host_mode: list[int] | None = None
    # Where the payload starts in its source: non-zero only for a range of a
    # user's file (ExternalFile.range); a blob is always placed whole.
    source_offset: int = 0


@dataclass
class InlinePlan:
    """One in-memory piece, by digest (its bytes live only in the temp file).

    ``digest`` is None for the pieces of an output with many inline bytes
    (tensors saved from memory): digesting gigabytes cost more than syncing
    them before the placements, so :meth:`Journal.record_inline_synced` says
    they are durable instead. Without that record nothing vouches for them,
    and recovery rolls the write back (nothing destructive happened yet).
    """

    offset: int
    size: int
    digest: int | None


@dataclass
class OutputPlan:
    """One output file of the transaction."""

    dest: str
    temp: str
    backup: str | None
    size: int
    inline: list[InlinePlan] = field(default_factory=list)
    payloads: list[PayloadPlan] = field(default_factory=list)
    inline_synced: bool = False  # False in the plan line; a later journal line sets it


@dataclass
class Plan:
    """Everything a recovery needs to finish or undo a transaction."""

    token: str
    outputs: list[OutputPlan]
    pins: list[str] = field(default_factory=list)
    version: int = VERSION

    def to_json(self) -> str:
        # Not dataclasses.asdict: its deep copy of every chunk digest list was
        # most of the time of a 4 GiB clone or insert.
        return json.dumps(self, default=_fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("the plan is not a JSON object")
        if raw.get("version") != VERSION:
            raise ValueError(f"journal version {raw.get('version')!r}, expected {VERSION}")
        outputs = [
            OutputPlan(
                dest=o["dest"], temp=o["temp"], backup=o["backup"], size=o["size"],
                inline=[InlinePlan(**i) for i in o["inline"]],
                payloads=[PayloadPlan(**p) for p in o["payloads"]],
            )
            for o in raw["outputs"]
        ]
        return cls(token=raw["token"], outputs=outputs, pins=raw["pins"], version=VERSION)

    def sources(self) -> list[str]:
        return [p.source for o in self.outputs for p in o.payloads]


#: Placements that never read the payload: the journal keeps one digest of their
#: chunk digests instead of the list.
UNREAD = ("clone", "insert")


def digest_of_chunks(digests: Sequence[int]) -> int:
    """One xxh3-64 over a payload's chunk digests (little-endian u64s, in order).

    A clone or an insert never reads its payload, and a recovery that
    re-clones reads the whole range once, so one digest of the list checks
    it as well as the list does, and keeps the journal's size, written and
    synced before any placement, independent of the payload's: the list of a
    16 GiB blob is 16,384 digests, 350 KB of JSON, which made such a save
    take 7-10 ms longer than one of 256 MiB.
    """
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(digests)}Q", *digests))


def _fields(obj: object) -> dict:
    out = {f.name: getattr(obj, f.name) for f in fields(obj)}
    if isinstance(obj, PayloadPlan) and obj.placement in UNREAD and obj.chunk_digests is not None:
        out["chunks_digest"] = digest_of_chunks(obj.chunk_digests)
        out["chunk_digests"] = None
    return out


class Journal:
    """An open, locked journal file."""

    def __init__(self, path: Path, fd: int, plan: Plan, state: str) -> None:
        self.path = path
        self.fd = fd
        self.plan = plan
        self.state = state

    @classmethod
    def create(cls, path: Path, plan: Plan) -> Journal:
        """Write the plan durably (file and directory entry) and lock it.

        Until it is locked the new journal is empty, and a recovery that holds
        its destination's lock takes an empty journal for a dead writer's and
        removes it. A lock on that unlinked file would guard a plan no one can
        find after a crash, so the journal is locked, checked to be the file at
        its path, and created again if it is not (as :func:`try_lock` does).
        """
        for _ in range(_CREATE_ATTEMPTS):
            fd = fs.calls.open(os.fspath(path),
                               os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                               0o644)
            try:
                same = lock_the_file_at(fd, path, fcntl.LOCK_EX)
            except BaseException:
                release(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            if same:
                break
            release(fd)
        else:
            raise OSError(errno.ESTALE, f"the write journal was removed while it was created, "
                          f"{_CREATE_ATTEMPTS} times; nothing was written", os.fspath(path))
        try:
            fs.pwrite_all(fd, (plan.to_json() + "\n").encode(), 0)
            fs.calls.fsync(fd)
            fs.fsync_dir(path.parent)
        except BaseException:
            fs.calls.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return cls(path, fd, plan, PLACING)

    @classmethod
    def open_if_abandoned(cls, path: Path) -> Journal | None:
        """Open a journal whose writer is gone; None while a writer holds it.

        Raises
        ------
        FileNotFoundError
            The journal is gone: another recovery finished it meanwhile
            (possibly just before we got its lock).
        """
        # A recovery that held the lock before us removes the journal before
        # unlocking it: try_lock refuses the lock of a deleted file.
        fd = try_lock(path, create=False)
        if fd is None:
            return None
        try:
            plan, state = read(path)
        except BaseException:
            release(fd)
            raise
        return cls(path, fd, plan, state)

    def amend(self, output: int, payload: PayloadPlan) -> None:
        """Record, durably, that ``payload`` of output ``output`` is now placed otherwise.

        Written before the new placement changes a byte, so a recovery reads
        the plan the files follow (e.g. an insert that turned out impossible
        and became a move).
        """
        index = self.plan.outputs[output].payloads.index(payload)
        line = {"amend": {"output": output, "payload": index, "plan": _fields(payload)}}
        end = os.fstat(self.fd).st_size
        fs.pwrite_all(self.fd, (json.dumps(line, separators=(",", ":")) + "\n").encode(), end)
        fs.calls.fsync(self.fd)

    def record_inline_synced(self, output: int) -> None:
        """Record, durably, that output ``output``'s inline bytes are on disk in its temp file.

        Called after an fdatasync of the temp file and before any placement
        changes a source, for an output whose plan names its inline pieces
        without digests: the record, not a digest, then vouches for them.
        """
        line = {"inline_synced": output}
        end = os.fstat(self.fd).st_size
        fs.pwrite_all(self.fd, (json.dumps(line, separators=(",", ":")) + "\n").encode(), end)
        fs.calls.fsync(self.fd)
        self.plan.outputs[output].inline_synced = True

    def mark(self, state: str) -> None:
        """Record that the transaction reached ``state``, durably."""
        end = os.fstat(self.fd).st_size
        fs.pwrite_all(self.fd, (json.dumps({"state": state}) + "\n").encode(), end)
        fs.calls.fsync(self.fd)
        self.state = state

    def remove(self) -> None:
        """Delete the journal and its pins, then release the lock."""
        for pin in self.plan.pins:
            with contextlib.suppress(FileNotFoundError):
                fs.calls.unlink(pin)
        fs.calls.unlink(os.fspath(self.path))
        fs.fsync_dir(self.path.parent)
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            release(self.fd)
            self.fd = -1


def read(path: Path) -> tuple[Plan, str]:
    """The plan and the last state recorded in a journal file.

    Raises
    ------
    IncompleteJournal
        The plan line is missing or cut short (no newline ends it).
    JournalError
        The plan line is complete but unreadable: the journal is damaged.
    """
    fd = fs.calls.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while chunk := fs.calls.pread(fd, MiB, sum(len(p) for p in parts)):
            parts.append(chunk)
    finally:
        fs.calls.close(fd)
    raw = b"".join(parts)
    if b"\n" not in raw:
        raise IncompleteJournal(f"{path}: the plan was never completely written "
                                f"({len(raw)} bytes, no complete line)")
    lines = raw.split(b"\n")
    try:
        plan = Plan.from_json(lines[0].decode())
    except (ValueError, KeyError, TypeError) as exc:
        # KeyError: a field missing; TypeError: an unexpected one
        why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise JournalError(path, why) from None
    state = PLACING
    for line in lines[1:]:
        try:
            record = json.loads(line)
            if "amend" in record:
                a = record["amend"]
                plan.outputs[a["output"]].payloads[a["payload"]] = PayloadPlan(**a["plan"])
            elif "inline_synced" in record:
                plan.outputs[record["inline_synced"]].inline_synced = True
            else:
                state = record["state"]
        except (ValueError, KeyError, TypeError, IndexError):
            break  # torn tail: the last complete state stands
    return plan, state


def source_paths(path: Path) -> list[str]:
    """The source files a journal names (they must not be collected)."""
    plan, _ = read(path)
    return plan.sources()


def journals_in(directory: Path) -> list[Path]:
    """Journal files in ``directory``."""
    return sorted(Path(directory).glob(names.journal_glob()))
