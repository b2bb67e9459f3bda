"""How a model is lowered: :class:`LoweringOptions`, taken by ``export`` and ``compile_and_save``.

The lowering options were a keyword list that ``compile_and_save`` repeated
from ``export()`` one by one; they now travel as one frozen object
(s3transfer's ``TransferConfig``), handed down unchanged. The old keywords
still work and build the object (:func:`trtet_store.io.merge_options`): one
given beside ``lowering=`` with another value is a ``TypeError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtet_store.io import merge_options

__all__ = ["BACKENDS", "LoweringOptions", "lowering_of"]

BACKENDS = ("tensorrt", "xnnpack")


@dataclass(frozen=True)
class LoweringOptions:
    """How ``source`` is lowered; ``lowering=`` of ``export`` and ``compile_and_save``.

    Parameters
    ----------
    backend : {"tensorrt", "xnnpack"}
        ``"xnnpack"`` lowers for CPU (what machines without a GPU run) through
        the same store and writer.
    retrace : bool, optional
        Accepted for parity with Torch-TensorRT; an ExportedProgram or a
        mapping refuses ``True`` as upstream does, a module is always traced.
    transform_passes : sequence, mapping or PassManager, optional
        ExecuTorch transform passes, for every method or per method.
    partitioners : sequence or mapping, optional
        Extra partitioners run after TensorRT's (or XNNPACK's), in the given
        order, for every method or per method. Give each method its own
        instances; one whose compile specs name a method is refused under
        another method.
    compile_specs : sequence or mapping, optional
        For the TensorRT partitioner, for every method or per method.
    compile_config : EdgeCompileConfig, optional
        Default: ``EdgeCompileConfig(_check_ir_validity=False)`` for TensorRT
        (engine placeholders are not core ATen), ExecuTorch's default otherwise.
    constant_methods : mapping, optional
        Methods returning a constant (e.g. a vocabulary size); keys must be
        identifiers and must not name a method.
    generate_etrecord : bool
        Ask ExecuTorch for an ETRecord; ``compile_and_save`` writes it as
        ``<path stem>_etrecord.bin`` before any engine is moved (if that
        fails, the program is still written and the failure raised).
    weight_streaming_budget_per_engine : int, optional
        Bytes of each engine's weights that may stay resident on the GPU.
    external_engine_data : str, optional
        Engines (or, for XNNPACK, the weights) as named data in
        ``<name>.ptd`` (``engine_key`` in each delegate): no released
        TensorRT runtime reads that layout yet, and it needs executorch 1.5.
        By default each engine is inline in its delegate's segment of the
        ``.pte``, the layout torch-tensorrt-executorch-runtime 0.1.0 loads.
    external_weights : str, optional
        The weights of what TensorRT leaves to other partitioners (e.g.
        XNNPACK) in ``<name>.ptd``, engines staying inline: a hybrid program
        whose CPU weights ship apart. With ``backend="xnnpack"`` the same as
        ``external_engine_data``.

    Raises
    ------
    ValueError
        An unknown backend, a ``.ptd`` name no program may have, or a
        TensorRT-only option with another backend: when it is made.
    """

    backend: str = "tensorrt"
    retrace: bool | None = None
    transform_passes: Any = None
    partitioners: Sequence[Any] | Mapping[str, Sequence[Any] | None] | None = None
    compile_specs: Sequence[Any] | Mapping[str, Sequence[Any] | None] | None = None
    compile_config: Any = None
    constant_methods: Mapping[str, Any] | None = None
    generate_etrecord: bool = False
    weight_streaming_budget_per_engine: int | None = None
    external_engine_data: str | None = None
    external_weights: str | None = None

    def __post_init__(self) -> None:
        # Refused here, before anything is built or written.
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        from trtet_store.export.named_data import ptd_file_name

        for name in (self.external_engine_data, self.external_weights):
            if name is not None:
                ptd_file_name(name)
        if self.backend != "tensorrt":
            if self.weight_streaming_budget_per_engine is not None:
                raise ValueError("weight_streaming_budget_per_engine applies to "
                                 "backend='tensorrt'")
            if self.compile_specs is not None:
                raise ValueError("compile_specs are for the TensorRT partitioner "
                                 "(backend='tensorrt')")


FIELDS = frozenset(f.name for f in dataclasses.fields(LoweringOptions))


def lowering_of(lowering: LoweringOptions | None, where: str, keywords: dict[str, Any],
                parameters: Iterable[str]) -> tuple[LoweringOptions, dict[str, Any]]:
    """``lowering`` (or one built from the old keywords) and the compile settings left.

    ``keywords`` are the call's ``**keywords``: the lowering options by their
    old names, and Torch-TensorRT compile settings. ``parameters`` are the
    function's own, suggested for a misspelt keyword.

    Raises
    ------
    TypeError
        ``lowering`` is not a LoweringOptions, a keyword is given beside it
        with another value, or a keyword neither the function, the options
        nor the TensorRT compiler knows (naming the closest known one).
    """
    from trtet_store.export.trt_settings import check_compile_settings

    old = {k: keywords[k] for k in keywords if k in FIELDS}
    settings = {k: v for k, v in keywords.items() if k not in FIELDS}
    options = merge_options(LoweringOptions, lowering, where, "lowering", old)
    check_compile_settings(where, options.backend, settings, {*parameters, *FIELDS})
    return options, settings
