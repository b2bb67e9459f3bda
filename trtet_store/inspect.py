"""Read the layout of ``.pte`` and ``.ptd`` files, and check it, without reading payloads.

:func:`inspect_file` parses the fixed headers itself (the ``.pte`` extended
header ``eh00``, the ``.ptd`` header ``FH01``) and hands the flatbuffer region,
and only that, to ExecuTorch's own deserializers (``exir/_serialize``: the
Program flatbuffer through the generated Python classes, the FlatTensor
through ``flatc``). Delegate blobs are read only as far as their headers: a
TensorRT delegate blob (``TR01``/``TR02``, see
``shared/reference/tensorrt-delegate.md``) is decoded into its header and
metadata. Payload bytes are never read, so inspecting a file of tens of
gigabytes costs a few reads.

:func:`verify` adds the structural checks the runtime makes (magic, versions,
offsets in bounds, segments within the file, indices in range), cross-checks
a ``.pte`` against its ``.ptd`` (engine keys and external tensors present),
and optionally loads the program with the ExecuTorch runtime.

Every finding is a :class:`Problem` with a severity; an ``error`` means the
runtime would refuse the file (or read garbage), a ``warning`` means
something unusual that still loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Inspection",
    "Problem",
    "VerifyResult",
    "format_inspection",
    "format_verify",
    "inspect_file",
    "verify",
]

HEAD_BYTES = 64  # what both runtime readers load first
PTE_IDENTIFIER = b"ET12"
PTE_HEADER_MAGIC = b"eh00"
PTE_HEADER_MIN_LENGTH = 24
PTD_IDENTIFIER = b"FT01"
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_MIN_LENGTH = 40
SUPPORTED_VERSION = 0
#: Bytes of a delegate blob read to decode a TensorRT header and its metadata.
TRT_READ_LIMIT = 1 << 20
PAGE = 4096
#: Seconds a runtime load (``verify --run``) may take.
RUNTIME_TIMEOUT = 600

_DATA_LOCATION = {0: "INLINE", 1: "SEGMENT"}


@dataclass
class Problem:
    """One finding of a check.

    Attributes:
        severity: ``error`` (the runtime would refuse the file or read out of
            bounds) or ``warning`` (unusual, still loads).
        message: What is wrong, with the numbers.
    """

    severity: str
    message: str

    def to_json(self) -> dict[str, str]:
        """A JSON-ready dict."""
        return {"severity": self.severity, "message": self.message}


@dataclass
class Inspection:
    """The layout of one file.

    Attributes:
        path: The file.
        kind: ``pte``, ``ptd`` or ``unknown``.
        file_size: Its length in bytes.
        header: Header fields by name (identifier, root offset, sizes, offsets).
        segments: One dict per segment: ``index``, ``offset`` (relative to the
            segment base), ``size``, ``absolute_offset``, ``end``,
            ``page_aligned``, ``used_by``.
        named_data: One dict per key: ``key``, ``segment_index``,
            ``absolute_offset``, ``size`` (and ``tensor_layout`` in a ``.ptd``).
        delegates: One dict per delegate (``.pte``): ``plan``, ``index``,
            ``id``, ``location``, ``data_index``, ``size``, ``absolute_offset``,
            ``compile_specs``, and ``tensorrt`` (header and metadata) for a
            TensorRT blob.
        plans: One dict per execution plan (``.pte``): name, inputs, outputs,
            operators, instruction and value counts.
        program: Other program-level fields (``version``, constant and mutable segments).
        external_tensors: Fully qualified names of tensors the ``.pte`` expects
            in a ``.ptd`` (emitter external constants).
        problems: What the structural checks found.
    """

    path: Path
    kind: str
    file_size: int
    header: dict[str, Any] = field(default_factory=dict)
    segments: list[dict[str, Any]] = field(default_factory=list)
    named_data: list[dict[str, Any]] = field(default_factory=list)
    delegates: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    program: dict[str, Any] = field(default_factory=dict)
    external_tensors: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        """The problems of severity ``error``."""
        return [p for p in self.problems if p.severity == "error"]

    def error(self, message: str) -> None:
        """Record an error."""
        self.problems.append(Problem("error", message))

    def warn(self, message: str) -> None:
        """Record a warning."""
        self.problems.append(Problem("warning", message))

    @property
    def keys(self) -> set[str]:
        """The named-data keys of this file."""
        return {d["key"] for d in self.named_data}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes shown as text or hex)."""
        return _jsonable(
            {
                "path": os.fspath(self.path),
                "kind": self.kind,
                "file_size": self.file_size,
                "header": self.header,
                "program": self.program,
                "plans": self.plans,
                "segments": self.segments,
                "named_data": self.named_data,
                "delegates": self.delegates,
                "external_tensors": self.external_tensors,
                "problems": [p.to_json() for p in self.problems],
            }
        )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        return _show_bytes(bytes(obj))
    if isinstance(obj, Path):
        return os.fspath(obj)
    return obj


def _show_bytes(b: bytes) -> str:
    try:
        text = b.decode("ascii")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text
    return "0x" + b.hex()


