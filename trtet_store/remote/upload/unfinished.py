"""The uploads a publish left open: list them, find interrupted publishes, give them up.

:func:`list_uploads` asks the server (every unfinished multipart upload
under a prefix); :func:`interrupted` and :func:`pending` read the local
journals (no request); :func:`abort` aborts an interrupted publish's
uploads and any other unfinished upload of its keys, then removes its
journals, under the journal's lock (never while its publish runs).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from trtet_store.remote.errors import RemoteError
from trtet_store.remote.s3 import S3, OpenUpload
from trtet_store.remote.upload.journal import (
    SUFFIX,
    Journal,
    default_dir,
    journal_path,
    journals_of,
)
from trtet_store.remote.url import RemoteURL

log = logging.getLogger(__name__)


def open_uploads(s3: S3, bucket: str, keys: list[str]) -> list[OpenUpload]:
    """The unfinished uploads of exactly these ``keys`` (not of keys they are a prefix of)."""
    out = []
    for k in keys:
        out += [u for u in s3.list_uploads(bucket, k) if u.key == k]
    return out


def list_uploads(url: str, *, endpoint_url: str | None = None) -> list[OpenUpload]:
    """Unfinished multipart uploads under ``url`` (``s3://bucket/prefix``; a bucket alone: all).

    They hold parts the bucket's owner pays for until they are completed or
    aborted (:func:`abort`).
    """
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"expected s3://bucket[/prefix], got {url!r}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    s3 = S3(endpoint_url)
    s3.check_bucket(bucket)
    return s3.list_uploads(bucket, prefix)


@dataclass(frozen=True)
class Interrupted:
    """An interrupted publish, as its journal names it (no request made)."""

    url: str
    endpoint: str
    journal: Path
    uploads: tuple[str, ...]  # the upload ids it opened
    sources: tuple[str, ...] = ()  # the folders of the local files it read


def _under(path: str, directory: Path) -> bool:
    try:
        Path(path).resolve().relative_to(directory)
    except ValueError:
        return False
    return True


def interrupted(journal_dir: os.PathLike | str | None = None, *,
                directory: os.PathLike | str | None = None) -> list[Interrupted]:
    """Every interrupted publish whose journal is in ``journal_dir`` (default: the usual one).

    Each is resumed by publishing the same source to the same URL again, or
    given up with :func:`abort`; until then its uploads hold parts the
    bucket's owner pays for.

    Parameters
    ----------
    journal_dir : path-like, optional
        Where the journals are.
    directory : path-like, optional
        Only the publishes that read local files in or under it (what
        ``trtet-store recover DIR`` reports); a publish of bytes held in
        memory alone names no folder and is then left out.
    """
    jdir = Path(journal_dir) if journal_dir is not None else default_dir()
    root = Path(directory).resolve() if directory is not None else None
    out = []
    for path in sorted(jdir.glob(f"*{SUFFIX}")) if jdir.is_dir() else []:
        try:
            records = Journal.read(path)
        except RemoteError as exc:
            log.warning("%s", exc)
            continue
        if not records:
            continue
        plan = records[0]
        sources = tuple(str(d) for d in plan.get("sources") or ())
        if root is not None and not any(_under(d, root) for d in sources):
            continue
        out.append(Interrupted(f"s3://{plan['bucket']}/{plan['key']}", plan["endpoint"], path,
                               tuple(r["upload_id"] for r in records if r.get("t") == "upload"),
                               sources))
    return out


def pending(url: str, *, endpoint_url: str | None = None,
            journal_dir: os.PathLike | str | None = None) -> Path | None:
    """The journal of an interrupted publish of ``url`` (None if there is none).

    ``endpoint_url`` is accepted for symmetry with :func:`abort`; a journal
    is the destination's whatever URL the server is reached through
    (:func:`~trtet_store.remote.upload.journal.journal_path`).
    """
    dest = RemoteURL.parse(url)
    if endpoint_url is not None and not isinstance(endpoint_url, str):
        raise TypeError(f"endpoint_url must be a str, not {type(endpoint_url).__name__}")
    jdir = Path(journal_dir) if journal_dir is not None else default_dir()
    path = journal_path(jdir, dest.bucket, dest.key)
    return path if Journal.read(path) else None


def abort(url: str, *, endpoint_url: str | None = None,
          journal_dir: os.PathLike | str | None = None) -> list[OpenUpload]:
    """Abort the interrupted publish of ``url`` and every unfinished upload of its objects.

    Aborts the uploads its journal names and any other unfinished upload of
    the program's key or of the objects the journal names, then removes the
    journal (and any older journal of the same destination). Returns what
    was aborted.

    Raises
    ------
    ConflictError
        A publish of ``url`` is running on this machine (it holds the
        journal's lock): stop it first; nothing was aborted.
    """
    dest = RemoteURL.parse(url)
    s3 = S3(endpoint_url)
    s3.check_bucket(dest.bucket)
    jdir = Path(journal_dir) if journal_dir is not None else default_dir()
    journal = Journal(journal_path(jdir, dest.bucket, dest.key))
    journal.lock(str(dest), dest.key)
    try:
        paths = [journal.path] + [p for p in journals_of(jdir, dest.bucket, dest.key)
                                  if p != journal.path]
        keys = {dest.key}
        for path in paths:
            records = Journal.read(path)
            if records:
                keys |= {o["key"] for o in records[0].get("objects", [])}
        aborted = []
        for u in open_uploads(s3, dest.bucket, sorted(keys)):
            s3.abort(dest.bucket, u.key, u.upload_id)
            aborted.append(u)
            log.info("aborted the unfinished upload %s of s3://%s/%s", u.upload_id,
                     dest.bucket, u.key)
        for path in paths:
            Journal(path).remove()
    finally:
        journal.unlock()
    return aborted
