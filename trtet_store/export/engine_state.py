"""Engine state records: what Torch-TensorRT engine objects serialize to, and what we read.

A TensorRT engine object pickles to a list of strings (torch-tensorrt 2.14.0's
``SerializedInfoIndex`` layout: device, binding names joined by ``%``, flags,
``aliased_io`` records). :func:`engine_state` reads the fields the ExecuTorch
runtime needs, with torch_tensorrt's own indices and decoder where it is
installed, and refuses an engine that runtime cannot run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class UnsupportedEngineError(ValueError):
    """A built engine the ExecuTorch TensorRT runtime cannot run (e.g. an output allocator)."""


# -- engine state records ---------------------------------------------------------------

#: Indices into torch-tensorrt 2.14.0's serialized engine record
#: (``torch_tensorrt.dynamo.runtime._serialized_engine_layout``). Used only where
#: torch_tensorrt is not installed; otherwise its own constants are read.
STATE_LAYOUT_2_14 = {
    "DEVICE_IDX": 2,
    "ENGINE_IDX": 3,
    "INPUT_BINDING_NAMES_IDX": 4,
    "OUTPUT_BINDING_NAMES_IDX": 5,
    "HW_COMPATIBLE_IDX": 6,
    "SERIALIZED_METADATA_IDX": 7,
    "TARGET_PLATFORM_IDX": 8,
    "REQUIRES_OUTPUT_ALLOCATOR_IDX": 9,
    "ALIASED_IO_IDX": 12,
}
_DELIM = "%"
_ALIAS_FIELD_DELIM = "@"


def _parse_aliased_io(text: str) -> dict[str, tuple[str, str]]:
    """``out@in@kind`` records joined by ``%``, as torch-tensorrt 2.14.0 writes them."""
    out: dict[str, tuple[str, str]] = {}
    for record in filter(None, text.split(_DELIM)):
        fields = record.split(_ALIAS_FIELD_DELIM)
        if len(fields) != 3:
            raise UnsupportedEngineError(f"malformed aliased_io record {record!r} (want "
                                         "output@input@kind)")
        out[fields[0]] = (fields[1], fields[2])
    return out


def state_layout() -> tuple[dict[str, int], Callable[[str], dict[str, tuple[str, str]]]]:
    """The engine record's indices and the ``aliased_io`` decoder.

    torch_tensorrt's own constants and ``deserialize_aliased_io`` where it is
    installed; torch-tensorrt 2.14.0's values, restated, where it is not.
    """
    try:
        from torch_tensorrt.dynamo.runtime import _TorchTensorRTModule as trt_module
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch_tensorrt":
            raise
        return dict(STATE_LAYOUT_2_14), _parse_aliased_io
    return ({name: int(getattr(trt_module, name)) for name in STATE_LAYOUT_2_14},
            trt_module.deserialize_aliased_io)


def _text(record: Sequence[Any], index: int) -> str:
    if index >= len(record) or record[index] is None:
        return ""
    value = record[index]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class EngineState:
    """What the runtime needs to bind an engine, read from its state record.

    Attributes
    ----------
    input_names, output_names : tuple of str
        Binding names in the engine's (TensorRT submodule's) order.
    aliased_io : tuple of (output, input, kind)
        Outputs written in place into an input (KV caches); makes the blob ``TR02``.
    hardware_compatible : bool
    device_id : int
    serialized_metadata, target_platform : str
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    aliased_io: tuple[tuple[str, str, str], ...] = ()
    hardware_compatible: bool = False
    device_id: int = 0
    serialized_metadata: str = ""
    target_platform: str = ""


def engine_state(record: Sequence[Any], *, name: str = "engine") -> EngineState:
    """Read an engine's state record (``engine.__getstate__()[0]`` in torch-tensorrt 2.14.0).

    Parameters
    ----------
    record : sequence
        The serialized engine record; its engine slot is not read.
    name : str
        For error messages.

    Raises
    ------
    UnsupportedEngineError
        The record is too short, or the engine needs an output allocator
        (data-dependent output shapes), which the ExecuTorch runtime refuses.
    """
    layout, parse_aliased_io = state_layout()
    record = list(record)
    if len(record) <= layout["ENGINE_IDX"]:
        raise UnsupportedEngineError(f"{name}: incomplete engine state record "
                                     f"({len(record)} fields)")
    if _text(record, layout["REQUIRES_OUTPUT_ALLOCATOR_IDX"]) == "1":
        raise UnsupportedEngineError(
            f"{name} needs an output allocator (data-dependent output shapes); the "
            "ExecuTorch TensorRT runtime cannot run it. Give its outputs static or "
            "bounded shapes, or leave that part out of the TensorRT partition")
    aliased = parse_aliased_io(_text(record, layout["ALIASED_IO_IDX"]))
    device = _text(record, layout["DEVICE_IDX"]).split(_DELIM)[0]
    return EngineState(
        input_names=tuple(filter(None, _text(record, layout["INPUT_BINDING_NAMES_IDX"])
                                 .split(_DELIM))),
        output_names=tuple(filter(None, _text(record, layout["OUTPUT_BINDING_NAMES_IDX"])
                                  .split(_DELIM))),
        aliased_io=tuple((out, inp, kind) for out, (inp, kind) in aliased.items()),
        hardware_compatible=_text(record, layout["HW_COMPATIBLE_IDX"]) == "1",
        device_id=int(device) if device.isdigit() else 0,
        serialized_metadata=_text(record, layout["SERIALIZED_METADATA_IDX"]),
        target_platform=_text(record, layout["TARGET_PLATFORM_IDX"]),
    )