def _u32(b: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", b, off)[0])


def _u64(b: bytes, off: int) -> int:
    return int(struct.unpack_from("<Q", b, off)[0])


def _read_at(f: Any, offset: int, size: int) -> bytes:
    return os.pread(f.fileno(), size, offset)


# --- .pte ------------------------------------------------------------------------------


def inspect_file(path: os.PathLike | str) -> Inspection:
    """Read the layout of a ``.pte`` or ``.ptd`` and check its structure.

    The kind is told by the file identifier (bytes 4..8: ``ET??`` or
    ``FT??``), not the name. Reads the head, the flatbuffer region and
    delegate blob headers; never a payload.

    Args:
        path: The file.

    Returns:
        The layout, with :attr:`Inspection.problems` filled in. A file that
        cannot be parsed is returned with errors, not raised.

    Raises:
        FileNotFoundError: The file does not exist.
        IsADirectoryError: It is a directory.
    """
    p = Path(path)
    size = os.stat(p).st_size
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory")
    with open(p, "rb") as f:
        head = _read_at(f, 0, HEAD_BYTES)
        ins = Inspection(p, "unknown", size)
        if len(head) < 8:
            ins.error(f"file has {size} bytes: too short for a flatbuffer (8 bytes at least)")
            return ins
        ident = head[4:8]
        if ident[:2] == b"ET":
            ins.kind = "pte"
            _inspect_pte(f, head, ins)
        elif ident[:2] == b"FT":
            ins.kind = "ptd"
            _inspect_ptd(f, head, ins)
        else:
            ins.header["file_identifier"] = ident
            ins.error(
                f"file identifier {_show_bytes(ident)!r} at bytes 4..8 is neither a .pte "
                f"({PTE_IDENTIFIER.decode()}) nor a .ptd ({PTD_IDENTIFIER.decode()})"
            )
    return ins


def _check_head(head: bytes, ins: Inspection, identifier: bytes, refusal: str) -> int:
    """Record the root offset and file identifier, checked as the runtime checks them.

    Returns the root offset.
    """
    ident = head[4:8]
    root = _u32(head, 0)
    ins.header.update({"root_offset": root, "file_identifier": ident})
    if ident != identifier:
        ins.error(f"file identifier {_show_bytes(ident)!r}: the runtime reads only "
                  f"{identifier.decode()}{refusal}")
    if len(head) < HEAD_BYTES:
        ins.error(f"file has {ins.file_size} bytes; the runtime reads {HEAD_BYTES} head "
                  "bytes first")
    return root


def _inspect_pte(f: Any, head: bytes, ins: Inspection) -> None:
    size = ins.file_size
    root = _check_head(head, ins, PTE_IDENTIFIER, " (IncompatibleVersion)")
    program_size = size
    base = 0
    data_size = 0
    if head[8:12] == PTE_HEADER_MAGIC and len(head) >= 40:
        length = _u32(head, 12)
        program_size = _u64(head, 16)
        base = _u64(head, 24)
        data_size = _u64(head, 32) if length > PTE_HEADER_MIN_LENGTH else 0
        ins.header.update(
            {
                "extended_header": True,
                "magic": PTE_HEADER_MAGIC,
                "header_length": length,
                "program_size": program_size,
                "segment_base_offset": base,
                "segment_data_size": data_size,
            }
        )
        if length < PTE_HEADER_MIN_LENGTH:
            ins.error(f"extended header length {length} < {PTE_HEADER_MIN_LENGTH}")
        if program_size < 8 or program_size > size:
            ins.error(
                f"program_size {program_size} is outside the file ({size} bytes)"
                + (": the file is truncated" if program_size > size else "")
            )
            return
        if base:
            if base < program_size:
                ins.error(f"segment_base_offset {base} lies inside the program (< {program_size})")
            end = base + data_size
            if end > size:
                ins.error(
                    f"segments end at byte {end} but the file has {size}: truncated by "
                    f"{end - size} bytes"
                )
            elif end < size:
                ins.warn(f"{size - end} bytes after the last segment (the runtime ignores them)")
        elif data_size:
            ins.error(f"segment_data_size {data_size} without a segment_base_offset")
    else:
        ins.header["extended_header"] = False
        if head[8:12] in (b"eh01", b"eh02") or head[8:10] == b"eh":
            ins.error(f"unknown extended header magic {_show_bytes(head[8:12])!r}")
    ins.header["program_size"] = program_size
    if not 8 <= root <= program_size - 4:
        ins.error(f"root table offset {root} is outside the program [8, {program_size - 4}]")
        return
    data = _read_at(f, 0, program_size)
    try:
        from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program

        program = _flatbuffer_to_program(data)
    except Exception as exc:
        ins.error(f"the Program flatbuffer does not parse: {type(exc).__name__}: {exc}")
        return
    _describe_program(f, program, ins, base, data_size)


def _describe_program(f: Any, program: Any, ins: Inspection, base: int, data_size: int) -> None:
    size = ins.file_size
    ins.program["version"] = program.version
    if program.version > SUPPORTED_VERSION:
        ins.error(
            f"Program schema version {program.version} is newer than the runtime supports "
            f"({SUPPORTED_VERSION})"
        )
    segs = list(program.segments or [])
    used: dict[int, list[str]] = {i: [] for i in range(len(segs))}
    if not base and any(s.size for s in segs):
        # Empty segments without a header are what ExecuTorch writes when there
        # is no segment data at all; only data needs a base to be found.
        ins.error(f"{len(segs)} segments, but no segment_base_offset (no extended header)")
    prev_end = 0
    for i, s in enumerate(segs):
        absolute = base + s.offset
        ins.segments.append(
            {
                "index": i,
                "offset": s.offset,
                "size": s.size,
                "absolute_offset": absolute,
                "end": absolute + s.size,
                "page_aligned": absolute % PAGE == 0,
                "used_by": used[i],
            }
        )
        if s.offset + s.size > data_size:
            ins.error(
                f"segment {i} [{s.offset}, {s.offset + s.size}) ends past segment_data_size "
                f"{data_size}"
            )
        if absolute + s.size > size:
            ins.error(
                f"segment {i} at bytes [{absolute}, {absolute + s.size}) is past the end of the "
                f"file ({size} bytes): truncated"
            )
        if s.offset < prev_end:
            ins.error(f"segment {i} at {s.offset} overlaps the previous one (ends {prev_end})")
        prev_end = max(prev_end, s.offset + s.size)

    cs = program.constant_segment
    offsets = list(cs.offsets) if cs is not None else []
    ins.program["constant_segment"] = {
        "segment_index": cs.segment_index if cs is not None else None,
        "offsets": len(offsets),
    }
    ins.program["constant_buffers"] = len(program.constant_buffer or [])
    if not offsets:
        if program.constant_buffer:
            ins.error(
                "constants in the deprecated constant_buffer: the 1.5.1 runtime has that "
                "path disabled"
            )
        else:
            ins.error("constant_segment.offsets is empty; the runtime needs at least [0]")
    elif len(offsets) > 1:
        if cs.segment_index >= len(segs):
            ins.error(
                f"constant segment index {cs.segment_index} out of range ({len(segs)} segments)"
            )
        else:
            used[cs.segment_index].append("constants")
            seg_size = segs[cs.segment_index].size
            bad = [o for o in offsets if o > seg_size]
            if bad:
                ins.error(f"constant offsets {bad[:3]} past the constant segment ({seg_size} B)")
    mutable = list(program.mutable_data_segments or [])
    ins.program["mutable_data_segments"] = [
        {"segment_index": m.segment_index, "offsets": len(m.offsets)} for m in mutable
    ]
    for m in mutable:
        if m.segment_index >= len(segs):
            ins.error(f"mutable data segment index {m.segment_index} out of range")
        else:
            used[m.segment_index].append("mutable data")

    for nd in program.named_data or []:
        entry: dict[str, Any] = {"key": nd.key, "segment_index": nd.segment_index}
        if nd.segment_index >= len(segs):
            ins.error(f"named data {nd.key!r}: segment index {nd.segment_index} out of range")
        else:
            s = segs[nd.segment_index]
            entry.update({"absolute_offset": base + s.offset, "size": s.size})
            used[nd.segment_index].append(f"named:{nd.key}")
        ins.named_data.append(entry)
    if program.named_data and not segs:
        ins.error("named data without segments (PteDataMap needs them)")

    inline = list(program.backend_delegate_data or [])
    for pi, plan in enumerate(program.execution_plan or []):
        externals = []
        for v in plan.values or []:
            val = getattr(v, "val", None)
            info = getattr(val, "extra_tensor_info", None)
            if info is not None and int(getattr(info, "location", 0)) == 1:  # EXTERNAL
                externals.append(info.fully_qualified_name)
        ins.external_tensors.extend(n for n in externals if n)
        ins.plans.append(
            {
                "name": plan.name,
                "inputs": len(plan.inputs or []),
                "outputs": len(plan.outputs or []),
                "values": len(plan.values or []),
                "instructions": sum(len(c.instructions or []) for c in plan.chains or []),
                "operators": [
                    o.name + (f".{o.overload}" if o.overload else "") for o in plan.operators or []
                ],
                "delegates": len(plan.delegates or []),
                "external_tensors": len(externals),
            }
        )
        for di, d in enumerate(plan.delegates or []):
            ins.delegates.append(
                _describe_delegate(f, ins, pi, plan.name, di, d, segs, inline, base, used)
            )


def _describe_delegate(
    f: Any,
    ins: Inspection,
    plan_index: int,
    plan_name: str,
    index: int,
    d: Any,
    segs: list[Any],
    inline: list[Any],
    base: int,
    used: dict[int, list[str]],
) -> dict[str, Any]:
    loc = int(d.processed.location)
    entry: dict[str, Any] = {
        "plan": plan_name,
        "index": index,
        "id": d.id,
        "location": _DATA_LOCATION.get(loc, str(loc)),
        "data_index": d.processed.index,
        "compile_specs": {c.key: _show_bytes(bytes(c.value)) for c in d.compile_specs or []},
    }
    where = f"delegate {index} ({d.id}) of plan {plan_name!r}"
    blob_head: bytes | None = None
    if loc == 1:
        if d.processed.index >= len(segs):
            ins.error(f"{where}: segment index {d.processed.index} out of range ({len(segs)})")
            return entry
        s = segs[d.processed.index]
        entry.update({"size": s.size, "absolute_offset": base + s.offset})
        used[d.processed.index].append(f"delegate:{plan_name}/{index}")
        if base + s.offset + s.size <= ins.file_size:
            blob_head = _read_at(f, base + s.offset, min(s.size, TRT_READ_LIMIT))
    elif loc == 0:
        if d.processed.index >= len(inline):
            ins.error(f"{where}: inline data index {d.processed.index} out of range")
            return entry
        data = bytes(inline[d.processed.index].data)
        entry["size"] = len(data)
        blob_head = data[:TRT_READ_LIMIT]
    else:
        ins.error(f"{where}: unknown data location {loc}")
        return entry
    if blob_head is not None and (blob_head[:4] in (b"TR01", b"TR02")
                                  or d.id == "TensorRTBackend"):
        entry["tensorrt"] = _describe_trt_blob(ins, where, blob_head, entry.get("size", 0),
                                               entry.get("absolute_offset"))
    return entry


def _alignment(offset: int) -> int:
    """The largest power of two (up to 1 MiB) that divides ``offset``."""
    return min(offset & -offset, 1 << 20) if offset else 1 << 20


def _describe_trt_blob(ins: Inspection, where: str, head: bytes, size: int,
                       segment_offset: int | None = None) -> dict[str, Any]:
    from trtet_store.export import trt_blob

    out: dict[str, Any] = {}
    try:
        h = trt_blob.BlobHeader.from_bytes(head)
    except ValueError as exc:
        ins.error(f"{where}: bad TensorRT blob header: {exc}")
        return out
    out["header"] = {
        "magic": h.magic,
        "metadata_offset": h.metadata_offset,
        "metadata_size": h.metadata_size,
        "engine_offset": h.engine_offset,
        "engine_size": h.engine_size,
    }
    if h.metadata_offset + h.metadata_size > min(size, len(head)):
        ins.error(f"{where}: TensorRT metadata runs past the blob ({size} bytes)")
        return out
    if h.engine_offset + h.engine_size > size:
        ins.error(
            f"{where}: TensorRT engine [{h.engine_offset}, {h.engine_offset + h.engine_size}) "
            f"runs past the blob ({size} bytes)"
        )
    raw = head[h.metadata_offset : h.metadata_offset + h.metadata_size]
    try:
        out["metadata"] = json.loads(raw)
        trt_blob.BlobMetadata.from_json(raw)
    except Exception as exc:
        ins.error(f"{where}: TensorRT metadata is not valid JSON metadata: {exc}")
        return out
    meta = out["metadata"]
    if isinstance(meta, dict):
        key = meta.get("engine_key")
        if key is not None and h.engine_size:
            ins.warn(f"{where}: has engine bytes and an engine_key {key!r}")
        if key is None and not h.engine_size:
            ins.error(f"{where}: TensorRT blob has no engine bytes and no engine_key")
        if key is not None:
            out["engine"] = {"layout": "named", "key": key}
        else:
            # Inline: the layout torch-tensorrt-executorch-runtime 0.1.0 reads.
            engine: dict[str, Any] = {"layout": "inline", "size": h.engine_size,
                                      "blob_offset": h.engine_offset}
            if segment_offset is not None:
                engine["file_offset"] = segment_offset + h.engine_offset
                engine["alignment"] = _alignment(engine["file_offset"])
            out["engine"] = engine
    return out


# --- .ptd ------------------------------------------------------------------------------


def _inspect_ptd(f: Any, head: bytes, ins: Inspection) -> None:
    size = ins.file_size
    root = _check_head(head, ins, PTD_IDENTIFIER, "")
    if len(head) < 48:
        return
    magic = head[8:12]
    ins.header["magic"] = magic
    if magic != PTD_HEADER_MAGIC:
        ins.error(
            f"header magic {_show_bytes(magic)!r} at byte 8 is not {PTD_HEADER_MAGIC.decode()} "
            "(InvalidExternalData)"
        )
        return
    length = _u32(head, 12)
    fb_offset = _u64(head, 16)
    fb_size = _u64(head, 24)
    base = _u64(head, 32)
    data_size = _u64(head, 40)
    ins.header.update(
        {
            "header_length": length,
            "flatbuffer_offset": fb_offset,
            "flatbuffer_size": fb_size,
            "segment_base_offset": base,
            "segment_data_size": data_size,
        }
    )
    if length < PTD_HEADER_MIN_LENGTH:
        ins.error(f"header length {length} < {PTD_HEADER_MIN_LENGTH}")
    fb_end = fb_offset + fb_size
    if fb_end > size:
        ins.error(f"flatbuffer region ends at {fb_end}, past the end of the file ({size} bytes)")
        return
    if base < fb_end:
        ins.error(f"segment_base_offset {base} lies inside the flatbuffer (ends {fb_end})")
    end = base + data_size
    if end > size:
        ins.error(f"segments end at byte {end} but the file has {size}: truncated by {end - size}")
    elif end < size:
        ins.warn(f"{size - end} bytes after the last segment (the runtime ignores them)")
    if not 8 <= root <= fb_end - 4:
        ins.error(f"root table offset {root} is outside the flatbuffer [8, {fb_end - 4}]")
        return
    data = _read_at(f, 0, fb_end)
    try:
        from executorch.extension.flat_tensor.serialize.serialize import (
            _deserialize_to_flat_tensor,
        )

        ft = _deserialize_to_flat_tensor(data)
    except Exception as exc:
        ins.error(f"the FlatTensor flatbuffer does not parse: {type(exc).__name__}: {exc}")
        return
    ins.program["version"] = ft.version
    if ft.version > SUPPORTED_VERSION:
        ins.error(f"FlatTensor version {ft.version} is newer than supported ({SUPPORTED_VERSION})")
    used: dict[int, list[str]] = {i: [] for i in range(len(ft.segments))}
    prev_end = 0
    for i, s in enumerate(ft.segments):
        absolute = base + s.offset
        ins.segments.append(
            {
                "index": i,
                "offset": s.offset,
                "size": s.size,
                "absolute_offset": absolute,
                "end": absolute + s.size,
                "page_aligned": absolute % PAGE == 0,
                "used_by": used[i],
            }
        )
        if s.offset + s.size > data_size:
            ins.error(f"segment {i} ends past segment_data_size {data_size}")
        if absolute + s.size > size:
            ins.error(
                f"segment {i} at bytes [{absolute}, {absolute + s.size}) is past the end of the "
                f"file ({size} bytes): truncated"
            )
        if s.offset < prev_end:
            ins.error(f"segment {i} at {s.offset} overlaps the previous one (ends {prev_end})")
        prev_end = max(prev_end, s.offset + s.size)
    for nd in ft.named_data:
        entry: dict[str, Any] = {"key": nd.key, "segment_index": nd.segment_index}
        if nd.tensor_layout is not None:
            tl = nd.tensor_layout
            entry["tensor_layout"] = {
                "scalar_type": str(getattr(tl.scalar_type, "name", tl.scalar_type)),
                "sizes": list(tl.sizes),
                "dim_order": list(tl.dim_order),
            }
        if nd.segment_index >= len(ft.segments):
            ins.error(f"named data {nd.key!r}: segment index {nd.segment_index} out of range")
        else:
            s = ft.segments[nd.segment_index]
            entry.update({"absolute_offset": base + s.offset, "size": s.size})
            used[nd.segment_index].append(f"named:{nd.key}")
        ins.named_data.append(entry)


# --- verify ----------------------------------------------------------------------------


@dataclass
class VerifyResult:
    """The outcome of :func:`verify`.

    Attributes:
        files: The inspection of every file checked (the main file first).
        problems: Cross-file and runtime problems (each file's own are in its inspection).
        runtime: What the runtime load did (``--run``): ``loaded``, ``methods``
            (name -> ``loaded``, ``skipped: ...`` or the error), or None.
    """

    files: list[Inspection]
    problems: list[Problem] = field(default_factory=list)
    runtime: dict[str, Any] | None = None

    @property
    def all_problems(self) -> list[Problem]:
        """Every problem, each file's and the cross-file ones."""
        return [p for ins in self.files for p in ins.problems] + self.problems

    @property
    def ok(self) -> bool:
        """True when no check found an error."""
        return not any(p.severity == "error" for p in self.all_problems)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "files": [
                {
                    "path": os.fspath(i.path),
                    "kind": i.kind,
                    "problems": [p.to_json() for p in i.problems],
                }
                for i in self.files
            ],
            "problems": [p.to_json() for p in self.problems],
            "runtime": self.runtime,
        }


