"""compile_and_save: lower a model, stage payloads as owned blobs, move them into the program.

A TensorRT build is the expensive part, so the call checks what it cheaply
can before building (the output path, a write of the same files in
progress, keywords, ``constant_methods``, the segment alignment), and keeps
what it built when anything fails after the build: the engines and their
build records stay staged (orphans of its own store, or blobs kept alive in
the caller's store) and the next call of the same build reuses them (see
:mod:`trtet_store.export.engine_reuse`).
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.export.options import LoweringOptions
from trtet_store.io import BlobStore, WriteReport
from trtet_store.io.names import STAGING_DIR
from trtet_store.io.safedir import staging_directory
from trtet_store.io.units import PAGE

log = logging.getLogger("trtet_store.compile")


@dataclass
class CompileReport:
    """What :func:`compile_and_save` produced.

    Attributes
    ----------
    path : pathlib.Path
        The ``.pte`` written.
    data_paths : list of pathlib.Path
        The ``.ptd`` files written with it.
    writes : list of WriteReport
        Per file: the placement of every payload and why.
    engines : list of (str, int)
        Key (``<xxh3-128>_trt_engine``) and size of each TensorRT engine; the
        digest is what ``trtet-store verify --engine-digest`` checks.
    etrecord : pathlib.Path or None
        The ETRecord, when one was asked for.
    seconds : float
        Wall time, lowering included.
    engine_cache : list of EngineCacheEvent
        With ``engine_cache=``, per engine: ``outcome`` ``"hit"`` (not built;
        ``placement`` ``"clone"`` or ``"copy"`` from the cache into staging)
        or ``"miss"`` (built; ``stored``, and the put's ``placement`` or the
        ``reason`` it was not cached).

    An engine shared by several methods (the same build, or identical bytes)
    is listed once.
    """

    path: Path
    data_paths: list[Path] = field(default_factory=list)
    writes: list[WriteReport] = field(default_factory=list)
    engines: list[tuple[str, int]] = field(default_factory=list)
    etrecord: Path | None = None
    seconds: float = 0.0
    # Last, so that positional construction keeps its meaning (seconds came before it).
    engine_cache: list[Any] = field(default_factory=list)

    @property
    def placements(self) -> list[str]:
        """The placement of every payload, in write order."""
        return [p.placement for w in self.writes for p in w.placements]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (what ``trtet-store compile-and-save --json`` prints)."""
        return {
            "path": os.fspath(self.path),
            "data_paths": [os.fspath(p) for p in self.data_paths],
            "etrecord": os.fspath(self.etrecord) if self.etrecord else None,
            "engines": [list(e) for e in self.engines],
            "engine_cache": [e.to_json() for e in self.engine_cache],
            "seconds": self.seconds,
            "writes": [w.to_json() for w in self.writes],
        }


