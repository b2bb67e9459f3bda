"""Finish or undo writes that a dead process left behind, from their journals alone."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.io import fs, transfer
from trtet_store.io.errors import StuckJournalError, UnsafeLockFileError
from trtet_store.io.journal import (
    DONE,
    PLACING,
    PUBLISHING,
    ROLLING_BACK,
    UNPUBLISHING,
    IncompleteJournal,
    Journal,
    JournalError,
    Plan,
    journals_in,
)
from trtet_store.io.lock import ConcurrentWriteError, lock_file, release, try_lock, unlock_file
from trtet_store.io.names import (
    STAGING_DIR,
    internal_stem,
    is_dest_lock,
    journal_token,
    lock_path_of_stem,
    parse_journal,
    probe_pid,
    temp_token,
)
from trtet_store.io.orphans import describe_orphan, list_orphans
from trtet_store.io.owned import NotOursError
from trtet_store.io.replay import complete_placement, finish, publish, undo, unpublish
from trtet_store.io.safedir import check_staging_directory
from trtet_store.io.units import format_mib

log = logging.getLogger("trtet_store.recovery")


@dataclass
class Outcome:
    """What recovery did with one interrupted write.

    ``action`` is ``"rolled forward"`` (the new files were published),
    ``"rolled back"`` (every source restored, destinations as before),
    ``"busy"`` (a live process still owns it), ``"removed stray"`` (a temp
    or backup file no journal needed), ``"removed incomplete journal"`` (its
    writer died while writing the plan, before doing anything else),
    ``"gone"`` (another recovery finished it meanwhile), ``"kept"`` (a
    journal recovery cannot read, or another user's, left for a person),
    ``"not ours"`` (a journal we did not make: another user's, a link, a
    FIFO, too big, or one whose plan names a path outside its directory and
    ours; ``detail`` says which, and it is left alone, never read or acted on),
    ``"damaged"`` (a complete journal that cannot be read: ``detail`` says
    what to do), ``"stuck"`` (a write that can be neither finished nor
    rolled back, done as far as it goes: ``detail`` and ``error``, a
    :class:`StuckJournalError`, name the missing file and what was done to
    the rest), ``"abandoned"`` (a stuck or damaged write given up with
    ``abandon=True``: ``detail`` says what was deleted) or ``"orphan"`` (a
    staged blob of a dead store, kept; ``journal`` is the blob file and
    ``detail`` its size, age and recorded metadata).
    """

    journal: Path
    action: str
    outputs: list[str]
    detail: str = ""
    #: For ``"stuck"``: the error that says why (raised where a write must not go ahead).
    error: StuckJournalError | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, object]:
        """The outcome as a JSON-ready dict (what ``trtet-store recover --json`` prints)."""
        return {
            "journal": os.fspath(self.journal),
            "action": self.action,
            "outputs": list(self.outputs),
            "detail": self.detail,
        }


#: What a refused staging directory's line tells the user of recover to do.
RECOVER_STAGING_TODO = "remove it (trtet_store did not make it), then recover again"


def recover(directory: os.PathLike | str, *, abandon: bool = False) -> list[Outcome]:
    """Finish or undo every interrupted write whose journal is in ``directory``.

    A write that reached ``publishing`` is rolled forward (its files were
    complete and durable). One that was still placing is rolled forward when
    its temp file and sources agree with the journal (the move is finished and
    verified), otherwise rolled back, every source byte-identical again.
    Idempotent; a write whose process is alive is left alone.

    A write that can be neither finished nor rolled back, because a file it
    needs is gone (a blob's staging directory was deleted in the middle of
    its move, say), is done as far as it goes and reported ``"stuck"``: the
    detail names the missing file, says what was done to the rest, and what
    is kept (the journal, a temp file holding bytes of it). It does not
    block new writes of its destination once it is rolling back. It stays
    until ``abandon=True`` gives it up.

    A journal that is not ours is reported ``"not ours"`` and left alone, never read
    past its owner check nor acted on: another user's, a link, a FIFO, one over
    :data:`~trtet_store.io.journal.JOURNAL_LIMIT` bytes, or one whose plan names a path
    that no write of ours there would (outside its directory and our own directories,
    or a temp, backup or pin not named for its token). So is another user's file at a
    temp or lock name: never removed as a stray.

    It also reports, without touching them, the staged blobs of dead stores
    (orphans) in ``directory``, in the directories of the blobs the
    recovered writes used, and in ``directory/.trtet-staging``: they are
    kept until taken over (``BlobStore.adopt_orphan``) or removed
    (``BlobStore.remove_orphans``).

    Parameters
    ----------
    directory : path-like
        The output directory of the interrupted write(s).
    abandon : bool
        Give up what recovery cannot finish: a stuck write's journal, and
        the temp and backup files it kept, are deleted (``"abandoned"``;
        the detail says what was given up), and so is a journal that cannot
        be read (``"damaged"``), whose temp files then go as strays. Writes
        that can be finished or rolled back are, as without it.

    Returns
    -------
    list of Outcome

    Raises
    ------
    UnsafeDirectoryError
        ``directory/.trtet-staging`` is a link, another user's directory, or
        writable by group or others: nothing is read or written, there or
        anywhere (a write rolled back would put its sources back in it).
    """
    directory = Path(directory).absolute()
    check_staging_directory(directory / STAGING_DIR, todo=RECOVER_STAGING_TODO)
    outcomes = []
    # The staging directory compile_and_save uses beside its outputs.
    blob_dirs = {directory, directory / STAGING_DIR}
    for path in journals_in(directory):
        try:
            journal = Journal.open_if_abandoned(path)
        except FileNotFoundError:
            continue  # another recovery finished it meanwhile
        except (NotOursError, UnsafeLockFileError) as exc:
            outcomes.append(_not_ours(path, exc))
            continue
        except PermissionError as exc:
            outcomes.append(_not_permitted(path, exc))
            continue
        except IncompleteJournal as exc:
            try:
                outcomes.append(_remove_incomplete(path, exc))
            except (NotOursError, UnsafeLockFileError) as bad:
                outcomes.append(_not_ours(path, bad))
            except PermissionError as perm:
                outcomes.append(_not_permitted(path, perm))
            continue
        except JournalError as exc:
            outcomes.append(_abandon_damaged(path, exc) if abandon else
                            Outcome(path, "damaged", [os.fspath(_journal_dest(path) or path)],
                                    str(exc)))
            continue
        if journal is None:
            outcomes.append(Outcome(path, "busy", [], "a live process holds its lock"))
            continue
        try:
            blob_dirs.update(Path(p).parent for p in journal.plan.sources())
            outcome = _recover_one(journal)
            if outcome.action == "stuck" and abandon:
                outcome = _abandon(journal, outcome)
            outcomes.append(outcome)
        finally:
            journal.close()
    outcomes.extend(_remove_strays(directory))
    for d in sorted(blob_dirs):
        for o in list_orphans(d):
            outcomes.append(Outcome(o.path, "orphan", [], describe_orphan(o)))
    for o in outcomes:
        # Said once, here: the CLI prints the outcomes, and a library's log
        # must not say the same thing a second time.
        level = (logging.WARNING if o.action in ("rolled back", "damaged", "stuck", "abandoned",
                                                 "not ours")
                 else logging.INFO)
        log.log(level, "recover %s: %s %s %s", o.journal, o.action, o.outputs, o.detail)
    return outcomes


def recover_destination(dest: Path) -> list[Outcome]:
    """Recover abandoned writes of ``dest`` before a new write of it starts.

    Interrupted writes of other files in the directory are left alone (their
    journals still need their files) and reported in the log. A stuck write
    of ``dest`` (see :func:`recover`) that is rolling back can no longer
    change ``dest``: the new write goes ahead and the journal stays for
    ``recover(..., abandon=True)``. One that might still publish (it was
    placing or publishing when recovery got stuck) would overwrite the new
    file if it were ever finished, so the new write is refused with
    :class:`StuckJournalError`, which says what is missing.

    A journal that is not ours (another user's, a link, a FIFO, too big, or
    one whose plan names a path outside its directory and ours: see
    :meth:`Journal.open_if_abandoned`) is never read further nor replayed,
    whatever file its name or plan names; the write goes ahead and the
    journal is named in a warning.
    """
    mine = []
    for path in journals_in(dest.parent):
        ours = _journal_stem(path) == internal_stem(dest.name)
        try:
            journal = Journal.open_if_abandoned(path)
        except FileNotFoundError:
            continue  # another recovery finished it meanwhile
        except (NotOursError, UnsafeLockFileError) as exc:
            log.warning("ignoring %s (writing %s)", exc, dest)
            continue
        except PermissionError:
            if ours:
                raise
            log.warning("ignoring the journal %s: not permitted to open it, and it is not "
                        "about %s", path, dest)
            continue
        except IncompleteJournal as exc:
            if ours:
                # Our caller holds dest's lock: no live writer of dest can own it.
                try:
                    mine.append(_remove_incomplete(path, exc, dest_locked=True))
                except (NotOursError, UnsafeLockFileError) as bad:  # swapped meanwhile
                    log.warning("ignoring %s (writing %s)", bad, dest)
            continue
        except JournalError:
            if ours:
                raise  # it may describe where bytes of dest's last write are
            log.warning("ignoring the unreadable journal %s: it is not about %s", path, dest)
            continue
        if journal is None:
            continue
        try:
            if any(o.dest == os.fspath(dest) for o in journal.plan.outputs):
                log.warning("found an interrupted write of %s (%s); recovering it first", dest,
                            path)
                outcome = _recover_one(journal)
                if outcome.action == "stuck":
                    if journal.state != ROLLING_BACK:
                        raise outcome.error  # type: ignore[misc]
                    log.warning("%s; it can no longer change %s, so the new write of it goes "
                                "ahead", outcome.detail, dest)
                mine.append(outcome)
            else:
                log.warning("found an interrupted write of %s in %s (journal %s, state %s); "
                            "leaving it and the files it needs alone; run `trtet-store "
                            "recover %s` to finish or undo it",
                            ", ".join(o.dest for o in journal.plan.outputs), dest.parent,
                            path.name, journal.state, dest.parent)
        finally:
            journal.close()
    return mine


def _not_ours(path: Path, exc: OSError) -> Outcome:
    """A journal we did not make (or a plan naming paths no write of ours makes): left alone."""
    dest = _journal_dest(path)
    reason = exc.reason if isinstance(exc, NotOursError) else exc.strerror
    return Outcome(path, "not ours", [os.fspath(dest)] if dest else [],
                   f"{reason}; left alone" if isinstance(exc, NotOursError) else reason)


def _not_permitted(path: Path, exc: OSError) -> Outcome:
    """A journal (or its destination's lock) of another user: theirs to recover."""
    dest = _journal_dest(path)
    try:
        owner = f"uid {os.stat(path).st_uid}"
    except OSError:
        owner = "another user"
    return Outcome(path, "kept", [os.fspath(dest)] if dest else [],
                   f"not permitted to recover it ({exc.strerror}): it belongs to {owner}, who "
                   "can run `trtet-store recover` on this directory")


def _journal_stem(path: Path) -> str | None:
    """The internal stem (see :func:`names.internal_stem`) of the journal's first destination."""
    parsed = parse_journal(path.name)
    return parsed[0] if parsed is not None else None


def _journal_dest(path: Path) -> Path | None:
    """The destination a journal's name says it writes first (its lock guards the journal).

    For a name too long to keep whole this is its shortened stem: good for
    messages and for finding the lock, which is named after the same stem.
    """
    stem = _journal_stem(path)
    return path.with_name(stem) if stem is not None else None


def _remove_incomplete(path: Path, exc: IncompleteJournal, *,
                       dest_locked: bool = False) -> Outcome:
    """Delete a journal whose plan never got written, unless its writer may be alive.

    A writer locks its destination before it creates the journal and keeps
    the lock until the journal is gone; only between creating the journal and
    locking it is a live writer's journal empty. So with the destination's
    lock in hand, an incomplete journal is a dead writer's, which did nothing
    else yet: no temp, no pin, no byte moved.
    """
    dest = _journal_dest(path)
    if dest is None:
        return Outcome(path, "kept", [], f"{exc}; its name names no destination, so it is "
                       "left for a person to look at")
    lock_fd = -1
    lock_path = lock_path_of_stem(dest.parent, dest.name)  # dest.name is the stem here
    if not dest_locked:
        try:
            lock_fd = lock_file(lock_path, dest)
        except ConcurrentWriteError:
            return Outcome(path, "busy", [os.fspath(dest)],
                           "a live writer of its destination may still be creating it")
    try:
        journal = Journal.open_if_abandoned(path)
        if journal is not None:  # it was complete after all (written since): recover it
            try:
                return _recover_one(journal)
            finally:
                journal.close()
    except FileNotFoundError:
        return Outcome(path, "gone", [os.fspath(dest)], "another recovery removed it")
    except IncompleteJournal:
        log.warning("removing %s: %s; its writer died before it did anything", path, exc)
        with contextlib.suppress(FileNotFoundError):
            fs.calls.unlink(os.fspath(path))
        fs.fsync_dir(path.parent)
        return Outcome(path, "removed incomplete journal", [os.fspath(dest)],
                       f"{exc}; its writer died before it did anything")
    finally:
        if lock_fd >= 0:
            unlock_file(lock_fd, lock_path)
    return Outcome(path, "busy", [os.fspath(dest)], "a live process holds its lock")


def _recover_one(journal: Journal) -> Outcome:
    """Finish or undo one abandoned write; ``"stuck"``, with its error, where neither can."""
    try:
        return _finish_or_undo(journal)
    except OSError as exc:
        error = exc if isinstance(exc, StuckJournalError) else _stuck(journal.plan, exc)
        return Outcome(journal.path, "stuck", [o.dest for o in journal.plan.outputs],
                       f"journal state {journal.state}; {error.strerror}", error=error)


def _stuck(plan: Plan, exc: OSError) -> StuckJournalError:
    """The error of a recovery that failed for a reason other than a missing file."""
    kept = [o.temp for o in plan.outputs if os.path.exists(o.temp)]
    return StuckJournalError(
        [f"{exc}"], "The files are as that failure left them.", kept,
        os.path.dirname(plan.outputs[0].dest), filename=exc.filename,
        code=exc.errno or errno.EIO, retry=True)


def _finish_or_undo(journal: Journal) -> Outcome:
    plan = journal.plan
    outputs = [o.dest for o in plan.outputs]
    if journal.state in (PUBLISHING, DONE):
        publish(plan)
        action, detail = "rolled forward", f"journal state {journal.state}"
    elif journal.state == PLACING and (why := _finish_placement(plan)) is None:
        journal.mark(PUBLISHING)
        publish(plan)
        action, detail = "rolled forward", "temp file and sources agreed with the journal"
    else:
        detail = f"journal state {journal.state}"
        if journal.state == PLACING:
            detail += f"; {why}"
            journal.mark(ROLLING_BACK)
        elif journal.state == UNPUBLISHING:
            unpublish(plan)
            journal.mark(ROLLING_BACK)
        undo(plan)
        action = "rolled back"
        back = sorted({p.source for o in plan.outputs for p in o.payloads if p.consumed})
        if back:
            # The writer died, and its store with it: the next store opened in
            # that directory would collect these as stale. Say where they are.
            detail += (f"; the blobs it was consuming are back in place, as they were: "
                       f"{', '.join(back)}; their store is gone, so they are kept as "
                       "orphans: take them over with BlobStore.adopt_orphan, or remove "
                       "them with BlobStore.remove_orphans")
    if action == "rolled forward":
        if journal.state != DONE:
            # Every output is in place: from here on nothing of it can change a
            # destination, whatever the cleanup runs into.
            journal.mark(DONE)
        finish(plan)
    journal.remove()
    return Outcome(journal.path, action, outputs, detail)


def _abandon(journal: Journal, stuck: Outcome) -> Outcome:
    """Give up a stuck write: delete its temp and backup files and its journal, saying what went.

    A write still placing is first rolled back as far as it goes, so that
    every source that can have its bytes back has them; what the deleted
    files held is then what is given up.
    """
    plan = journal.plan
    if journal.state == PLACING:
        journal.mark(ROLLING_BACK)
        with contextlib.suppress(OSError):
            undo(plan)
    rolled_back = journal.state == ROLLING_BACK
    given_up = []
    for out in plan.outputs:
        for path, what in ((out.temp, "its new content"), (out.backup, "the old file")):
            if not path:
                continue
            try:
                st = os.lstat(path)  # a backup may be a replaced symlink
            except FileNotFoundError:
                continue
            short = []
            for p in out.payloads:
                try:
                    have = os.stat(p.source).st_size
                except FileNotFoundError:
                    have = None
                if p.placement in ("move", "insert") and have != p.size:
                    short.append(p.source)
            held = (f"bytes moved out of {', '.join(short)}" if path == out.temp and short
                    else what)
            fs.calls.unlink(path)
            given_up.append(f"{path} ({format_mib(st.st_blocks * 512)} on disk: {held})")
    journal.remove()
    outputs = ", ".join(o.dest for o in plan.outputs)
    dests = ("the destinations keep what they had before the write" if rolled_back else
             f"the destinations are as recovery left them ({outputs}); the write was "
             f"{journal.state} when it got stuck")
    detail = (f"abandoned the write, which was stuck ({stuck.error.problems[0]}); gave up "
              + ("; ".join(given_up) if given_up else "no file but the journal")
              + f"; {dests}")
    return Outcome(journal.path, "abandoned", stuck.outputs, detail)


def _abandon_damaged(path: Path, exc: JournalError) -> Outcome:
    """Delete a journal that cannot be read, as asked; its temp files then go as strays."""
    dest = _journal_dest(path)
    lock_fd = -1
    if dest is not None:
        lock_path = lock_path_of_stem(dest.parent, dest.name)
        try:
            lock_fd = lock_file(lock_path, dest)
        except ConcurrentWriteError:
            return Outcome(path, "damaged", [os.fspath(dest)], f"{exc}; not abandoned: a live "
                           "writer of its destination holds its lock")
    try:
        with contextlib.suppress(FileNotFoundError):
            fs.calls.unlink(os.fspath(path))
        fs.fsync_dir(path.parent)
    finally:
        if lock_fd >= 0:
            unlock_file(lock_fd, lock_path)
    return Outcome(path, "abandoned", [os.fspath(dest)] if dest else [],
                   f"deleted the unreadable journal ({exc}); whatever bytes of its write were "
                   "only in its temp file are given up with it (removed as a stray)")


def _finish_placement(plan: Plan) -> str | None:
    """Finish the interrupted placement; None when done, else why it must be rolled back.

    The check before it covers what was already placed; the rest of each
    source is verified only as it moves. A source changed after staging (or
    an I/O error) is found there, and then the write is rolled back like the
    writer itself would have done: the sources' lengths still say where
    every byte is, so the rollback can start from any step. So is a clone
    that cannot be cloned again and whose copy would not fit: that is found
    before the copy writes a byte (:class:`InsufficientSpaceError`, said in
    the outcome's detail), not by running out of space in the middle of it.
    """
    why = _cannot_roll_forward(plan)
    if why is not None:
        return why
    try:
        complete_placement(plan)
    except OSError as exc:
        log.warning("cannot finish the interrupted write of %s (%s); rolling it back",
                    ", ".join(o.dest for o in plan.outputs), exc)
        return f"finishing the placement failed: {exc}"
    return None


def _cannot_roll_forward(plan: Plan) -> str | None:
    """Why the interrupted placement cannot be finished, or None if it can."""
    for out in plan.outputs:
        try:
            st = os.stat(out.temp)
        except FileNotFoundError:
            return f"temp file {out.temp} is missing"
        if st.st_size != out.size:
            return f"temp file {out.temp} is {st.st_size} bytes, planned {out.size}"
        fd = fs.calls.open(out.temp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for i in out.inline:
                if i.digest is None:
                    if out.inline_synced:
                        continue  # synced before the journal said so
                    return (f"the inline bytes of {out.temp} were never recorded as on "
                            "disk (cut while they were written)")
                if transfer.chunk_digest(fs.pread_exact(fd, i.size, i.offset)) != i.digest:
                    return f"inline bytes at {i.offset} of {out.temp} did not reach the disk"
            for p in out.payloads:
                try:
                    length = os.stat(p.source).st_size
                except FileNotFoundError:
                    if p.placement != "move":
                        return f"source {p.source} is missing"
                    # Deleted after it was moved whole (its directory removed,
                    # say)? Then every byte of it is in the temp file.
                    try:
                        transfer.verify_range(fd, p.offset, 0, p.size, p.chunk_size,
                                              p.chunk_digests, "moved bytes in temp", out.temp)
                    except (OSError, ValueError):
                        return (f"source {p.source} is missing, and the temp file does not "
                                "hold all of its bytes")
                    if p.chunk_digests is None:
                        return f"source {p.source} is missing"
                    continue
                if length != p.size and (p.placement != "move" or length % p.step):
                    return f"source {p.source} is {length} bytes, not a step boundary"
                if p.placement == "move" and length < p.size:
                    try:
                        transfer.verify_range(fd, p.offset, length, p.size, p.chunk_size,
                                              p.chunk_digests, "moved bytes in temp", out.temp)
                    except (OSError, ValueError) as exc:
                        return f"moved bytes of {p.source} in the temp file: {exc}"
        finally:
            fs.calls.close(fd)
    return None


def _remove_strays(directory: Path) -> list[Outcome]:
    """Temp and backup files whose journal is gone were never needed by anyone.

    Nor are destination locks nobody holds, or capability probes of writers
    that are gone.

    A writer creates its journal before its temp file and removes the journal
    only after the temp is renamed or deleted. So the directory is listed
    first and the journals after: a temp file listed while its writer was
    alive has a journal then. (The other way round, a writer starting in
    between had its temp file taken for a stray and deleted, with the bytes
    it had moved into it.)
    """
    entries = list(directory.iterdir())
    live = {journal_token(p.name) for p in journals_in(directory)}
    outcomes = []
    euid = os.geteuid()
    for f in entries:
        token = temp_token(f.name)
        pid = probe_pid(f.name)
        if token is None and pid is None and not is_dest_lock(f.name):
            continue
        try:
            if os.lstat(f).st_uid != euid:
                continue  # another user's (planted, or theirs to recover): left alone
        except FileNotFoundError:
            continue
        if (token is not None and token not in live) or (pid is not None and not _alive(pid)):
            try:
                fs.calls.unlink(os.fspath(f))
            except FileNotFoundError:
                pass
            except PermissionError:
                continue  # another user's, in a sticky shared directory
        elif not (is_dest_lock(f.name) and _remove_unheld_lock(f)):
            continue
        outcomes.append(Outcome(f, "removed stray", [], "no journal or live writer needs it"))
    return outcomes


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a capability probe of a live writer is its own)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_unheld_lock(lock_path: Path) -> bool:
    """Delete a destination lock file that no live writer holds; whether it was deleted.

    It is unlinked while we hold its lock. Checking first and unlinking after
    would let a writer lock it in between and then hold a lock on a deleted
    file, which guards nothing: a second writer would create a new lock file
    and both would write the destination. A writer that opens it while we
    hold it is refused (ConcurrentWriteError) or, if it gets the lock after
    the unlink, sees the file was replaced and takes a fresh one.
    """
    try:
        fd = try_lock(lock_path, create=False, readonly=True)
    except FileNotFoundError:
        return False  # gone, or already replaced by a writer's own lock file
    except PermissionError:
        return False  # another user's, not readable by us: theirs to remove
    except UnsafeLockFileError:
        return False  # a link or a FIFO planted at a lock's name: never ours, left alone
    if fd is None:
        return False  # a live writer holds it
    if os.fstat(fd).st_uid != os.geteuid():
        release(fd)
        return False  # another user's (swapped in since our lstat): left alone
    try:
        os.unlink(lock_path)
    except (FileNotFoundError, PermissionError):
        return False  # gone, or another user's in a sticky shared directory
    finally:
        release(fd)
    return True