def verify(
    path: os.PathLike | str,
    *,
    data: os.PathLike | str | None = None,
    run: bool = False,
    engine_digests: Iterable[str] | None = None,
) -> VerifyResult:
    """Check a ``.pte`` (with its ``.ptd``) or a ``.ptd`` for structural soundness.

    Every TensorRT delegate blob gets the checks torch-tensorrt 2.14.0's
    ``deserialize_engine`` (and so its runtime) makes: magic, metadata past the
    header and inside the blob, a 16-aligned engine offset past the metadata,
    the engine inside the blob, JSON metadata. Each engine's bytes are read
    once (streamed) for its xxh3-128 digest, which must match its named-data
    key (``<digest>_trt_engine``) and, when given, ``engine_digests``.

    Args:
        path: The file to check.
        data: The ``.ptd`` the ``.pte`` reads external data from; it is
            checked too, and every engine key and external tensor the
            ``.pte`` names must be found in it (or in the ``.pte``).
        engine_digests: The xxh3-128 digests the engines must have (e.g. the
            keys of ``CompileReport.engines`` without ``_trt_engine``); an
            engine whose digest is not among them is an error.
        run: Also load the program with the ExecuTorch runtime
            (``Runtime.get().load_program`` with full verification) and load
            every method whose delegates' backends are registered in this
            runtime (others are reported as skipped). This runs in a child
            process, so a file that crashes the runtime is reported as such
            (with the signal and the step) instead of killing the caller.

    Returns:
        The findings; :attr:`VerifyResult.ok` is False on any error.

    Raises:
        FileNotFoundError: A file does not exist.
        ValueError: ``run`` or ``data`` given for a ``.ptd``.
    """
    main = inspect_file(path)
    result = VerifyResult([main])
    if main.kind == "ptd" and (run or data is not None):
        raise ValueError("--data and --run apply to a .pte; a .ptd is checked on its own")
    ptd: Inspection | None = None
    if data is not None:
        ptd = inspect_file(data)
        result.files.append(ptd)
        if ptd.kind != "ptd":
            result.problems.append(Problem("error", f"{data} is not a .ptd"))
    if main.kind == "pte":
        _cross_check(main, ptd, result)
        _check_engines(main, ptd, result,
                       None if engine_digests is None else set(engine_digests))
    if run and main.kind == "pte":
        result.runtime = _run_program(main, ptd, result)
    return result


