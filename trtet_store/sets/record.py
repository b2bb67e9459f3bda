"""The member record: which files a fetched member was released with, kept beside them.

The ``.ptd`` format has no checksum of its own, and the runtime finds data
files only by the paths it is given: nothing in a ``.pte`` says which
``foundation.ptd`` it was released with. ``fetch_set`` writes
``.trtet-set.json`` beside the member's files, in the same transaction: the
set, the member, and each file's name, size, xxh3-128 and xxh3-64 per
chunk, as the set manifest has them. :func:`verify_member` reads the files
back against it (``trtet-store verify FILE.pte`` does, when the record is
there), so a ``.ptd`` swapped, rewritten or damaged since is named.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import NotOursError, digest_file, read_ours
from trtet_store.remote.jsondoc import loads
from trtet_store.sets.manifest import MemberEntry, member_file_problem

log = logging.getLogger("trtet_store.sets")

#: The record's name beside the files (one of trtet_store's own names: never a program's).
RECORD = ".trtet-set.json"
FORMAT = "trtet-store-set-member"
#: The most bytes a record may hold (a member of many files: a chunk digest per MiB each).
RECORD_MAX_BYTES = 16 * 1024 * 1024
#: How the one rule names the record in its refusal.
WHAT = "set record"


def record_bytes(url: str, member: str, version: str, entry: MemberEntry,
                 chunk_size: int) -> bytes:
    """The record of ``member`` of the set at ``url`` (manifest ETag ``version``)."""
    doc = {"format": FORMAT, "version": 1, "set": url, "member": member,
           "set_version": version, "chunk_size": chunk_size,
           "files": [{"name": f.name, "size": f.size, "xxh3": f.blob,
                      "chunks": list(f.chunks)} for f in entry.files]}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


@dataclass
class MemberCheck:
    """What :func:`verify_member` found: ``problems`` empty when every file is the released one."""

    directory: Path
    set: str = ""
    member: str = ""
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "set": self.set, "member": self.member,
                "files": self.files, "problems": self.problems, "ok": self.ok}


def _read(path: Path) -> bytes:
    """The record's bytes under the one rule (:func:`~trtet_store.io.read_ours`): opened
    without following a link or waiting on a FIFO, a regular file of ours, capped."""
    return read_ours(path, limit=RECORD_MAX_BYTES, what=WHAT)


def read_record(directory: os.PathLike | str,
                left_alone: list[str] | None = None) -> dict[str, Any] | None:
    """The record beside a member's files, or None where there is none (or none readable).

    A record we did not make (another user's, a link, a FIFO, too big) is
    reported in one line (logged at WARNING, and appended to ``left_alone``
    when given) and ignored: nothing is removed by it.
    """
    path = Path(directory) / RECORD
    try:
        doc = loads(_read(path), "the member record")
    except NotOursError as exc:
        log.warning("%s", exc)
        if left_alone is not None:
            left_alone.append(str(exc))
        return None
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(
        doc.get("files"), list) and isinstance(doc.get("chunk_size"), int)
    return doc if ok else None


def remove_unlisted(directory: Path, old: dict[str, Any] | None, keep: set[str], *,
                    needed: Callable[[str], bool] | None = None) -> list[str]:
    """Remove the files the previous member's record lists and the new member does not.

    Only a name a member's file may have (a plain ``.pte``, plain ``.ptd``
    names: :func:`~trtet_store.sets.manifest.member_file_problem`) is
    considered, and only a regular file of ours still byte for byte what
    was placed (its size and xxh3-128 as recorded) is removed: one changed
    since is someone's, and stays; so does one ``needed(name)`` says another
    program of the directory needs (asked after the files before it in the
    record, the previous ``.pte`` first, are gone). ``old`` is a record
    :func:`read_record` read under the one rule (ours). Called once the new
    files and record are in place; a failure is logged.
    """
    removed: list[str] = []
    if old is None:
        return removed
    for f in old["files"]:
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or name in keep or (
                member_file_problem(name, program=True) is not None
                and member_file_problem(name, program=False) is not None):
            continue
        path = directory / name
        if needed is not None and needed(name):
            continue
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                    st.st_size != f.get("size") or \
                    digest_file(path, old["chunk_size"], False)[0] != f.get("xxh3"):
                log.info("%s: kept (changed since the previous member placed it)", path)
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: the previous member's file could not be removed: %s", path, exc)
            continue
        removed.append(os.fspath(path))
    return removed


def verify_member(directory: os.PathLike | str) -> MemberCheck:
    """Check the files beside the record against the digests they were released with.

    Parameters
    ----------
    directory : path-like
        Where ``fetch_set`` placed the member.

    Returns
    -------
    MemberCheck
        One problem per file that is missing, not a regular file, of another
        size, or of other bytes (which chunk first differs).

    Raises
    ------
    FileNotFoundError
        No record there (not a member fetched by ``fetch_set``).
    NotOursError
        The record is not one we made (another user's, a link, a FIFO, too
        big): one line, and it is not read.
    ValueError
        A record that cannot be read.
    """
    where = Path(directory)
    raw = _read(where / RECORD)
    doc = loads(raw, "the member record")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or \
            not isinstance(doc.get("files"), list):
        raise ValueError(f"{where / RECORD} is not a trtet-store member record")
    chunk_size = doc.get("chunk_size")
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"{where / RECORD}: chunk_size {chunk_size!r}")
    check = MemberCheck(where, str(doc.get("set", "")), str(doc.get("member", "")))
    for f in doc["files"]:
        name = f.get("name")
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{where / RECORD}: a file name {name!r}")
        check.files.append(name)
        path = where / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            check.problems.append(f"{name}: missing (the member was released with it)")
            continue
        if not stat.S_ISREG(st.st_mode):
            check.problems.append(f"{name}: not a regular file (a link or other)")
            continue
        if st.st_size != f.get("size"):
            check.problems.append(f"{name}: {st.st_size} bytes, released with {f.get('size')}")
            continue
        digest, chunks, _ = digest_file(path, chunk_size, False)
        if digest != f.get("xxh3"):
            first = next((i for i, (a, b) in enumerate(zip(chunks, f.get("chunks", ()),
                                                           strict=False)) if a != b), None)
            at = f" (from byte {first * chunk_size})" if first is not None else ""
            check.problems.append(f"{name}: not the file member {check.member!r} was released "
                                  f"with: xxh3-128 {digest}, released {f.get('xxh3')}{at}")
    return check
