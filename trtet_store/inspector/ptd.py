"""A ``.ptd``: its ``FH01`` header, FlatTensor, segments and named data."""

from __future__ import annotations

from typing import Any

from trtet_store.inspector.common import (
    PTD_HEADER_MAGIC,
    PTD_HEADER_MIN_LENGTH,
    PTD_IDENTIFIER,
    SUPPORTED_VERSION,
    check_head,
    check_segments,
    named_data_entry,
    read_at,
    show_bytes,
    u32,
    u64,
)
from trtet_store.inspector.model import Inspection


def inspect_ptd(f: Any, head: bytes, ins: Inspection) -> None:
    size = ins.file_size
    root = check_head(head, ins, PTD_IDENTIFIER, "")
    if len(head) < 48:
        return
    magic = head[8:12]
    ins.header["magic"] = magic
    if magic != PTD_HEADER_MAGIC:
        ins.error(
            f"header magic {show_bytes(magic)!r} at byte 8 is not {PTD_HEADER_MAGIC.decode()} "
            "(InvalidExternalData)"
        )
        return
    length = u32(head, 12)
    fb_offset = u64(head, 16)
    fb_size = u64(head, 24)
    base = u64(head, 32)
    data_size = u64(head, 40)
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
    data = read_at(f, 0, fb_end)
    try:
        from trtet_store.export._executorch_private import flat_tensor_from_flatbuffer

        ft = flat_tensor_from_flatbuffer(data)
    except Exception as exc:
        ins.error(f"the FlatTensor flatbuffer does not parse: {type(exc).__name__}: {exc}")
        return
    ins.program["version"] = ft.version
    if ft.version > SUPPORTED_VERSION:
        ins.error(f"FlatTensor version {ft.version} is newer than supported ({SUPPORTED_VERSION})")
    used: dict[int, list[str]] = {i: [] for i in range(len(ft.segments))}
    check_segments(ins, ft.segments, base, data_size, used)
    for nd in ft.named_data:
        extra: dict[str, Any] = {}
        if nd.tensor_layout is not None:
            tl = nd.tensor_layout
            extra["tensor_layout"] = {
                "scalar_type": str(getattr(tl.scalar_type, "name", tl.scalar_type)),
                "sizes": list(tl.sizes),
                "dim_order": list(tl.dim_order),
            }
        ins.named_data.append(named_data_entry(ins, nd, ft.segments, base, used, **extra))
