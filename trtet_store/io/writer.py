"""Writing files as one transaction: :func:`write_file` and :func:`write_files`.

The public entry points of the storage engine's writer. The steps
(validate, preflight, journal, place, verify, publish, release, and
rollback) are :class:`~trtet_store.io.transaction.Transaction`'s; the
placement ladder and the free-space budget are in :mod:`trtet_store.io.ladder`,
the report types in :mod:`trtet_store.io.report`. Everything that was
importable from here still is.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence

from trtet_store.io.ladder import PLACEMENTS, SLACK_BYTES
from trtet_store.io.layout import Piece
from trtet_store.io.options import UNSET, Progress, WriteOptions, resolve
from trtet_store.io.report import PlacementRecord, WriteReport
from trtet_store.io.transaction import (
    DEFAULT_CHUNK_SIZE,
    AutoChunk,
    ProgressCallback,
    Transaction,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "AutoChunk",
    "PLACEMENTS",
    "SLACK_BYTES",
    "PlacementRecord",
    "Progress",
    "ProgressCallback",
    "Transaction",
    "WriteOptions",
    "WriteReport",
    "write_file",
    "write_files",
]


def write_file(path: os.PathLike | str, pieces: Iterable[Piece], *,
               options: WriteOptions | None = None, consume: bool = UNSET,
               chunk_size: int | str | AutoChunk | None = UNSET,
               progress: ProgressCallback | None = UNSET,
               placements: Collection[str] | str | None = UNSET,
               timeout: float | None = UNSET) -> WriteReport:
    """Write the concatenation of ``pieces`` to ``path`` as one transaction.

    Parameters
    ----------
    path : path-like
        The destination. It holds its old content, or none, until the new file
        is complete and durable, then the new file replaces it atomically.
    pieces : iterable of bytes, Blob or ExternalFile
        The content in order.
    options : WriteOptions, optional
        The five options below as one object, handed down unchanged. The
        keywords still work (for one release); one given both ways with
        different values is a ``TypeError``.
    consume : bool
        Allow moving :class:`Blob` pieces into the output (they are released
        afterwards) when they share the output's filesystem. Without it every
        source is left as it was.
    chunk_size : int, "auto" or AutoChunk, optional
        The most extra disk a move may use (default 64 MiB: three steps of a
        third of that, rounded to whole digest chunks of its blob), and a
        copy's largest window. ``"auto"`` (or ``AutoChunk(limit=...)``) takes
        at most the limit and halves it, down to 3 MiB, until the write fits
        the free space: a nearly full disk still takes a move, in smaller steps.
    progress : callable, optional
        Called with a :class:`~trtet_store.io.Progress` (``.done``, ``.total``
        payload bytes) as bytes land. A callable that needs two positional
        arguments is still called ``progress(done, total)`` (for one release;
        decided once from its signature, see :func:`trtet_store.io.options.progress_caller`).
    placements : collection of str, optional
        Limit the ladder (``clone``, ``insert``, ``move``, ``copy``; copy is
        always allowed), e.g. to compare placements in a benchmark. Default:
        every placement the filesystem allows, best first. One placement may
        be given as a string.
    timeout : float, optional
        Seconds to wait for another write of the same destination to finish.
        Default: do not wait (raise :class:`ConcurrentWriteError` at once).

    Returns
    -------
    WriteReport

    Raises
    ------
    InsufficientSpaceError
        Before anything is created, when the chosen placements cannot fit.
    OSError
        Any other failure, after everything was rolled back.
    """
    opts = resolve(options, "write_file", consume=consume, chunk_size=chunk_size,
                   progress=progress, placements=placements, timeout=timeout)
    return write_files([(path, pieces)], options=opts)[0]


def write_files(outputs: Sequence[tuple[os.PathLike | str, Iterable[Piece]]], *,
                options: WriteOptions | None = None, consume: bool = UNSET,
                chunk_size: int | str | AutoChunk | None = UNSET,
                progress: ProgressCallback | None = UNSET,
                placements: Collection[str] | str | None = UNSET,
                timeout: float | None = UNSET,
                follow_links: bool | Sequence[bool] = True) -> list[WriteReport]:
    """Write several files as one transaction: all are published, or none changes.

    Every output is placed and verified in its temp file before the first
    rename. Parameters are as for :func:`write_file`, and:

    follow_links : bool or sequence of bool
        Per output (one bool: every output). True (default): a destination
        that is a symbolic link is written through to its target, as
        ``open(path, "wb")`` would. False: the link itself is replaced by the
        new file (a rename over it), its target never opened or written,
        and a dangling link never creates a file at its target. For names
        the caller did not choose (a fetched program's ``.ptd`` files).
    """
    opts = resolve(options, "write_files", consume=consume, chunk_size=chunk_size,
                   progress=progress, placements=placements, timeout=timeout)
    return Transaction(outputs, consume=opts.consume, chunk_size=opts.chunk_size,
                       progress=opts.progress, placements=opts.placements,
                       timeout=opts.timeout, follow_links=follow_links).run()
