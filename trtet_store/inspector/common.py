"""What the readers share: format constants, byte helpers, the head check."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

from trtet_store.inspector.model import Inspection, show_bytes
from trtet_store.io.units import PAGE, MiB

HEAD_BYTES = 64  # what both runtime readers load first
PTE_IDENTIFIER = b"ET12"
PTE_HEADER_MAGIC = b"eh00"
PTE_HEADER_MIN_LENGTH = 24
PTD_IDENTIFIER = b"FT01"
PTD_HEADER_MAGIC = b"FH01"
PTD_HEADER_MIN_LENGTH = 40
SUPPORTED_VERSION = 0
#: Bytes of a delegate blob read to decode a TensorRT header and its metadata.
TRT_READ_LIMIT = MiB
#: Seconds a runtime load (``verify --run``) may take.
RUNTIME_TIMEOUT = 600

DATA_LOCATION = {0: "INLINE", 1: "SEGMENT"}


def u32(b: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", b, off)[0])


def u64(b: bytes, off: int) -> int:
    return int(struct.unpack_from("<Q", b, off)[0])


def read_at(f: Any, offset: int, size: int) -> bytes:
    return os.pread(f.fileno(), size, offset)


def check_head(head: bytes, ins: Inspection, identifier: bytes, refusal: str) -> int:
    """Record the root offset and file identifier, checked as the runtime checks them.

    Returns the root offset.
    """
    ident = head[4:8]
    root = u32(head, 0)
    ins.header.update({"root_offset": root, "file_identifier": ident})
    if ident != identifier:
        ins.error(f"file identifier {show_bytes(ident)!r}: the runtime reads only "
                  f"{identifier.decode()}{refusal}")
    if len(head) < HEAD_BYTES:
        ins.error(f"file has {ins.file_size} bytes; the runtime reads {HEAD_BYTES} head "
                  "bytes first")
    return root


def alignment_of(offset: int) -> int:
    """The largest power of two (up to 1 MiB) that divides ``offset``."""
    return min(offset & -offset, MiB) if offset else MiB


def named_data_entry(ins: Inspection, nd: Any, segments: Sequence[Any], base: int,
                     used: dict[int, list[str]], **extra: Any) -> dict[str, Any]:
    """One named-data entry of either format, checked against the segment table.

    Parameters
    ----------
    ins : Inspection
        Collects the error of an index out of range.
    nd : NamedData
        The flatbuffer's entry (``key``, ``segment_index``).
    segments : sequence
        The segment table the index points into.
    base : int
        The file offset of segment data.
    used : dict
        Per segment index, what uses it; the entry adds ``named:<key>``.
    **extra
        More fields, placed after ``segment_index`` (a ``.ptd``'s tensor layout).

    Returns
    -------
    dict
        ``key``, ``segment_index``, the ``extra`` fields, and, for an index in
        range, the bytes' ``absolute_offset`` and ``size``.
    """
    entry: dict[str, Any] = {"key": nd.key, "segment_index": nd.segment_index, **extra}
    if nd.segment_index >= len(segments):
        ins.error(f"named data {nd.key!r}: segment index {nd.segment_index} out of range")
    else:
        s = segments[nd.segment_index]
        entry.update({"absolute_offset": base + s.offset, "size": s.size})
        used[nd.segment_index].append(f"named:{nd.key}")
    return entry


def check_segments(ins: Inspection, segments: Any, base: int, data_size: int,
                   used: dict[int, list[str]]) -> None:
    """Record each segment at its absolute offset and check it against the file.

    Both formats share this: a segment table of ``(offset, size)`` relative to
    ``base``, inside ``data_size`` bytes of segment data and inside the file,
    in order, without overlaps.
    """
    prev_end = 0
    for i, s in enumerate(segments):
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
        if absolute + s.size > ins.file_size:
            ins.error(
                f"segment {i} at bytes [{absolute}, {absolute + s.size}) is past the end of the "
                f"file ({ins.file_size} bytes): truncated"
            )
        if s.offset < prev_end:
            ins.error(f"segment {i} at {s.offset} overlaps the previous one (ends {prev_end})")
        prev_end = max(prev_end, s.offset + s.size)
