"""Versioned writes: each save in a directory of its own, readers switched by one rename.

A transaction (:func:`~trtet_store.io.writer.write_files`) makes each file
appear atomically, and all of them together, but a reader opens the files one
by one: between its open of ``model.pte`` and its open of ``w.ptd`` a save
can replace both, and it gets the ``.pte`` of one save with the ``.ptd`` of
another. Serving systems avoid that with version directories, and so does
:func:`write_versioned`::

    out/model -> .versions/model-7          (a symlink, switched by rename(2))
    out/.versions/model-7/model.pte
    out/.versions/model-7/w.ptd
    out/.versions/model-6/...               (older versions, up to ``keep``)

Each save writes a new ``.versions/<link>-<n>/`` (one transaction, as
always), makes it durable, then points the link at it: a new symlink under a
temp name, ``rename`` over the link, ``fsync`` of the directory. A reader
resolves the link once (:func:`current_version`) and opens every file under
the directory it got, so it reads one save's set, never a mix; a version
directory is never changed once it is published. :func:`pinned_version`
also holds the version (a shared ``flock`` on its directory) so that it is
not removed while it is read: old versions beyond ``keep`` are removed only
when no reader holds them (an exclusive ``flock`` that is refused keeps it
until a later save), first renamed out of the way, then deleted.

Crashes: before the rename the link still names the old, complete version;
a version directory left by a dead writer is recovered at the next save of
the link (:func:`recover_versions`): its interrupted transaction is finished
or undone (a consumed blob is never lost), then a complete set newer than the
current one is switched to (as a transaction that reached publishing is
rolled forward), and an empty one removed.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import fs
from trtet_store.io.errors import ConcurrentWriteError
from trtet_store.io.lock import release, try_lock

log = logging.getLogger("trtet_store.versioned")

#: The directory, beside the link, that holds the versions.
VERSIONS_DIR = ".versions"
#: Versions kept by default, the current one included.
DEFAULT_KEEP = 3
_POLL = 0.05


@dataclass(frozen=True)
class VersionedWrite:
    """What :func:`write_versioned` did.

    Attributes
    ----------
    link : Path
        The symlink readers resolve; it now names ``version``.
    version : Path
        The new version's directory (``<dir>/.versions/<link name>-<number>``).
    number : int
        Its number.
    reports : list of WriteReport
        The transaction's reports, paths inside ``version``.
    removed : tuple of Path
        Old versions removed (beyond ``keep``), and dead writers' empty ones.
    pinned : tuple of Path
        Old versions beyond ``keep`` left because a reader holds them.
    recovered : tuple of str
        What :func:`recover_versions` did first, one line each.
    """

    link: Path
    version: Path
    number: int
    reports: list[Any]
    removed: tuple[Path, ...] = ()
    pinned: tuple[Path, ...] = ()
    recovered: tuple[str, ...] = field(default=())

    def path(self, name: str) -> Path:
        """The file ``name`` of this version."""
        return self.version / name


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(name) + r"-(\d+)")


def _check_link_name(link: Path) -> None:
    if not link.name or link.name.startswith(".") or "/" in link.name:
        raise ValueError(f"link name {link.name!r} must be a plain, visible file name")


def current_version(link: os.PathLike | str) -> Path:
    """The directory the link names now: open every file of one set under it.

    Parameters
    ----------
    link : path-like
        A link written by :func:`write_versioned`.

    Returns
    -------
    Path
        ``<dir>/.versions/<link name>-<n>``.

    Raises
    ------
    FileNotFoundError
        No version was ever switched to.
    ValueError
        ``link`` is not a symlink into its ``.versions`` directory.
    """
    link = Path(link)
    target = os.readlink(link)
    number = _number_of(link, target)
    if number is None:
        raise ValueError(f"{link} -> {target!r} is not a version written by trtet_store")
    return link.parent / VERSIONS_DIR / f"{link.name}-{number}"


def version_link(path: os.PathLike | str) -> Path:
    """The link a versioned write of ``path`` switches (``out/model.pte`` -> ``out/model``).

    Checks it before anything is written or built: refused if it exists and
    is not a link :func:`write_versioned` wrote.

    Raises
    ------
    FileExistsError
        The link's name is taken by something else.
    ValueError
        The name would make a hidden or empty link.
    """
    path = Path(path)
    link = path.parent / path.stem
    _check_link_name(link)
    _current_number(link)
    return link


def keep_of(versioned: bool | int) -> int | None:
    """How many versions a ``versioned=`` argument keeps: None for False (a plain write).

    ``True`` keeps :data:`DEFAULT_KEEP`; an integer >= 1 keeps that many.

    Raises
    ------
    ValueError
        Anything else (0, a negative number, another type).
    """
    if versioned is False:
        return None
    if versioned is True:
        return DEFAULT_KEEP
    if isinstance(versioned, int) and versioned >= 1:
        return versioned
    raise ValueError(f"versioned must be True, False or the number of versions to keep "
                     f"(>= 1), got {versioned!r}")


def _number_of(link: Path, target: str) -> int | None:
    m = re.fullmatch(re.escape(VERSIONS_DIR) + "/" + _pattern(link.name).pattern, target)
    return int(m.group(1)) if m else None


@contextlib.contextmanager
def pinned_version(link: os.PathLike | str, *, attempts: int = 100) -> Iterator[Path]:
    """The current version, held so that no save removes it while it is read.

    Takes a shared ``flock`` on the version's directory (the pruning of
    :func:`write_versioned` asks for an exclusive one without waiting and
    keeps a version it cannot get). A version removed between resolving
    the link and taking the lock is seen (its path no longer names the
    directory locked) and the link resolved again.

    Parameters
    ----------
    link : path-like
        A link written by :func:`write_versioned`.
    attempts : int
        How many times to resolve again before giving up.

    Yields
    ------
    Path
        The version's directory; open every file of the set under it.

    Raises
    ------
    FileNotFoundError
        No version, or every attempt raced a removal.
    """
    for _ in range(attempts):
        version = current_version(link)
        try:
            fd = try_lock(version, create=False, readonly=True, wait=True, shared=True)
        except FileNotFoundError:
            # Removed after the link moved on, or renamed away for removal while we
            # waited: resolve again.
            continue
        try:
            yield version
            return
        finally:
            release(fd)
    raise FileNotFoundError(errno.ENOENT, f"no version of {link} stayed long enough to pin "
                            f"({attempts} attempts)", os.fspath(link))


@contextlib.contextmanager
def _link_lock(versions: Path, name: str, timeout: float | None) -> Iterator[None]:
    """One versioned writer of a link at a time (the lock file stays: unlinking races)."""
    path = versions / f".{name}.lock"
    fd = fs.calls.open(os.fspath(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o644)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None or time.monotonic() >= deadline:
                    raise ConcurrentWriteError(
                        f"another process is writing a version of {versions.parent / name} "
                        f"(lock {path}); pass timeout= to wait for it") from None
                time.sleep(_POLL)
        yield
    finally:
        fs.calls.close(fd)


def _versions_of(versions: Path, name: str) -> dict[int, Path]:
    pattern = _pattern(name)
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(versions):
            m = pattern.fullmatch(entry.name)
            if m and entry.is_dir(follow_symlinks=False):
                found[int(m.group(1))] = Path(entry.path)
    return found


def _current_number(link: Path) -> int | None:
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise FileExistsError(errno.EEXIST, f"{link} exists and is not a version link: "
                                  "refusing to replace it", os.fspath(link)) from None
        raise
    number = _number_of(link, target)
    if number is None:
        raise FileExistsError(errno.EEXIST, f"{link} -> {target!r} is a symlink trtet_store "
                              "did not write: refusing to replace it", os.fspath(link))
    return number


def _switch(link: Path, number: int) -> None:
    """Point ``link`` at version ``number``: a new symlink renamed over it, then the dir synced."""
    tmp = link.parent / f".{link.name}.switch-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        fs.calls.unlink(os.fspath(tmp))
    fs.calls.symlink(f"{VERSIONS_DIR}/{link.name}-{number}", os.fspath(tmp))
    try:
        fs.calls.rename(os.fspath(tmp), os.fspath(link))
    except BaseException:
        with contextlib.suppress(OSError):
            fs.calls.unlink(os.fspath(tmp))
        raise
    fs.fsync_dir(link.parent)


def _settle(version: Path) -> str:
    """Recover a version directory a dead writer left: ``complete``, ``empty`` or ``busy``."""
    from trtet_store.io.recovery import recover

    outcomes = recover(version)
    if any(o.action in ("busy", "kept", "damaged", "stuck") for o in outcomes):
        return "busy"
    names = [e.name for e in os.scandir(version)]
    if any(n.startswith(".") for n in names):
        return "busy"  # something recovery left for a person: leave it all alone
    return "complete" if names else "empty"


def recover_versions(link: os.PathLike | str, *, timeout: float | None = None) -> list[str]:
    """Finish what dead versioned writers of ``link`` left, as the next save does first.

    Removes stray switch symlinks and half-removed old versions; recovers
    each version directory newer than the current one (its interrupted
    transaction finished or undone, see :func:`trtet_store.io.recovery.recover`),
    then switches to the newest complete one (its files were all published)
    and removes empty ones. A directory recovery cannot settle (a live
    writer, a damaged journal) is left as it is.

    It takes the link's writer lock, as :func:`write_versioned` does.

    Parameters
    ----------
    link : path-like
        The link.
    timeout : float, optional
        Seconds to wait for a versioned write of ``link`` that is running;
        default: refuse at once with :class:`ConcurrentWriteError`.

    Returns
    -------
    list of str
        What was done, one line each.
    """
    link = Path(link)
    _check_link_name(link)
    versions = link.parent / VERSIONS_DIR
    if not versions.is_dir():
        return []  # no versioned write ever started here
    with _link_lock(versions, link.name, timeout):
        return _recover_versions(link)


def _recover_versions(link: Path) -> list[str]:
    """:func:`recover_versions` under the writer lock."""
    versions = link.parent / VERSIONS_DIR
    done: list[str] = []
    for entry in list(os.scandir(link.parent)):
        if entry.name.startswith(f".{link.name}.switch-") and entry.is_symlink():
            fs.calls.unlink(entry.path)
            done.append(f"removed the stray switch link {entry.name}")
    with contextlib.suppress(FileNotFoundError):
        for entry in list(os.scandir(versions)):
            if entry.name.startswith(f".trash-{link.name}-"):
                shutil.rmtree(entry.path)
                done.append(f"removed {entry.name}, an old version half removed")
    current = _current_number(link)
    for number, path in sorted(_versions_of(versions, link.name).items(), reverse=True):
        if current is not None and number <= current:
            break
        state = _settle(path)
        if state == "empty":
            path.rmdir()
            done.append(f"removed {path.name}: a dead writer's version with no files")
        elif state == "complete":  # the newest complete one: the loop goes downwards
            _switch(link, number)
            done.append(f"switched {link.name} to {path.name}: its writer died after "
                        "publishing every file")
            current = number
        else:
            done.append(f"left {path.name}: recovery could not settle it (see trtet_store"
                        f".recover({os.fspath(path)!r}))")
    for line in done:
        log.warning("%s: %s", link, line)
    return done


def _prune(versions: Path, name: str, current: int, keep: int) -> tuple[list[Path], list[Path]]:
    """Remove versions older than the ``keep`` newest; keep any a reader holds."""
    removed, pinned = [], []
    older = sorted((n for n in _versions_of(versions, name) if n < current), reverse=True)
    for number in older[keep - 1:]:
        path = versions / f"{name}-{number}"
        try:
            if any(e.name.startswith(".") for e in os.scandir(path)):
                continue  # a dead writer's files recovery left for a person: never deleted
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pinned.append(path)  # a reader holds it: a later save removes it
                continue
            trash = versions / f".trash-{name}-{number}"
            fs.calls.rename(os.fspath(path), os.fspath(trash))
        finally:
            os.close(fd)
        fs.fsync_dir(versions)
        shutil.rmtree(trash)
        removed.append(path)
    return removed, pinned


def write_versioned(outputs: Sequence[tuple[os.PathLike | str, Iterable[Any]]], *,
                    link: os.PathLike | str | None = None, keep: int = DEFAULT_KEEP,
                    timeout: float | None = None, **write_options: Any) -> VersionedWrite:
    """Write the files of one set as a new version and switch ``link`` to it atomically.

    Parameters
    ----------
    outputs : sequence of (path, pieces)
        As for :func:`~trtet_store.io.writer.write_files`; every path in one
        directory ``D``. Each file is written as ``D/.versions/<link
        name>-<n>/<its name>``, not at its path.
    link : path-like, optional
        The symlink readers resolve, in ``D``; default ``D/<stem of the
        first output>`` (``out/model.pte`` -> ``out/model``). Refused if it
        exists and is not a version link.
    keep : int
        Versions kept, the new one included (at least 1); older ones are
        removed unless a reader holds them (:func:`pinned_version`).
    timeout : float, optional
        Seconds to wait for another versioned write of the same link; default:
        refuse at once with :class:`ConcurrentWriteError`.
    **write_options
        ``consume``, ``chunk_size``, ``progress``, ``placements`` of
        :func:`~trtet_store.io.writer.write_files`; anything else is refused.

    Returns
    -------
    VersionedWrite

    Raises
    ------
    TypeError
        An unknown keyword.
    ValueError
        No outputs, outputs in several directories or of one name, a bad link
        name or ``keep``.
    FileExistsError
        ``link`` exists and is not a link this function wrote.
    ConcurrentWriteError
        Another versioned write of ``link`` holds it.
    """
    from trtet_store.io.writer import write_files

    unknown = set(write_options) - {"consume", "chunk_size", "progress", "placements"}
    if unknown:
        raise TypeError(f"write_versioned() got unexpected keyword argument(s) {sorted(unknown)}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
    outputs = [(Path(p), pieces) for p, pieces in outputs]
    if not outputs:
        raise ValueError("write_versioned needs at least one output")
    directory = outputs[0][0].parent
    if any(p.parent != directory for p, _ in outputs):
        raise ValueError(f"every output of a versioned write must be in one directory; got "
                         f"{sorted({os.fspath(p.parent) for p, _ in outputs})}")
    names = [p.name for p, _ in outputs]
    if len(set(names)) != len(names):
        raise ValueError(f"outputs of one name: {names}")
    link = directory / outputs[0][0].stem if link is None else Path(link)
    _check_link_name(link)
    if link.parent != directory:
        raise ValueError(f"the link {link} must be in the outputs' directory {directory}")
    if link.name in names:
        raise ValueError(f"the link {link} has the name of an output")
    versions = directory / VERSIONS_DIR
    _current_number(link)  # refuse a foreign file before creating anything
    if not versions.is_dir():
        versions.mkdir(exist_ok=True)
        fs.fsync_dir(directory)
    with _link_lock(versions, link.name, timeout):
        recovered = tuple(_recover_versions(link))
        current = _current_number(link)
        number = max([current or 0, *_versions_of(versions, link.name)]) + 1
        version = versions / f"{link.name}-{number}"
        version.mkdir()
        fs.fsync_dir(versions)
        log.info("writing version %d of %s (%d files) in %s", number, link, len(outputs),
                 version)
        try:
            reports = write_files([(version / p.name, pieces) for p, pieces in outputs],
                                  timeout=timeout, **write_options)
        except BaseException:
            # The transaction changed nothing; an empty directory goes. If a rollback
            # left something, the next save's recovery deals with it.
            with contextlib.suppress(OSError):
                version.rmdir()
            raise
        fs.fsync_dir(version)
        _switch(link, number)
        removed, pinned = _prune(versions, link.name, number, keep)
    if pinned:
        log.info("%s: kept %s beyond keep=%d: a reader holds them", link,
                 [p.name for p in pinned], keep)
    return VersionedWrite(link, version, number, reports, tuple(removed), tuple(pinned),
                          recovered)