def _digest_range(path: Path, offset: int, size: int, *, sha256: bool = False) -> tuple[str, str]:
    """xxh3-128 (and SHA-256 when asked, else "") of ``size`` bytes of ``path`` at ``offset``."""
    import hashlib

    import xxhash

    h, sha = xxhash.xxh3_128(), hashlib.sha256() if sha256 else None
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left:
            part = f.read(min(left, 8 << 20))
            if not part:
                raise ValueError(f"{path} ends {left} bytes early")
            h.update(part)
            if sha is not None:
                sha.update(part)
            left -= len(part)
    return h.hexdigest(), sha.hexdigest() if sha is not None else ""


def _key_digest(key: str) -> str | None:
    """The content digest a named engine key carries: ``<xxh3-128 or SHA-256 hex>_trt_engine``."""
    stem = key.removesuffix("_trt_engine")
    if len(stem) in (32, 64) and all(c in "0123456789abcdef" for c in stem):
        return stem
    return None


def _check_engines(pte: Inspection, ptd: Inspection | None, result: VerifyResult,
                   expected: set[str] | None) -> None:
    named = {d["key"]: (ins.path, d) for ins in ([pte] + ([ptd] if ptd else []))
             for d in ins.named_data if "absolute_offset" in d}
    for d in pte.delegates:
        engine = d.get("tensorrt", {}).get("engine")
        if not engine:
            continue
        where = f"delegate {d['plan']}/{d['index']} ({d['id']})"
        if engine["layout"] == "inline":
            if "file_offset" not in engine or (
                    engine["blob_offset"] + engine["size"] > d.get("size", 0)
                    or engine["file_offset"] + engine["size"] > pte.file_size):
                continue  # in the flatbuffer, or past its blob or file (an error already)
            digest, _ = _digest_range(pte.path, engine["file_offset"], engine["size"])
        else:
            found = named.get(engine["key"])
            if found is None or found[1]["absolute_offset"] + found[1]["size"] > os.path.getsize(
                    found[0]):
                continue  # reported by _cross_check, or past the end of its file
            # Ours key engines by xxh3-128, Torch-TensorRT's by SHA-256.
            stored = _key_digest(engine["key"])
            digest, sha = _digest_range(found[0], found[1]["absolute_offset"], found[1]["size"],
                                        sha256=stored is not None and len(stored) == 64)
            if stored is not None and stored not in (digest, sha):
                result.problems.append(Problem(
                    "error", f"{where}: engine {engine['key']!r} has digest "
                    f"{sha or digest}: its bytes are not the ones it was stored under"))
        engine["xxh3_128"] = digest
        if expected is not None and digest not in expected:
            result.problems.append(Problem(
                "error", f"{where}: engine digest {digest} is not one of the expected engines"))


