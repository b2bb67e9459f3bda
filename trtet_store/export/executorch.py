"""ExecuTorch adapter: an ``ExecutorchProgramManager`` as piece lists for :mod:`trtet_store.io`.

ExecuTorch 1.5.1 serializes a program eagerly into Cords: one for the ``.pte``
and one per ``.ptd`` tag. A Cord is a list of small ``bytes`` (headers,
flatbuffers, zero padding, in-memory segments) and ``FileBackedData`` payloads.
This module turns each into the ordered piece list the io layer writes, without
reading a payload byte, so the bytes written are exactly those of ExecuTorch's
own ``save(path)`` and ``write_tensor_data_to_file(outdir)``.

Which piece a ``FileBackedData`` becomes (ownership)
----------------------------------------------------
=========================================  ===============  =================
the payload's file is ...                  consume=False    consume=True
=========================================  ===============  =================
a live Blob of ours (attached by                Blob             Blob
:func:`add_blob_as_named_data`, or
``store.find(path)``)
owned by ExecuTorch (``cleanup=True`` /      ExternalFile     Blob (adopted)
``FileBackedData.move_from``)
the user's (no cleanup)                      ExternalFile     ExternalFile
=========================================  ===============  =================

Adoption (consume only) renames the file into a :class:`BlobStore` (``store``,
or by default a store in the file's own directory, so the rename never copies)
and transfers ownership: ExecuTorch's finalizers for the old name are detached,
the ``FileBackedData`` is re-pointed at the blob's path with no cleanup, and it
holds the Blob. From then on only the store can delete the file: when the
write consumes the blob, or when the blob is released (the FileBackedData, and
so the program, dropped). If the write fails, the program is still valid and
can be saved again. After a consuming write the payload is gone: the program's
Cord names a file that no longer exists, so neither ExecuTorch's ``save`` nor
ours can write that program again.

A Blob piece is not consumed by these functions: the io layer decides (it moves
blob pieces only under ``write_files(..., consume=True)``; otherwise clones or
copies them). An ExternalFile is always copied, never truncated.

Page-aligned payloads
---------------------
Pass ``ExecutorchBackendConfig(segment_alignment=4096)`` to ``to_executorch``:
the segment base and every segment offset are then multiples of 4096 in the
``.pte`` and in every ``.ptd`` (the per-entry ``alignment`` of named data is
*relative* to the segment base, so on its own it does not give absolute page
alignment). :func:`payload_extents` lists the absolute offsets.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.export.named_data import (  # noqa: F401 - add_blob_as_named_data re-exported
    PTD_SUFFIX,
    add_blob_as_named_data,
    ptd_file_name,
    ptd_paths,
)
from trtet_store.export.trt_blob import STAGED_ENGINE_MARKER
from trtet_store.io.options import UNSET, ProgressCallback, WriteOptions, resolve

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir.program import ExecutorchProgramManager

    from trtet_store.export._executorch_private import Cord, EngineView, FileBackedData
    from trtet_store.io.blobstore import Blob, BlobStore
    from trtet_store.io.layout import Piece
    from trtet_store.io.transaction import AutoChunk

#: Adjacent ``bytes`` pieces are joined while each is below this size; larger
#: in-memory segments (e.g. an XNNPACK delegate blob) stay separate pieces, so
#: merging never copies much memory.
MERGE_LIMIT = 64 * 1024


# --- pieces ----------------------------------------------------------------------


class _Converter:
    """Turns Cord pieces into io pieces; shares adoptions across the files of one call."""

    def __init__(self, *, consume: bool, store: BlobStore | None) -> None:
        self.consume = consume
        self.store = store
        self._stores: dict[str, BlobStore] = {}
        self._adopted: dict[str, Blob] = {}  # old path -> blob
        # Every FileBackedData re-pointed at an adopted blob, with its old path.
        self._transfers: list[tuple[FileBackedData, str, Blob]] = []

    def _store_for(self, path: str) -> BlobStore:
        if self.store is not None:
            return self.store
        from trtet_store.io.blobstore import BlobStore

        directory = os.path.dirname(os.path.abspath(path))
        if directory not in self._stores:
            self._stores[directory] = BlobStore(directory)
        return self._stores[directory]

    def _live_blob(self, fbd: FileBackedData) -> Blob | None:
        from trtet_store.export import _executorch_private as priv

        blob = priv.attached_blob(fbd)
        if blob is None and self.store is not None:
            blob = self.store.find(priv.file_backed_path(fbd))
        if blob is not None and blob.closed:
            state = "consumed by an earlier write" if blob.consumed else "released"
            raise ValueError(
                f"payload {priv.file_backed_path(fbd)!r} was {state}; the program "
                "cannot be written again"
            )
        return blob

    def payload(self, fbd: FileBackedData | EngineView) -> Piece:
        """The piece for one payload; call after :func:`_precheck_payload`."""
        from trtet_store.export import _executorch_private as priv
        from trtet_store.io.layout import ExternalFile

        if isinstance(fbd, priv.EngineView):
            return fbd.blob
        path = priv.file_backed_path(fbd)
        blob = self._live_blob(fbd)
        if blob is not None:
            return blob
        if path in self._adopted:  # a second FileBackedData naming an adopted file
            blob = self._adopted[path]
            priv.transfer_to_blob(fbd, blob)
            self._transfers.append((fbd, path, blob))
            return blob
        if self.consume and priv.file_backed_owns_file(fbd):
            blob = self._store_for(path).adopt(path)
            if os.path.lexists(path):
                # The store is on another filesystem and copied the file: keep
                # ExecuTorch's file (it still owns it) and drop the copy.
                blob.close()
                return ExternalFile(Path(os.path.abspath(path)), len(fbd))
            priv.transfer_to_blob(fbd, blob)
            self._transfers.append((fbd, path, blob))
            self._adopted[path] = blob
            return blob
        return ExternalFile(Path(os.path.abspath(path)), len(fbd))

    def give_back(self) -> None:
        """Undo the adoptions no write consumed: each file back at its path, ExecuTorch's again.

        Releasing an adopted blob gives its file back to the path it was
        adopted from (see ``BlobStore.adopt``); the ``FileBackedData`` then
        reads from there and owns it, as before the call. A file whose name was
        taken meanwhile stays in the store as an orphan, and its
        ``FileBackedData`` keeps reading it there.
        """
        from trtet_store.export import _executorch_private as priv

        for fbd, path, blob in reversed(self._transfers):
            if blob.consumed:
                continue
            blob.close()
            if os.path.exists(path):
                priv.return_from_blob(fbd, path)
        self._transfers.clear()
        self._adopted.clear()
        self.close_own_stores()

    def close_own_stores(self) -> None:
        """Close the stores made for adoptions once none of their blobs is live.

        They sit in the payloads' own directories; a lock file left there
        until the garbage collector runs would be litter in the user's folder.
        """
        for directory, store in list(self._stores.items()):
            if all(b.closed for b in store.blobs()):
                store.close()
                del self._stores[directory]

    def pieces(self, cord: Cord) -> list[Piece]:
        from trtet_store.export import _executorch_private as priv

        out: list[Piece] = []
        run: list[bytes] = []
        for item in priv.cord_pieces(cord):
            if isinstance(item, bytes):
                if not item:
                    continue
                if len(item) < MERGE_LIMIT:
                    run.append(item)
                    continue
                _flush(run, out)
                out.append(item)
            else:
                _flush(run, out)
                out.append(self.payload(item))
        _flush(run, out)
        return out


def _flush(run: list[bytes], out: list[Any]) -> None:
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
        run.clear()


def _check_program(program: object) -> None:
    from executorch.exir.program import ExecutorchProgramManager

    if not isinstance(program, ExecutorchProgramManager):
        raise TypeError(
            f"expected an ExecutorchProgramManager (edge.to_executorch()), got "
            f"{type(program).__name__}"
        )


def program_layouts(
    program: ExecutorchProgramManager,
    path: os.PathLike | str | None,
    outdir: os.PathLike | str | None = None,
    *,
    consume: bool = False,
    store: BlobStore | None = None,
    include_ptd: bool = True,
) -> list[tuple[Path, list[Piece]]]:
    """The ``.pte`` and every ``.ptd`` of ``program`` as ``(path, pieces)`` for ``write_files``.

    No payload byte is read. Every check (program type, tags, name clashes,
    payload files present with their planned size) runs before any file is
    adopted, so a refused call changes nothing.

    Parameters
    ----------
    program : ExecutorchProgramManager
        The result of ``EdgeProgramManager.to_executorch()``.
    path : path-like or None
        Destination of the ``.pte`` (any name, unlike ExecuTorch's ``save``).
        None: only the ``.ptd`` files.
    outdir : path-like, optional
        Directory of the ``.ptd`` files; default the ``.pte``'s directory.
    consume : bool
        Plan for a consuming write: ExecuTorch-owned payload files are adopted
        into a BlobStore (see the module docstring). Pass the same flag to
        ``write_files``.
    store : BlobStore, optional
        Where adopted files go (rename if same filesystem, else the file is
        left alone and copied), and where ``store.find`` looks for our blobs
        not made by :func:`add_blob_as_named_data`. Default: a store in each
        payload file's own directory.
    include_ptd : bool
        False: only the ``.pte``.

    Returns
    -------
    list of (pathlib.Path, list of pieces)
        The ``.pte`` first (if ``path``), then one entry per ``.ptd`` tag in
        ExecuTorch's order. Pieces are ``bytes``, ``Blob`` or ``ExternalFile``;
        their concatenation is byte-for-byte what ExecuTorch writes.

    Raises
    ------
    ValueError
        A bad or clashing ``.ptd`` tag, a ``.ptd`` named like the ``.pte``, a
        payload resized since serialization, or an already consumed blob.
    FileNotFoundError
        A payload file is gone.
    ExecutorchPrivateAPIError
        The installed ExecuTorch does not look like 1.4.1 or 1.5.1 inside.
    """
    return _plan(program, path, outdir, consume=consume, store=store,
                 include_ptd=include_ptd)[0]


def _plan(
    program: ExecutorchProgramManager,
    path: os.PathLike | str | None,
    outdir: os.PathLike | str | None,
    *,
    consume: bool,
    store: BlobStore | None,
    include_ptd: bool,
) -> tuple[list[tuple[Path, list[Piece]]], _Converter]:
    """:func:`program_layouts`, and the converter that can give its adoptions back."""
    from trtet_store.export import _executorch_private as priv

    _check_program(program)
    if path is None and outdir is None:
        raise ValueError("give the .pte path, or outdir for the .ptd files")
    pte_path = Path(path) if path is not None else None
    base = Path(outdir) if outdir is not None else pte_path.parent  # type: ignore[union-attr]

    plan: list[tuple[Path, Cord]] = []
    if pte_path is not None:
        plan.append((pte_path, priv.pte_cord(program)))
    if include_ptd:
        cords = priv.ptd_cords(program)
        for tag, ptd in ptd_paths(program, base).items():
            plan.append((ptd, cords[tag]))
    _check_distinct([p for p, _ in plan])

    conv = _Converter(consume=consume, store=store)
    # Validate every payload before adopting any: a refusal must change nothing.
    for dest, cord in plan:
        for item in priv.cord_pieces(cord):
            if not isinstance(item, bytes):
                _precheck_payload(conv, item)
            elif STAGED_ENGINE_MARKER in item:
                raise ValueError(
                    f"{dest}: the program holds a TensorRT engine token where its engine "
                    "should be: it was serialized without delegate segments "
                    "(ExecutorchBackendConfig(extract_delegate_segments=False)); "
                    "call to_executorch() with extract_delegate_segments=True")
    try:
        return [(dest, conv.pieces(cord)) for dest, cord in plan], conv
    except BaseException:
        conv.give_back()
        raise


def _precheck_payload(conv: _Converter, fbd: FileBackedData | EngineView) -> None:
    from trtet_store.export import _executorch_private as priv

    if isinstance(fbd, priv.EngineView):
        fbd.check_live()
        if len(fbd) != fbd.blob.size:
            raise ValueError(f"staged engine {fbd.blob.path}: planned {len(fbd)} bytes, "
                             f"blob has {fbd.blob.size}")
        return
    path = priv.file_backed_path(fbd)
    blob = conv._live_blob(fbd)
    planned = len(fbd)
    if blob is not None:
        if blob.size != planned:
            raise ValueError(f"payload {path!r}: planned {planned} bytes, blob has {blob.size}")
        return
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"payload file {path!r} of the program is missing") from None
    if size != planned:
        raise ValueError(
            f"payload file {path!r} has {size} bytes; ExecuTorch planned the layout with {planned}"
        )


def _check_distinct(paths: Sequence[Path]) -> None:
    seen: set[str] = set()
    for p in paths:
        key = os.path.normpath(os.path.abspath(p))
        if key in seen:
            raise ValueError(f"two outputs of the program would be written to {p}")
        seen.add(key)


def pte_pieces(
    program: ExecutorchProgramManager,
    *,
    consume: bool = False,
    store: BlobStore | None = None,
) -> list[Piece]:
    """The pieces of the ``.pte`` alone (what ``program.save`` writes)."""
    ((_, pieces),) = program_layouts(
        program, "program.pte", consume=consume, store=store, include_ptd=False
    )
    return pieces


def ptd_layouts(
    program: ExecutorchProgramManager,
    outdir: os.PathLike | str,
    *,
    consume: bool = False,
    store: BlobStore | None = None,
) -> list[tuple[Path, list[Piece]]]:
    """The ``.ptd`` files alone (what ``write_tensor_data_to_file(outdir)`` writes)."""
    return program_layouts(program, None, outdir, consume=consume, store=store)


def payload_extents(pieces: Iterable[Piece]) -> list[tuple[int, int, Piece]]:
    """``(absolute offset, size, piece)`` of every file-backed piece, in file order."""
    out = []
    offset = 0
    for piece in pieces:
        size = len(piece) if isinstance(piece, (bytes, bytearray)) else piece.size
        if not isinstance(piece, (bytes, bytearray)):
            out.append((offset, size, piece))
        offset += size
    return out


# --- writing ------------------------------------------------------------------------


def save_program(
    program: ExecutorchProgramManager,
    path: os.PathLike | str,
    outdir: os.PathLike | str | None = None,
    *,
    options: WriteOptions | None = None,
    consume: bool = UNSET,
    chunk_size: int | str | AutoChunk | None = UNSET,
    progress: ProgressCallback | None = UNSET,
    store: BlobStore | None = None,
    placements: Collection[str] | str | None = UNSET,
    timeout: float | None = UNSET,
    versioned: bool | int = False,
    replace_needed: bool = False,
) -> list[Any]:
    """Write the ``.pte`` and every ``.ptd`` of ``program`` as one transaction.

    Preflight covers all files together, every payload is placed in its temp
    file before the first rename, and a failure before publish leaves every
    destination as it was. Errors propagate (ExecuTorch's ``save`` logs and
    swallows them). Any output name works.

    Parameters
    ----------
    program : ExecutorchProgramManager
    path : path-like
        The ``.pte``.
    outdir : path-like, optional
        Directory of the ``.ptd`` files (``<tag>.ptd``); default ``path``'s.
    options : trtet_store.io.WriteOptions, optional
        ``consume``, ``chunk_size``, ``progress``, ``placements`` and
        ``timeout`` as one object, handed to the write unchanged. The
        keywords below still work (for one release); one given both ways
        with different values is a ``TypeError``.
    consume : bool
        Move what the program owns (our blobs, ExecuTorch-owned payload files)
        instead of copying; the user's files are always copied. A consumed
        program cannot be written again.
    chunk_size, progress, placements
        As for :func:`trtet_store.io.writer.write_files`.
    store : BlobStore, optional
        See :func:`program_layouts`.
    timeout : float, optional
        Seconds to wait for another write of the same files to finish;
        default: refuse at once with ``ConcurrentWriteError``.
    versioned : bool or int
        Write the set as a new version, ``<dir>/.versions/<stem>-<n>/``, and
        switch the symlink ``<dir>/<stem>`` to it atomically, so that readers
        who resolve it once (``trtet_store.io.current_version`` or
        ``pinned_version``) never get the ``.pte`` of one save with the
        ``.ptd`` of another; ``True`` keeps 3 versions, a number that many
        (see :func:`trtet_store.io.write_versioned`). ``outdir`` must then be
        ``path``'s directory.
    replace_needed : bool
        Replace a ``.ptd`` that another ``.pte`` of its directory needs. By
        default such a write is refused before anything is written
        (ExecuTorch names ``.ptd`` files by tag, so two programs exported with
        one tag collide); the ``.pte`` at ``path`` itself is being replaced,
        so what it needs does not count. See
        :func:`trtet_store.inspector.neighbours.check_neighbours`.

    Returns
    -------
    list of WriteReport
        The ``.pte`` first, then the ``.ptd`` files (in the new version's
        directory when ``versioned``).

    Raises
    ------
    NeededByAnotherError
        A ``.ptd`` to be written would replace one another program needs.
    """
    from trtet_store.io.versioned import keep_of

    opts = resolve(options, "save_program", consume=consume, chunk_size=chunk_size,
                   progress=progress, placements=placements, timeout=timeout)
    keep = keep_of(versioned)
    planned = _plan(program, path, outdir, consume=opts.consume, store=store, include_ptd=True)
    return _write(program, planned, opts, keep, pte=Path(path), replace_needed=replace_needed)


def _write(program: ExecutorchProgramManager,
           planned: tuple[list[tuple[Path, list[Piece]]], _Converter], opts: WriteOptions,
           keep: int | None = None, *,
           pte: Path | None = None, replace_needed: bool = False) -> list[Any]:
    from trtet_store.export import _executorch_private as priv
    from trtet_store.io.versioned import write_versioned
    from trtet_store.io.writer import write_files

    layouts, conv = planned
    try:
        if keep is None:  # a versioned write puts its .ptd files in a directory of their own
            _check_neighbours([p for p, _ in layouts], pte, replace_needed)
        if keep is None:
            reports = write_files(layouts, options=opts)
        else:
            reports = write_versioned(layouts, keep=keep, consume=opts.consume,
                                      chunk_size=opts.chunk_size, progress=opts.progress,
                                      placements=opts.placements, timeout=opts.timeout).reports
        conv.close_own_stores()
        return reports
    except BaseException:
        conv.give_back()  # a refused or rolled-back write changes nothing
        raise
    finally:
        # A consumed engine's file is gone or truncated: unmap it, so that a later
        # write of this program fails with an error instead of a fault.
        for view in priv.engine_views([priv.pte_cord(program),
                                       *priv.ptd_cords(program).values()]):
            if view.blob.consumed and not view.closed:
                view.close()


def save(
    program: ExecutorchProgramManager,
    path: os.PathLike | str,
    *,
    options: WriteOptions | None = None,
    consume: bool = UNSET,
    chunk_size: int | str | AutoChunk | None = UNSET,
    progress: ProgressCallback | None = UNSET,
    store: BlobStore | None = None,
    placements: Collection[str] | str | None = UNSET,
    timeout: float | None = UNSET,
) -> Any:
    """Write the ``.pte`` of ``program`` (what ``program.save(path)`` writes), atomically.

    Returns the WriteReport. See :func:`save_program` for the parameters.
    """
    opts = resolve(options, "save", consume=consume, chunk_size=chunk_size,
                   progress=progress, placements=placements, timeout=timeout)
    planned = _plan(program, path, None, consume=opts.consume, store=store, include_ptd=False)
    return _write(program, planned, opts)[0]


def write_tensor_data(
    program: ExecutorchProgramManager,
    outdir: os.PathLike | str,
    *,
    options: WriteOptions | None = None,
    consume: bool = UNSET,
    chunk_size: int | str | AutoChunk | None = UNSET,
    progress: ProgressCallback | None = UNSET,
    store: BlobStore | None = None,
    placements: Collection[str] | str | None = UNSET,
    timeout: float | None = UNSET,
    replace_needed: bool = False,
) -> list[Any]:
    """Write every ``.ptd`` of ``program`` into ``outdir`` as one transaction.

    What ``write_tensor_data_to_file(outdir)`` writes, with tags validated
    first. Returns one WriteReport per file ([] when the program has none).

    A ``.ptd`` that a ``.pte`` of ``outdir`` needs is not replaced unless
    ``replace_needed=True``: no ``.pte`` is written here, so every ``.pte``
    there counts, this program's own earlier one too (write both with
    :func:`save_program`, which knows its own ``.pte``, to update them).

    Raises
    ------
    NeededByAnotherError
        A ``.ptd`` to be written would replace one a ``.pte`` in ``outdir`` needs.
    """
    opts = resolve(options, "write_tensor_data", consume=consume, chunk_size=chunk_size,
                   progress=progress, placements=placements, timeout=timeout)
    planned = _plan(program, None, outdir, consume=opts.consume, store=store, include_ptd=True)
    if not planned[0]:
        return []
    return _write(program, planned, opts, replace_needed=replace_needed)


def _check_neighbours(paths: Sequence[Path], pte: Path | None, replace_needed: bool) -> None:
    """Refuse (before anything is written) a ``.ptd`` another ``.pte`` of its directory needs."""
    if replace_needed:
        return
    from trtet_store.inspector.neighbours import check_neighbours

    by_dir: dict[Path, list[str]] = {}
    own = None if pte is None else os.path.abspath(pte)
    for p in paths:
        if os.path.abspath(p) != own:  # every file but the .pte is a .ptd
            by_dir.setdefault(Path(os.path.abspath(p.parent)), []).append(p.name)
    for directory, names in by_dir.items():
        check_neighbours(directory, names, program=own)