def compile_and_save(
    source: Any,
    inputs: tuple | None,
    path: os.PathLike | str,
    *,
    arg_inputs: tuple | None = None,
    kwarg_inputs: dict | None = None,
    dynamic_shapes: Any = None,
    lowering: LoweringOptions | None = None,
    backend_config: Any = None,
    store: BlobStore | os.PathLike | str | None = None,
    progress: Any = None,
    segment_alignment: int | None = None,
    timeout: float | None = None,
    versioned: bool | int = False,
    replace_needed: bool = False,
    engine_cache: Any = None,
    engine_cache_timeout: float | None = None,
    **keywords: Any,
) -> CompileReport:
    """Compile ``source`` and write it as an ExecuTorch program, each engine on disk once.

    :func:`trtet_store.export.export` (``export_program``), then
    ``to_executorch(backend_config)``, then :func:`trtet_store.save_program`
    with ``consume=True``: each TensorRT engine is streamed into ``store`` as
    soon as it is built, and the ``.pte`` and ``.ptd`` files are written in one
    transaction, every engine cloned, inserted or moved where the store shares
    the output's filesystem (and copied, with the reason in the report and the
    log, where it does not). An export that dies after its build leaves its
    engines staged, and running it again reuses them (see
    :mod:`trtet_store.export.engine_reuse`).

    Parameters
    ----------
    source : nn.Module, GraphModule, ExportedProgram or mapping of str to ExportedProgram
        See :func:`trtet_store.export.export`; a mapping writes one method per key.
    inputs : tuple, optional
        Example positional inputs (``arg_inputs`` is the same under its newer name).
    path : path-like
        The ``.pte`` to write (any name); ``.ptd`` files go beside it.
    arg_inputs, kwarg_inputs, dynamic_shapes
        As for :func:`trtet_store.export.export`.
    lowering : LoweringOptions, optional
        How it is lowered (see :class:`~trtet_store.LoweringOptions`; its
        ``generate_etrecord`` also writes ``<path stem>_etrecord.bin``). Its
        fields are still accepted as keywords; one given beside ``lowering``
        with another value is a ``TypeError``.
    backend_config : ExecutorchBackendConfig, optional
        For ``to_executorch``. With TensorRT, a ``segment_alignment`` left at
        ExecuTorch's default (128) becomes 4096, so that every engine starts on
        a page (what clone and insert need); ``segment_alignment=`` overrides both.
    store : BlobStore or path-like, optional
        Where engines are staged. Defaults to a store in ``.trtet-staging``
        beside ``path``, on the output's filesystem, so engines can be moved.
        A directory: a store of the call's own there. If the call fails after
        a build, the engines stay: in a store of its own as orphans (kept
        until ``remove_orphans``, listed by ``recover``), in a caller's
        ``BlobStore`` alive until the caller closes it; either way the next
        call of the same build reuses them.
    progress : callable, optional
        Called with a :class:`trtet_store.io.Progress` (``.done``, ``.total``)
        while the program is written, handed to ``save_program`` unchanged; a
        callable that needs two positional arguments gets ``(done, total)``.
    segment_alignment : int, optional
        Segment alignment of the program (see ``backend_config``); a power of
        two, as ExecuTorch needs.
    timeout : float, optional
        Seconds to wait for another write of the same output files, checked
        before the build and again at the write; default: refuse at once.
    versioned : bool or int
        Write the ``.pte`` and ``.ptd`` files as a new version directory and
        switch the symlink ``<dir>/<path stem>`` to it atomically, so that
        concurrent readers get one consistent set (see
        :func:`trtet_store.save_program`); ``True`` keeps 3 versions, a number
        that many. The link is checked before the build.
    replace_needed : bool
        Replace a ``.ptd`` that another ``.pte`` beside ``path`` needs (see
        :func:`trtet_store.save_program`). By default such a write is refused:
        before the build for the ``.ptd`` files named up front (the
        lowering's ``external_engine_data``, ``external_weights``), at the write for
        others (the engines built are kept then, as after any failed write).
    engine_cache : EngineCache or bool, optional
        A :class:`trtet_store.EngineCache` (``True``: the default one). A hit
        skips the build and its engines are cloned from the cache (copied
        where the cache and the output share no reflink filesystem); a miss
        builds, and the engines enter the cache before the save (a clone
        where it can; on the staging filesystem only if the save keeps its
        room). The cache keeps its entries; one that cannot take an entry
        never fails the call (``report.engine_cache`` and the log say why).
        A cache inside the staging directory is refused before the build.
    engine_cache_timeout : float, optional
        Seconds to wait for another process building the same engines
        (default: until it finishes or dies).
    **keywords
        Torch-TensorRT compile settings, each one it knows (see
        :mod:`trtet_store.export.trt_settings`), and the old lowering keywords.

    Returns
    -------
    CompileReport

    Raises
    ------
    TensorRTUnavailableError
        ``backend="tensorrt"`` without Torch-TensorRT or a CUDA device; raised
        before any file is created.
    UnsupportedEngineError
        An engine the ExecuTorch TensorRT runtime cannot run (one that needs an
        output allocator); raised before it is staged.
    ValueError, TypeError
        A bad argument (see :func:`trtet_store.export.export`), before any file
        is created; ``TypeError`` names the closest known keyword.
    IsADirectoryError, FileNotFoundError, PermissionError
        ``path`` is a directory, or its directory is missing or not
        writable; before the build.
    ConcurrentWriteError
        Another process is writing the same output (after ``timeout``);
        checked before the build, and again when the program is written.
    NeededByAnotherError
        A ``.ptd`` to be written would replace one another ``.pte`` beside
        ``path`` needs; before the build where its name is known up front.
    ExportError
        A ``constant_methods`` value ExecuTorch cannot emit; before the build.
    """
    start = time.monotonic()
    path = Path(path).absolute()
    from trtet_store.export.options import lowering_of

    lowering, compile_settings = lowering_of(lowering, "compile_and_save", keywords,
                                             inspect.signature(compile_and_save).parameters)
    backend = lowering.backend
    _check_output(path)
    if segment_alignment is not None:
        _check_alignment(segment_alignment)
    # Before the build: a bad config must not cost one.
    config = executorch_config(backend_config, backend, segment_alignment)
    from trtet_store.export import engine_reuse
    from trtet_store.export import executorch as et_adapter
    from trtet_store.export.lowering import _check_constant_methods, export
    from trtet_store.io.versioned import keep_of, version_link

    _check_constant_methods(lowering.constant_methods, ())
    if keep_of(versioned) is not None:
        version_link(path)  # a name taken by something else: refused before the build
    destinations = _destinations(path, lowering.external_engine_data,
                                 lowering.external_weights)
    _wait_until_free(destinations, timeout)
    if keep_of(versioned) is None and not replace_needed:
        # Before the build: a refusal must not cost one.
        from trtet_store.inspector.neighbours import check_neighbours

        check_neighbours(path.parent, [d.name for d in destinations[1:]], program=path)

    from trtet_store.export import engine_cache as cache_mod

    if backend != "tensorrt" and engine_cache not in (None, False):
        raise ValueError("engine_cache applies to backend='tensorrt' (it caches TensorRT "
                         "builds)")
    cache = cache_mod.resolve(engine_cache) if backend == "tensorrt" else None
    if cache is not None:
        # Before the build: staging is emptied and removed with the export.
        staging = store.directory if isinstance(store, BlobStore) else \
            Path(path.parent / STAGING_DIR if store is None else store).absolute()
        _refuse_cache_in(cache.directory, Path(staging))
    own_store = not isinstance(store, BlobStore)
    if own_store:
        # Before the build: a staging directory that is a link, another user's or
        # writable by others is refused, and nothing is written in it.
        staging_directory(path.parent / STAGING_DIR if store is None else store).close()
        store = BlobStore(path.parent / STAGING_DIR if store is None else store)
    edge = None
    written = False
    try:
        edge = export(source, inputs=inputs, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs,
                      dynamic_shapes=dynamic_shapes, lowering=lowering, store=store,
                      engine_cache=cache, engine_cache_timeout=engine_cache_timeout,
                      **compile_settings)
        engines = edge.trtet_staged[0]
        program = edge.to_executorch(config)
        report = CompileReport(path, engines=_listed_once(engines),
                               engine_cache=list(getattr(edge, "trtet_cache", [])))
        etrecord_error = None
        if lowering.generate_etrecord:
            report.etrecord = path.with_name(path.stem + "_etrecord.bin")
            try:
                # Before any engine moves: the ETRecord may read them.
                program.get_etrecord().save(os.fspath(report.etrecord))
            except Exception as exc:  # the program is still written, then this is raised
                log.error("ETRecord %s failed (%s); writing the program anyway",
                          report.etrecord, exc)
                etrecord_error = exc
        report.writes = et_adapter.save_program(program, path, consume=True,
                                                versioned=versioned,
                                                replace_needed=replace_needed,
                                                progress=progress, timeout=timeout)
        written = True  # the engines are in the program now; nothing left to keep
        report.data_paths = [w.path for w in report.writes[1:]]
        for w in report.writes:
            for p in w.placements:
                log.info("%s: %s of %d bytes (%s)", w.path.name, p.placement, p.size, p.reason)
        if etrecord_error is not None:
            raise etrecord_error
        report.seconds = time.monotonic() - start
        return report
    except BaseException:
        # The build is done and the write did not take it: keep it for the next
        # call (export keeps what it built when it fails itself).
        blobs = engine_reuse.kept(store)
        if edge is not None and not written:
            staged, records = edge.trtet_staged
            blobs += [*(e.blob for e in staged), *records]
        engine_reuse.keep(store, blobs, own_store=own_store)
        raise
    finally:
        if edge is not None:
            from trtet_store.export import tensorrt

            tensorrt.unregister_engines(edge.trtet_staged[0])
        del edge
        if own_store:
            store.close()
            _remove_if_empty(store.directory)