def _cross_check(pte: Inspection, ptd: Inspection | None, result: VerifyResult) -> None:
    known = set(pte.keys) | (ptd.keys if ptd is not None else set())
    wanted = []
    for d in pte.delegates:
        key = (d.get("tensorrt", {}).get("metadata") or {}).get("engine_key")
        if key:
            wanted.append((f"delegate {d['index']} ({d['id']}) engine_key", key))
    wanted += [("external tensor", name) for name in pte.external_tensors]
    for what, key in wanted:
        if key in known:
            continue
        if ptd is None:
            result.problems.append(
                Problem(
                    "warning",
                    f"{what} {key!r} is not in the .pte; it must come from a .ptd "
                    "(pass --data to check it)",
                )
            )
        else:
            result.problems.append(
                Problem("error", f"{what} {key!r} is in neither the .pte nor {ptd.path.name}")
            )


#: Loads the program in a child process: a bad file can crash the 1.5.1 runtime
#: (XNNPACK's load_method segfaults without its .ptd), which must not take the
#: verifier down with it. Prints one JSON event per line; the last is the result.
_CHILD = """
import json, sys
def emit(**event):
    print(json.dumps(event), flush=True)
pte, ptd, plans = sys.argv[1], sys.argv[2] or None, json.loads(sys.argv[3])
out = {"loaded": False, "methods": {}, "registered_backends": []}
try:
    from executorch.runtime import Runtime, Verification
    runtime = Runtime.get()
    emit(event="load_program")
    # executorch 1.4's runtime loads no .ptd: ask for one only when given.
    extra = {"data_path": ptd} if ptd else {}
    program = runtime.load_program(pte, verification=Verification.InternalConsistency, **extra)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
    emit(event="result", result=out)
    sys.exit(0)
out["loaded"] = True
try:
    registered = set(runtime.backend_registry.registered_backend_names)
except Exception:
    registered = set()
out["registered_backends"] = sorted(registered)
for name in sorted(program.method_names):
    missing = sorted(set(plans.get(name, [])) - registered)
    if missing:
        out["methods"][name] = {"state": "skipped", "missing_backends": missing}
        continue
    emit(event="load_method", method=name)
    try:
        method = program.load_method(name)
    except Exception as exc:
        out["methods"][name] = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
        continue
    # Run it once on zeros of its input shapes: loading alone never calls a kernel.
    emit(event="execute", method=name)
    try:
        import torch
        dtypes = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32,
                  4: torch.int64, 5: torch.float16, 6: torch.float32, 7: torch.float64,
                  11: torch.bool, 15: torch.bfloat16}
        meta = method.metadata
        infos = [meta.input_tensor_meta(i) for i in range(meta.num_inputs())]
        outputs = method.execute([torch.zeros(tuple(t.sizes()), dtype=dtypes[int(t.dtype())])
                                  for t in infos])
    except Exception as exc:
        out["methods"][name] = {"state": "failed",
                                "error": f"executing: {type(exc).__name__}: {exc}"}
    else:
        out["methods"][name] = {"state": "executed", "outputs": len(outputs)}
emit(event="result", result=out)
"""


