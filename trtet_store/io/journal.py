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
from trtet_store.io.errors import IncompleteJournal, JournalError, UnsafeLockFileError
from trtet_store.io.lock import lock_the_file_at, release, try_lock
from trtet_store.io.owned import NotOursError, open_ours, ours_problem, read_fd_capped
from trtet_store.io.safedir import directory_problem
from trtet_store.io.units import MiB

VERSION = 1

#: The most bytes a journal may hold; a larger one is not read (refused on its ``fstat``
#: size, before a byte is read) and a write whose plan would need more is refused.
#: A plan is KiB: its largest part is the chunk digest list of each moved payload,
#: about 21 bytes per MiB moved, so 16 MiB covers some 390 GiB of moved bytes in one
#: write (half of it: amend lines may repeat a payload's plan).
JOURNAL_LIMIT = 16 * MiB

#: What the refusal of a journal calls it.
WHAT = "write journal"

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
        data = (plan.to_json() + "\n").encode()
        if len(data) > JOURNAL_LIMIT // 2:
            raise OSError(errno.EFBIG, f"the write's plan is {len(data)} bytes, over the "
                          f"{JOURNAL_LIMIT // 2} a journal may start with (recovery reads at "
                          f"most {JOURNAL_LIMIT}); write fewer or smaller payloads at once; "
                          "nothing was written", os.fspath(path))
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
            fs.pwrite_all(fd, data, 0)
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
        """Open a journal of ours whose writer is gone; None while a writer holds it.

        Only a journal that is ours is opened, locked and read: a regular file
        (not a link, not a FIFO) owned by the effective uid, at most
        :data:`JOURNAL_LIMIT` bytes, checked before its lock is taken and again
        on the locked descriptor it is then read from; and a plan whose every
        path is one a write of ours there would have made (:func:`plan_problem`).

        Raises
        ------
        FileNotFoundError
            The journal is gone: another recovery finished it meanwhile
            (possibly just before we got its lock).
        NotOursError
            It is not ours (another user's, a link, a FIFO, too big) or its plan
            names a path outside its directory and ours: left alone, never locked
            (another user's) nor acted on.
        """
        # Checked before the lock, so another user's file is never locked (nor
        # opened for writing); and again on the locked descriptor, which is the
        # one read (the name may have been swapped in between).
        try:
            with open_ours(path, limit=JOURNAL_LIMIT, what=WHAT):
                pass
        except PermissionError as exc:  # one we may not even read: whose is it?
            if isinstance(exc, NotOursError):
                raise
            try:
                uid = os.lstat(path).st_uid
            except OSError:
                raise exc from None
            if uid == os.geteuid():
                raise
            raise NotOursError(path, f"owned by uid {uid}, not by uid {os.geteuid()}",
                               WHAT) from None
        # A recovery that held the lock before us removes the journal before
        # unlocking it: try_lock refuses the lock of a deleted file.
        try:
            fd = try_lock(path, create=False)
        except UnsafeLockFileError:  # swapped for a link or a FIFO since the check
            raise NotOursError(path, "a symbolic link or not a regular file", WHAT) from None
        if fd is None:
            return None
        try:
            problem = ours_problem(os.fstat(fd), limit=JOURNAL_LIMIT)
            if problem is not None:
                raise NotOursError(path, problem, WHAT)
            plan, state = parse(read_fd_capped(fd, JOURNAL_LIMIT, path, WHAT), path)
            problem = plan_problem(path, plan)
            if problem is not None:
                raise NotOursError(path, problem, WHAT)
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
    """The plan and the last state recorded in a journal file of ours.

    Read as :func:`~trtet_store.io.owned.read_ours` reads (at most
    :data:`JOURNAL_LIMIT` bytes, from a descriptor checked to be a regular file
    of ours). The plan's paths are not checked here: :meth:`Journal.open_if_abandoned`
    does that before anything acts on them.

    Raises
    ------
    NotOursError
        Another user's, a link, not a regular file, or over the limit.
    IncompleteJournal, JournalError
        As :func:`parse`.
    """
    with open_ours(path, limit=JOURNAL_LIMIT, what=WHAT) as fd:
        return parse(read_fd_capped(fd, JOURNAL_LIMIT, path, WHAT), path)


def parse(raw: bytes, path: Path) -> tuple[Plan, str]:
    """The plan and the last state recorded in a journal's bytes.

    Raises
    ------
    IncompleteJournal
        The plan line is missing or cut short (no newline ends it).
    JournalError
        The plan line is complete but unreadable: the journal is damaged
        (nested too deep for the parser included: never a RecursionError).
    """
    if b"\n" not in raw:
        raise IncompleteJournal(f"{path}: the plan was never completely written "
                                f"({len(raw)} bytes, no complete line)")
    lines = raw.split(b"\n")
    try:
        plan = Plan.from_json(lines[0].decode())
    except RecursionError:
        raise JournalError(path, "its plan is nested too deep to be a plan") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
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
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            break  # torn tail: the last complete state stands
    return plan, state


