"""compile_and_save: lower a model, stage payloads as owned blobs, move them into the program."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import BlobStore, WriteReport

log = logging.getLogger("trtet_store.compile")

BACKENDS = ("tensorrt", "xnnpack")


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
    """

    path: Path
    data_paths: list[Path] = field(default_factory=list)
    writes: list[WriteReport] = field(default_factory=list)
    engines: list[tuple[str, int]] = field(default_factory=list)
    etrecord: Path | None = None
    seconds: float = 0.0

    @property
    def placements(self) -> list[str]:
        """The placement of every payload, in write order."""
        return [p.placement for w in self.writes for p in w.placements]


def compile_and_save(
    module: Any,
    inputs: tuple | None,
    path: os.PathLike | str,
    *,
    backend: str = "tensorrt",
    arg_inputs: tuple | None = None,
    kwarg_inputs: dict | None = None,
    dynamic_shapes: Any = None,
    external_engine_data: str | None = None,
    generate_etrecord: bool = False,
    weight_streaming_budget_per_engine: int | None = None,
    store: BlobStore | None = None,
    progress: Any = None,
    segment_alignment: int | None = None,
    compile_specs: list | None = None,
    **compile_settings: Any,
) -> CompileReport:
    """Compile ``module`` and write it as an ExecuTorch program, each engine on disk once.

    With ``backend="tensorrt"`` each TensorRT engine is streamed into ``store``
    as soon as it is built; the program's ``.pte`` and ``.ptd`` are then written
    in one transaction with ``consume=True``, so every engine is moved, not
    copied, where the store shares the output's filesystem (and copied, with
    the reason in the report and the log, where it does not).

    Parameters
    ----------
    module : torch.nn.Module
        The model.
    inputs : tuple, optional
        Example positional inputs (``arg_inputs`` is the same under its newer name).
    path : path-like
        The ``.pte`` to write (any name); ``.ptd`` files go beside it.
    backend : {"tensorrt", "xnnpack"}
        ``"xnnpack"`` lowers for CPU through the same store and writer.
    external_engine_data : str, optional
        Put engines (or, for XNNPACK, the weights) in ``<name>.ptd``. By default
        each TensorRT engine is inline in its delegate's segment of the ``.pte``,
        the layout torch-tensorrt-executorch-runtime 0.1.0 loads. With a name,
        engines are named data in ``<name>.ptd`` (``engine_key`` in each
        delegate): no released TensorRT runtime reads that layout yet, and it
        needs executorch 1.5.
    generate_etrecord : bool
        Also write ``<path stem>_etrecord.bin``. It is written before any engine
        is moved; if it fails, the program is still written and the failure raised.
    weight_streaming_budget_per_engine : int, optional
        Per-engine resident weight budget, in bytes (TensorRT only).
    store : BlobStore, optional
        Where engines are staged. Defaults to a store in ``.trtet-staging``
        beside ``path``, on the output's filesystem, so engines can be moved.
    progress : callable, optional
        ``progress(bytes_done, bytes_total)`` while the program is written.
    segment_alignment : int, optional
        Segment alignment of the program. Defaults to 4096 for TensorRT: every
        engine then starts on a block boundary, which reflink (clone) and
        insert-range placements need, at a cost of under 4 KiB per segment.
    compile_specs : list of CompileSpec, optional
        For the TensorRT partitioner; ``target_device`` defaults to each
        engine's ``cuda:N``.
    **compile_settings
        Passed to Torch-TensorRT's compiler.

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
    """
    start = time.monotonic()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if inputs is not None and arg_inputs is not None:
        raise ValueError("give inputs or arg_inputs, not both (they are the same argument)")
    args = tuple(inputs if inputs is not None else arg_inputs or ())
    path = Path(path).absolute()
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: its directory does not exist")
    from trtet_store.export import executorch as et_adapter

    if external_engine_data is not None:
        et_adapter.ptd_file_name(external_engine_data)  # refuses names that escape
    if backend == "tensorrt":
        from trtet_store.export import tensorrt

        tensorrt.check_available()
    elif weight_streaming_budget_per_engine is not None:
        raise ValueError("weight_streaming_budget_per_engine applies to backend='tensorrt'")

    own_store = store is None
    if own_store:
        store = BlobStore(path.parent / ".trtet-staging")
    engines: list[Any] = []
    built = None  # holds the build record until the program is written
    try:
        import torch

        exported = torch.export.export(module, args, kwarg_inputs or {},
                                       dynamic_shapes=dynamic_shapes, strict=False)
        if backend == "tensorrt":
            edge, built = _lower_tensorrt(exported, args, kwarg_inputs, store,
                                          compile_specs, external_engine_data,
                                          weight_streaming_budget_per_engine,
                                          generate_etrecord, compile_settings)
            engines = built.engines
        else:
            edge = _lower_xnnpack(exported, args, kwarg_inputs, external_engine_data,
                                  generate_etrecord)
        from executorch.exir import ExecutorchBackendConfig

        if segment_alignment is None and backend == "tensorrt":
            segment_alignment = 4096
        config = ExecutorchBackendConfig()
        if segment_alignment is not None:
            config = ExecutorchBackendConfig(segment_alignment=segment_alignment)
        program = edge.to_executorch(config)
        report = CompileReport(path, engines=[(e.key, e.blob.size) for e in engines])
        etrecord_error = None
        if generate_etrecord:
            report.etrecord = path.with_name(path.stem + "_etrecord.bin")
            try:
                # Before any engine moves: the ETRecord may read them.
                program.get_etrecord().save(os.fspath(report.etrecord))
            except Exception as exc:  # the program is still written, then this is raised
                log.error("ETRecord %s failed (%s); writing the program anyway",
                          report.etrecord, exc)
                etrecord_error = exc
        report.writes = et_adapter.save_program(program, path, consume=True,
                                                progress=progress)
        report.data_paths = [w.path for w in report.writes[1:]]
        for w in report.writes:
            for p in w.placements:
                log.info("%s: %s of %d bytes (%s)", w.path.name, p.placement, p.size, p.reason)
        if etrecord_error is not None:
            raise etrecord_error
        report.seconds = time.monotonic() - start
        return report
    finally:
        if engines:
            from trtet_store.export import tensorrt

            tensorrt.unregister_engines(engines)
        del built
        if own_store:
            store.close()
            _remove_if_empty(store.directory)


def _lower_tensorrt(exported, args, kwargs, store, specs, external, budget, etrecord, settings):
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    from trtet_store.export import engine_reuse, tensorrt

    built = engine_reuse.build_or_reuse(exported, args, kwargs, store, settings)
    try:
        partitioner = tensorrt.TensorRTPartitioner(
            specs, external_engine_data=external, weight_streaming_budget_per_engine=budget)
        edge = to_edge_transform_and_lower(
            built.exported_program, partitioner=[partitioner],
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
            generate_etrecord=etrecord)
    except BaseException:
        tensorrt.unregister_engines(built.engines)
        raise
    return edge, built


def _lower_xnnpack(exported, args, kwargs, external, etrecord):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    if external is not None:
        from executorch.exir.passes.external_constants_pass import (
            delegate_external_constants_pass_unlifted,
        )

        unlifted = exported.module()
        delegate_external_constants_pass_unlifted(unlifted, gen_tag_fn=lambda _n: external)
        # Strict export keeps the node meta that carries the tags.
        exported = torch.export.export(unlifted, args, kwargs or {}, strict=True)
    return to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                       generate_etrecord=etrecord)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # still holds someone's files
        directory.rmdir()