def _listed_once(engines: list[Any]) -> list[tuple[str, int]]:
    """Key and size of each engine, one entry per engine file (shared engines once)."""
    seen: dict[str, int] = {}
    for e in engines:
        seen.setdefault(e.key, e.blob.size)
    return list(seen.items())


def _refuse_cache_in(cache_dir: Path, staging: Path) -> None:
    """ValueError when the engine cache lies inside the staging directory (or is it)."""
    real_cache = os.path.realpath(cache_dir)
    real_staging = os.path.realpath(staging)
    if real_cache == real_staging or real_cache.startswith(real_staging.rstrip(os.sep) + os.sep):
        raise ValueError(
            f"the engine cache {cache_dir} is inside the staging directory {staging}, whose "
            "files each export takes and removes: put the cache elsewhere (the default, "
            "EngineCache(), is per user under $XDG_CACHE_HOME), or stage elsewhere (store=)")


def _check_output(path: Path) -> None:
    """Refuse an output the write would refuse, before anything is built."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "cannot write the program over a directory",
                                os.fspath(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "cannot write the program: its directory does "
                                "not exist", os.fspath(path.parent))
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "cannot write the program: its directory is "
                              "read-only or not writable by this user", os.fspath(path.parent))


def _check_alignment(alignment: int) -> None:
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or \
            alignment & (alignment - 1):  # True is the int 1: never an alignment
        raise ValueError(f"segment_alignment must be a power of two (ExecuTorch aligns "
                         f"segments to it; 4096 puts every engine on a page), got {alignment}")


def _destinations(path: Path, *tags: str | None) -> list[Path]:
    """The files the write will lock: the ``.pte`` and the ``.ptd`` files named up front."""
    from trtet_store.export.named_data import ptd_file_name

    return [path, *(path.parent / ptd_file_name(t) for t in tags if t is not None)]


def _wait_until_free(destinations: list[Path], timeout: float | None) -> None:
    """Refuse (or wait up to ``timeout``) while another write holds one of ``destinations``.

    A check, not a reservation: the lock is taken and given back at once (the
    write takes it again), so a writer that starts after it is still found
    at the write, and then the engines are kept.
    """
    from trtet_store.io.lock import lock_file, unlock_file
    from trtet_store.io.names import destination, lock_path_of

    for dest in map(destination, destinations):
        lock = lock_path_of(dest)
        fd = lock_file(lock, dest, timeout)
        unlock_file(fd, lock)


def executorch_config(config: Any, backend: str, segment_alignment: int | None) -> Any:
    """The ``to_executorch`` config ``compile_and_save`` uses.

    Parameters
    ----------
    config : ExecutorchBackendConfig or None
        The caller's config, or None for ExecuTorch's default. It is not changed.
    backend : str
        ``"tensorrt"`` aligns segments to the page (so engines can be cloned
        and mapped) unless the config or ``segment_alignment`` sets another.
    segment_alignment : int or None
        An explicit alignment, a power of two.

    Returns
    -------
    ExecutorchBackendConfig
        A copy with the alignment settled.
    """
    import dataclasses

    from executorch.exir import ExecutorchBackendConfig

    if config is None:
        config = ExecutorchBackendConfig()
    default = ExecutorchBackendConfig().segment_alignment
    if segment_alignment is None and backend == "tensorrt" and \
            config.segment_alignment == default:
        segment_alignment = PAGE
    if segment_alignment is not None:
        config = dataclasses.replace(config, segment_alignment=segment_alignment)
    _check_alignment(config.segment_alignment)
    return config


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # still holds someone's files
        directory.rmdir()