def _data_hint(pte: Inspection, ptd: Inspection | None) -> str:
    """Why a program may fail without its ``.ptd``, when it is the likely cause."""
    if ptd is not None:
        return ""
    wanted = list(pte.external_tensors) + [
        k for d in pte.delegates
        if (k := (d.get("tensorrt", {}).get("metadata") or {}).get("engine_key"))]
    missing = [k for k in wanted if k not in set(pte.keys)]
    if missing:
        return (f"; the program reads {len(missing)} entries from a .ptd ({missing[0]!r}"
                f"{', ...' if len(missing) > 1 else ''}): pass --data FILE.ptd")
    # A delegate's external weights are named inside its own blob, out of sight.
    beside = sorted(p.name for p in pte.path.parent.glob("*.ptd"))
    if beside:
        return (f"; if the program keeps data in a .ptd ({', '.join(beside)} is beside it), "
                "pass --data FILE.ptd")
    return ""


def _run_program(pte: Inspection, ptd: Inspection | None, result: VerifyResult) -> dict[str, Any]:
    out: dict[str, Any] = {"loaded": False, "methods": {}}
    if pte.errors or (ptd is not None and ptd.errors):
        out["skipped"] = "structural errors: not handing the file to the runtime"
        result.problems.append(Problem("error", "runtime load skipped: structural errors"))
        return out
    plans: dict[str, list[str]] = {}
    for d in pte.delegates:
        plans.setdefault(d["plan"], []).append(d["id"])
    argv = [
        sys.executable,
        "-c",
        _CHILD,
        os.fspath(pte.path),
        os.fspath(ptd.path) if ptd is not None else "",
        json.dumps(plans),
    ]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUNTIME_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        out["error"] = f"the runtime did not finish within {RUNTIME_TIMEOUT} s"
        result.problems.append(Problem("error", out["error"]))
        return out
    events = []
    for line in proc.stdout.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    final = next((e["result"] for e in reversed(events) if e.get("event") == "result"), None)
    if final is None:
        last = events[-1] if events else {"event": "start"}
        where = (
            f"loading method {last['method']!r}"
            if last.get("event") == "load_method"
            else f"executing method {last['method']!r}"
            if last.get("event") == "execute"
            else "loading the program"
            if last.get("event") == "load_program"
            else "starting"
        )
        if proc.returncode < 0:
            try:
                how = signal.Signals(-proc.returncode).name
            except ValueError:
                how = f"signal {-proc.returncode}"
            out["error"] = f"the runtime crashed ({how}) while {where}" + _data_hint(pte, ptd)
            if last.get("event") in ("load_method", "execute"):
                out["loaded"] = True
                out["methods"][last["method"]] = f"crashed ({how})"
        else:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            out["error"] = f"the runtime exited with {proc.returncode} while {where}: {tail}"
        result.problems.append(Problem("error", out["error"]))
        return out
    out.update({k: v for k, v in final.items() if k != "methods"})
    if not final.get("loaded"):
        result.problems.append(
            Problem("error", f"the runtime refused the program: {final.get('error')}"
                    + _data_hint(pte, ptd))
        )
        return out
    for name, state in final["methods"].items():
        if state["state"] == "skipped":
            text = (
                f"skipped: backend {', '.join(state['missing_backends'])} not registered in "
                "this runtime"
            )
            result.problems.append(Problem("warning", f"method {name!r} {text}"))
        elif state["state"] == "failed":
            text = state["error"]
            what = "failed" if text.startswith("executing") else "failed to load"
            result.problems.append(Problem(
                "error", f"method {name!r} {what}: {text}{_data_hint(pte, ptd)}"))
        else:
            text = f"executed on zeros ({state['outputs']} outputs)"
        out["methods"][name] = text
    return out


