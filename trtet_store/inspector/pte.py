"""A ``.pte``: its extended header, its Program, segments, named data, delegates, TensorRT blobs."""

from __future__ import annotations

from typing import Any

from trtet_store.inspector.common import (
    DATA_LOCATION,
    PTE_HEADER_MAGIC,
    PTE_HEADER_MIN_LENGTH,
    PTE_IDENTIFIER,
    SUPPORTED_VERSION,
    TRT_READ_LIMIT,
    alignment_of,
    check_head,
    check_segments,
    named_data_entry,
    read_at,
    show_bytes,
    u32,
    u64,
)
from trtet_store.inspector.model import Inspection
from trtet_store.inspector.trt_metadata import check_metadata


def inspect_pte(f: Any, head: bytes, ins: Inspection) -> None:
    size = ins.file_size
    root = check_head(head, ins, PTE_IDENTIFIER, " (IncompatibleVersion)")
    program_size = size
    base = 0
    data_size = 0
    if head[8:12] == PTE_HEADER_MAGIC and len(head) >= 40:
        length = u32(head, 12)
        program_size = u64(head, 16)
        base = u64(head, 24)
        data_size = u64(head, 32) if length > PTE_HEADER_MIN_LENGTH else 0
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
            ins.error(f"unknown extended header magic {show_bytes(head[8:12])!r}")
    ins.header["program_size"] = program_size
    if not 8 <= root <= program_size - 4:
        ins.error(f"root table offset {root} is outside the program [8, {program_size - 4}]")
        return
    data = read_at(f, 0, program_size)
    try:
        from trtet_store.export._executorch_private import program_from_flatbuffer

        program = program_from_flatbuffer(data)
    except Exception as exc:
        ins.error(f"the Program flatbuffer does not parse: {type(exc).__name__}: {exc}")
        return
    _describe_program(f, program, ins, base, data_size)


def _describe_program(f: Any, program: Any, ins: Inspection, base: int, data_size: int) -> None:
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
    check_segments(ins, segs, base, data_size, used)

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
        ins.named_data.append(named_data_entry(ins, nd, segs, base, used))
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
                st = getattr(val, "scalar_type", None)
                ins.external_layouts[info.fully_qualified_name] = {
                    "scalar_type": str(getattr(st, "name", st)),
                    "sizes": list(getattr(val, "sizes", None) or []),
                }
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
        calls = _delegate_arguments(plan)
        for di, d in enumerate(plan.delegates or []):
            ins.delegates.append(
                _describe_delegate(f, ins, pi, plan.name, di, d, segs, inline, base, used,
                                   calls.get(di))
            )


def _delegate_arguments(plan: Any) -> dict[int, int]:
    """Per delegate index of ``plan``, how many values its call passes (inputs, then outputs)."""
    calls: dict[int, int] = {}
    for chain in plan.chains or []:
        for instruction in chain.instructions or []:
            call = instruction.instr_args
            if type(call).__name__ == "DelegateCall":
                calls[call.delegate_index] = len(call.args or [])
    return calls


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
    arguments: int | None = None,
) -> dict[str, Any]:
    loc = int(d.processed.location)
    entry: dict[str, Any] = {
        "plan": plan_name,
        "index": index,
        "id": d.id,
        "location": DATA_LOCATION.get(loc, str(loc)),
        "data_index": d.processed.index,
        "compile_specs": {c.key: show_bytes(bytes(c.value)) for c in d.compile_specs or []},
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
            # Up to TRT_READ_LIMIT only for a TensorRT blob; others need 4 bytes to tell.
            head = read_at(f, base + s.offset, min(s.size, 4))
            if head in (b"TR01", b"TR02") or d.id == "TensorRTBackend":
                head = read_at(f, base + s.offset, min(s.size, TRT_READ_LIMIT))
            blob_head = head
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
        # Upstream's preprocess binds exactly the delegate's arguments (inputs, then
        # outputs); another backend with TensorRT-format blobs may pass more.
        entry["tensorrt"] = _describe_trt_blob(
            ins, where, blob_head, entry.get("size", 0), entry.get("absolute_offset"),
            arguments if d.id == "TensorRTBackend" else None)
    return entry


def _describe_trt_blob(ins: Inspection, where: str, head: bytes, size: int,
                       segment_offset: int | None = None,
                       arguments: int | None = None) -> dict[str, Any]:
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
    meta, errors, warnings = check_metadata(raw, h.magic)
    for message in errors:
        ins.error(f"{where}: {message}")
    for message in warnings:
        ins.warn(f"{where}: {message}")
    if meta is None:
        return out
    out["metadata"] = meta
    bindings = meta.get("io_bindings")
    if isinstance(bindings, list) and arguments is not None and len(bindings) != arguments:
        ins.error(f"{where}: TensorRT metadata has {len(bindings)} io_bindings but the "
                  f"delegate is called with {arguments} inputs and outputs")
    key = meta.get("engine_key")
    if not isinstance(key, str) or not key:
        key = None  # a bad engine_key is an error already; the engine is looked up inline
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
            engine["alignment"] = alignment_of(engine["file_offset"])
        out["engine"] = engine
    return out