def plan_problem(path: Path, plan: Plan) -> str | None:
    """Why the plan of the journal at ``path`` names paths a write of ours there never
    would, or None when every path it acts on is one.

    Recovery renames, unlinks, links, truncates, chowns and chmods what a plan
    names, so each such path must lie where a write of ours puts it:

    - the first output is the destination the journal's name says, in the
      journal's own directory (the same directory, by device and inode);
    - every output's temp file and backup are that output's names for this
      journal's token (:func:`names.temp_path`, :func:`names.backup_path`), beside it;
    - every pin is ``.trtet-pin-<token>``;
    - every output, pin, and every source recovery writes (a move's, an
      insert's, a consumed one's) lies in the journal's directory or in a
      directory of ours checked as a staging directory is (owned by the
      effective uid, not a link, not writable by group or others), or under
      one of those where it is missing (a staging directory deleted since).

    A source that is only read (a copy's or a clone's, never consumed: the
    user's own file named in the write) may lie anywhere. Every path must be
    absolute and normal (no ``..``, ``.`` or ``//``).
    """
    parsed = names.parse_journal(path.name)
    if parsed is None:
        return "its name is not a write journal's"
    stem, token = parsed
    if plan.token != token:
        return f"its plan's token {plan.token!r} is not the one in its name"
    if not plan.outputs:
        return "its plan has no outputs"
    dirs = _Dirs(path.parent)
    first = plan.outputs[0].dest
    if not _normal(first):
        return f"its plan names {first!r}, not an absolute, normal path"
    if names.internal_stem(os.path.basename(first)) != stem:
        return f"its plan's first output {first} is not the file its name says"
    if not dirs.same_as_home(os.path.dirname(first)):
        return f"its plan's first output {first} is not in {path.parent}"
    for out in plan.outputs:
        for p in (out.dest, out.temp, out.backup):
            if p is not None and not _normal(p):
                return f"its plan names {p!r}, not an absolute, normal path"
        if not dirs.ours(os.path.dirname(out.dest)):
            return f"its plan names {out.dest}, outside {path.parent} and any directory of ours"
        dest = Path(out.dest)
        if out.temp != os.fspath(names.temp_path(dest, token)):
            return f"its plan names the temp file {out.temp}, not {dest}'s for its token"
        if out.backup is not None and out.backup != os.fspath(names.backup_path(dest, token)):
            return f"its plan names the backup {out.backup}, not {dest}'s for its token"
        for p in out.payloads:
            if p.placement in ("move", "insert") or p.consumed:
                if not _normal(p.source):
                    return f"its plan names {p.source!r}, not an absolute, normal path"
                if not dirs.ours(os.path.dirname(p.source)):
                    return (f"its plan names the source {p.source}, outside {path.parent} "
                            "and any directory of ours")
            elif not isinstance(p.source, str):
                return f"its plan names the source {p.source!r}, not a path"
    if not isinstance(plan.pins, list):
        return "its plan's pins are not a list"
    for pin in plan.pins:
        if not _normal(pin):
            return f"its plan names {pin!r}, not an absolute, normal path"
        if os.path.basename(pin) != f"{names.PIN_PREFIX}{token}":
            return f"its plan names the pin {pin}, not one of its token"
        if not dirs.ours(os.path.dirname(pin)):
            return f"its plan names the pin {pin}, outside {path.parent} and any directory of ours"
    return None


def _normal(p: object) -> bool:
    return (isinstance(p, str) and "\0" not in p and os.path.isabs(p)
            and os.path.normpath(p) == p)


class _Dirs:
    """The directories a plan may act in: the journal's own, and directories of ours."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._home_id: tuple[int, int] | None = None
        self._ours: dict[str, bool] = {}

    def same_as_home(self, d: str) -> bool:
        if d == os.fspath(self.home):
            ok = True
        else:
            try:
                st, home = os.stat(d), os.stat(self.home)
            except OSError:
                return False
            ok = (st.st_dev, st.st_ino) == (home.st_dev, home.st_ino)
        if ok:
            self._ours[d] = True
        return ok

    def ours(self, d: str) -> bool:
        """Whether ``d`` is the journal's directory, or a directory of ours (checked without
        following a link at its last component), or missing under one."""
        if d not in self._ours:
            self._ours[d] = self._check(d)
        return self._ours[d]

    def _check(self, d: str) -> bool:
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            parent = os.path.dirname(d)
            return parent != d and self.ours(parent)  # gone since: ours if its parent is
        except OSError:
            return False  # a link, or not a directory
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if self.same_as_home_id(st):
            return True
        return directory_problem(st, allow_sticky=False) is None

    def same_as_home_id(self, st: os.stat_result) -> bool:
        if self._home_id is None:
            try:
                home = os.stat(self.home)
            except OSError:
                return False
            self._home_id = (home.st_dev, home.st_ino)
        return (st.st_dev, st.st_ino) == self._home_id


def source_paths(path: Path) -> list[str]:
    """The source files a journal names (they must not be collected)."""
    plan, _ = read(path)
    return plan.sources()


def journals_in(directory: Path) -> list[Path]:
    """Journal files in ``directory``."""
    return sorted(Path(directory).glob(names.journal_glob()))