# --- text ------------------------------------------------------------------------------


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n} ({n / div:.1f} {unit})"
    return str(n)


def format_inspection(ins: Inspection) -> str:
    """The layout as readable text."""
    lines = [f"{ins.path}: {ins.kind}, {_size(ins.file_size)} bytes"]
    if ins.header:
        lines.append("header:")
        for k, v in ins.header.items():
            shown = _show_bytes(v) if isinstance(v, bytes) else v
            lines.append(f"  {k}: {shown}")
    if ins.program:
        lines.append("program: " + ", ".join(f"{k}={v}" for k, v in ins.program.items()))
    for p in ins.plans:
        lines.append(
            f"plan {p['name']!r}: {p['inputs']} inputs, {p['outputs']} outputs, "
            f"{p['instructions']} instructions, {p['delegates']} delegates, "
            f"operators {p['operators'] or '[]'}"
        )
    if ins.segments:
        lines.append("segments:")
        lines.append(f"  {'#':>3}  {'absolute':>14}  {'size':>14}  {'page':>4}  used by")
        for s in ins.segments:
            lines.append(
                f"  {s['index']:>3}  {s['absolute_offset']:>14}  {s['size']:>14}  "
                f"{'yes' if s['page_aligned'] else 'no':>4}  {', '.join(s['used_by']) or '-'}"
            )
    if ins.named_data:
        lines.append("named data:")
        for d in ins.named_data:
            extra = ""
            if "tensor_layout" in d:
                tl = d["tensor_layout"]
                extra = f" {tl['scalar_type']}{tl['sizes']}"
            lines.append(
                f"  {d['key']}: segment {d['segment_index']}, at {d.get('absolute_offset', '?')}, "
                f"{_size(d.get('size'))} bytes{extra}"
            )
    if ins.delegates:
        lines.append("delegates:")
        for d in ins.delegates:
            lines.append(
                f"  {d['plan']}/{d['index']}: {d['id']}, {d['location']} {d['data_index']}, "
                f"{_size(d.get('size'))} bytes"
                + (f" at {d['absolute_offset']}" if "absolute_offset" in d else "")
            )
            if d["compile_specs"]:
                specs = ", ".join(f"{k}={v}" for k, v in d["compile_specs"].items())
                lines.append(f"    compile specs: {specs}")
            trt = d.get("tensorrt")
            if trt:
                h = trt.get("header", {})
                lines.append(
                    f"    TensorRT blob {_show_bytes(h.get('magic', b''))}: metadata "
                    f"{h.get('metadata_size')} B at {h.get('metadata_offset')}, engine "
                    f"{h.get('engine_size')} B at {h.get('engine_offset')}"
                )
                engine = trt.get("engine", {})
                digest = f", xxh3-128 {engine['xxh3_128']}" if "xxh3_128" in engine else ""
                if engine.get("layout") == "inline":
                    where = (f"at file offset {engine['file_offset']} (aligned to "
                             f"{engine['alignment']})" if "file_offset" in engine else "")
                    lines.append(f"    engine: inline, {_size(engine['size'])} bytes "
                                 f"{where}{digest}")
                elif engine.get("layout") == "named":
                    lines.append(f"    engine: named data {engine['key']!r} (in a .ptd; no "
                                 f"released runtime reads this layout){digest}")
                meta = trt.get("metadata")
                if isinstance(meta, dict):
                    for k, v in meta.items():
                        lines.append(f"      {k}: {v}")
    if ins.external_tensors:
        lines.append(f"external tensors (in a .ptd): {', '.join(ins.external_tensors)}")
    if ins.problems:
        lines.append("problems:")
        lines += [f"  {p.severity}: {p.message}" for p in ins.problems]
    else:
        lines.append("problems: none")
    return "\n".join(lines)


def format_verify(result: VerifyResult) -> str:
    """The verification as readable text, one line per finding."""
    lines = []
    for ins in result.files:
        status = "ok" if not ins.errors else f"{len(ins.errors)} error(s)"
        lines.append(f"{ins.path}: {ins.kind}, {ins.file_size} bytes: {status}")
        lines += [f"  {p.severity}: {p.message}" for p in ins.problems]
    lines += [f"{p.severity}: {p.message}" for p in result.problems]
    if result.runtime is not None:
        rt = result.runtime
        if rt.get("loaded"):
            lines.append("runtime: program loaded")
            for name, state in rt.get("methods", {}).items():
                lines.append(f"  method {name}: {state}")
        else:
            lines.append(f"runtime: not loaded ({rt.get('error') or rt.get('skipped')})")
        if rt.get("loaded") and rt.get("error"):
            lines.append(f"runtime: {rt['error']}")
    lines.append("OK" if result.ok else "FAILED")
    return "\n".join(lines)
