"""A fetch's ``.pte``/``.ptd`` rules: which ``.ptd`` files a program reads, and what that forbids.

ExecuTorch names ``.ptd`` files by tag, so two programs of one directory
share names. Before a write, a ``.ptd`` another ``.pte`` there needs is not
replaced (:func:`check_ptds_to_write`); after it, the previous version's
``.ptd`` files the new manifest no longer names are removed unless needed
(:func:`remove_stale`); a ``.pte`` fetched without a manifest that reads
from ``.ptd`` files is refused, naming the objects that hold its keys
(:func:`refuse_program_without_data`). Each reads headers and flatbuffers
only (:mod:`trtet_store.inspector.neighbours`, no torch): this module is
the download half's one user of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

from trtet_store.io import STAGING_DIR, MiB, fsync_dir
from trtet_store.remote.download.plan import ObjectPlan
from trtet_store.remote.download.reader import Reader
from trtet_store.remote.download.staging import Staging, fetch_id, run_key, write_new_file
from trtet_store.remote.errors import MissingDataError
from trtet_store.remote.manifest import manifest_key

# The fetch's logger, as before these rules left receive.py.
log = logging.getLogger("trtet_store.remote.download.receive")

#: An XNNPACK weight key as its flatbuffer stores it: the SHA-256 of the bytes in
#: 64 hex digits, a u32 length before, a NUL after (as the verifier reads it).
_XNNPACK_KEY = re.compile(rb"\x40\x00\x00\x00([0-9a-f]{64})\x00")


def check_ptds_to_write(dest: Path, names: list[str], *, replace_needed: bool) -> None:
    """Refuse (``NeededByAnotherError``) to write a ``.ptd`` another ``.pte`` beside ``dest`` needs.

    ``names`` are the ``.ptd`` names the fetch writes; ``replace_needed``
    replaces them anyway (invariant 11).
    """
    from trtet_store.inspector.neighbours import check_neighbours

    check_neighbours(dest.parent, names, program=dest, replace_needed=replace_needed)


def remove_stale(dest: Path, url: str, names: list[str]) -> list[str]:
    """Remove the previous version's ``.ptd`` files named in ``names``, unless needed.

    Called once the new files are in place. A file another ``.pte`` of the
    directory needs (the new one included: the same check as before a
    write) is kept, and so is one that changed meanwhile into something
    the check cannot read; a failure to remove is logged, not raised (the
    new version is complete either way).
    """
    from trtet_store.inspector.neighbours import check_neighbours
    from trtet_store.io import NeededByAnotherError

    removed = []
    for name in names:
        path = dest.parent / name
        try:
            check_neighbours(dest.parent, [name], program=None)
        except NeededByAnotherError as exc:
            log.info("%s: %s is no longer in %s, but is kept: %s", dest, name,
                     url, exc.strerror)
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: could not remove %s, which %s no longer names: %s",
                        dest, path, url, exc)
            continue
        log.info("%s: removed %s (the previous version's; %s no longer names it)",
                 dest, path, url)
        removed.append(os.fspath(path))
    if removed:
        with contextlib.suppress(OSError):
            fsync_dir(dest.parent)
    return removed


def refuse_program_without_data(reader: Reader, url: str, key: str, dest: Path,
                                plan: ObjectPlan, stage: Staging) -> None:
    """A plain object that is a ``.pte`` reading data from ``.ptd`` files: refused.

    Without a manifest nothing says which ``.ptd`` files go with the
    program (a manifest deleted on the server, say), and fetching the
    ``.pte`` alone would be a program that does not load. What it needs
    is read from the staged bytes (:mod:`trtet_store.inspector.neighbours`,
    no torch); the ``.ptd`` objects beside it on the server that hold
    those keys are named. ``program_only=True`` fetches it anyway.
    """
    if not plan.runs or plan.runs[0].offset != 0 or plan.runs[0].size != plan.spec.size:
        return
    keys = keys_needed(stage.runs[run_key(plan.runs[0])].blob.path)
    if not keys:
        return
    holders = ptds_holding(reader, url, key, dest, keys)
    shown = ", ".join(repr(k if len(k) <= 24 else k[:16] + "...") for k in keys[:3])
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    where = (f"it needs {', '.join(holders)} (beside it on the server)" if holders else
             "no .ptd beside it on the server holds them")
    raise MissingDataError(
        f"{url} has no manifest ({manifest_key(key)}), and the program reads "
        f"{len(keys)} key(s) from .ptd files ({shown}{more}): {where}. Publish it again "
        "with its .ptd files (trtet-store publish writes the manifest that names them), or "
        "pass program_only=True (--program-only) to fetch the .pte alone; nothing was "
        "written", holders, keys)


def _ptd_head(reader: Reader, key: str) -> bytes | None:
    """The header and flatbuffer of the ``.ptd`` object ``key`` (where its keys are)."""
    head = reader.get_prefix(key, 64 << 10)
    if len(head) < 32:
        return None
    end = int.from_bytes(head[16:24], "little") + int.from_bytes(head[24:32], "little")
    if end > 64 * MiB:
        return None  # not a header this check reads; the refusal names the keys anyway
    return head if end <= len(head) else reader.get_prefix(key, end)


def ptds_holding(reader: Reader, url: str, key: str, dest: Path, keys: list[str]) -> list[str]:
    """Names of the ``.ptd`` objects beside the program ``key`` that hold any of ``keys``."""
    from trtet_store.inspector.neighbours import read_ptd_keys

    prefix = key.rpartition("/")[0]
    prefix = f"{prefix}/" if prefix else ""
    try:
        names = [k for k in reader.list_keys(prefix) if k.endswith(".ptd")]
    except Exception as exc:  # noqa: BLE001 - the refusal stands; only its detail is lost
        log.info("%s: could not list the .ptd objects beside it: %r", url, exc)
        return []
    out = []
    staging = dest.parent / STAGING_DIR
    for name in names:
        head = _ptd_head(reader, name)
        if head is None:
            continue
        tmp = staging / f"fetch-{fetch_id(dest)}-ptd-head.tmp"
        try:
            write_new_file(staging, tmp.name, head)
            if set(keys) & read_ptd_keys(tmp):
                out.append(name.rpartition("/")[2])
        except (OSError, ValueError):
            continue
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return out


def keys_needed(path: os.PathLike | str) -> list[str]:
    """The named-data keys the ``.pte`` at ``path`` reads from ``.ptd`` files, sorted.

    Its external tensors (by name) and the XNNPACK weight keys its delegate
    blobs name, less what it holds itself; empty for a file that is not a
    program (a plain object). Read with :mod:`trtet_store.inspector.neighbours`
    (headers and flatbuffer only, no torch).
    """
    from trtet_store.inspector.neighbours import read_program_needs, trt_engine_key

    needs = read_program_needs(path)
    if needs.unreadable is not None:
        return []
    keys = set(needs.external_tensors)
    for head in needs.delegate_heads:
        keys.update(m.group(1).decode() for m in _XNNPACK_KEY.finditer(head))
        engine_key = trt_engine_key(head)
        if engine_key:
            keys.add(engine_key)
    return sorted(keys - needs.own_keys)


def data_files_of(pte: Path) -> list[str]:
    """Names of the ``.ptd`` files beside ``pte`` that the program there reads keys from.

    Empty when there is no ``pte``, or it cannot be read: then nothing is
    known to be its data, and nothing is removed as such.
    """
    from trtet_store.inspector.neighbours import read_program_needs, read_ptd_keys

    if not pte.is_file():
        return []
    needs = read_program_needs(pte)
    if needs.unreadable is not None:
        return []
    out = []
    for p in sorted(pte.parent.glob("*.ptd")):
        try:
            keys = read_ptd_keys(p)
        except (OSError, ValueError):
            continue
        if needs.needed_of(keys):
            out.append(p.name)
    return out
