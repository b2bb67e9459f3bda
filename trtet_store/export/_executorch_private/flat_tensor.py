"""A ``.ptd``'s FlatTensor flatbuffer read in pure Python: no torch, no ``flatc``.

ExecuTorch's own reader (``_deserialize_to_flat_tensor``) imports torch (through
``_named_data_store``) and runs the ``flatc`` binary on a temporary directory: seconds
for a header ``trtet-store inspect X.ptd`` and ``verify --data`` read. This reads the
few tables of ``flat_tensor.fbs`` (the same in ExecuTorch 1.4.1 and 1.5.1) straight
from the bytes, every offset checked against the buffer, and gives the same fields as
ExecuTorch's dataclasses (``version``, ``segments[].offset/.size``,
``named_data[].key/.segment_index/.tensor_layout``); tests/test_first_hour.py compares
the two on real files.

    table FlatTensor { version: uint32; segments: [DataSegment]; named_data: [NamedData]; }
    table DataSegment { offset: uint64; size: uint64; }
    table NamedData { key: string; segment_index: uint32; tensor_layout: TensorLayout; }
    table TensorLayout { scalar_type: ScalarType (byte); sizes: [int32]; dim_order: [uint8]; }
"""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any


class _Buffer:
    """Bounds-checked little-endian reads of a flatbuffer (ValueError on a bad offset)."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def read(self, fmt: str, at: int) -> Any:
        size = struct.calcsize(fmt)
        if at < 0 or at + size > len(self.data):
            raise ValueError(f"offset {at} (+{size}) outside the flatbuffer "
                             f"({len(self.data)} bytes)")
        return struct.unpack_from("<" + fmt, self.data, at)[0]

    def table(self, at: int) -> _Table:
        return _Table(self, at)

    def indirect(self, at: int) -> int:
        """The position an offset field at ``at`` points to (uoffset, relative to itself)."""
        return at + self.read("I", at)


class _Table:
    def __init__(self, buf: _Buffer, at: int) -> None:
        self.buf, self.at = buf, at
        self.vtable = at - buf.read("i", at)
        self.vtable_size = buf.read("H", self.vtable)

    def _field(self, index: int) -> int:
        """The field's position in the table, 0 when absent (its default)."""
        slot = 4 + 2 * index
        if slot + 2 > self.vtable_size:
            return 0
        offset = self.buf.read("H", self.vtable + slot)
        return self.at + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._field(index)
        return self.buf.read(fmt, at) if at else default

    def _vector(self, index: int) -> tuple[int, int]:
        """(position of the first element, length); (0, 0) when absent."""
        at = self._field(index)
        if not at:
            return 0, 0
        start = self.buf.indirect(at)
        return start + 4, self.buf.read("I", start)

    def scalars(self, index: int, fmt: str) -> list[int]:
        first, n = self._vector(index)
        size = struct.calcsize(fmt)
        return [self.buf.read(fmt, first + i * size) for i in range(n)]

    def tables(self, index: int) -> list[_Table]:
        first, n = self._vector(index)
        return [self.buf.table(self.buf.indirect(first + 4 * i)) for i in range(n)]

    def table(self, index: int) -> _Table | None:
        at = self._field(index)
        return self.buf.table(self.buf.indirect(at)) if at else None

    def string(self, index: int) -> str:
        at = self._field(index)
        if not at:
            return ""
        start = self.buf.indirect(at)
        n = self.buf.read("I", start)
        if start + 4 + n > len(self.buf.data):
            raise ValueError(f"a string of {n} bytes at {start} runs past the flatbuffer")
        return bytes(self.buf.data[start + 4:start + 4 + n]).decode("utf-8")


def _layout(t: _Table | None, scalar_type: Any) -> Any:
    if t is None:
        return None
    code = t.scalar(0, "b")
    return SimpleNamespace(scalar_type=scalar_type(code) if scalar_type else code,
                           sizes=t.scalars(1, "i"), dim_order=t.scalars(2, "B"))


def read_flat_tensor(data: bytes, scalar_type: Any = None) -> SimpleNamespace:
    """The FlatTensor of a ``.ptd``'s flatbuffer bytes (from byte 0, its root offset).

    ``scalar_type``: ExecuTorch's ``ScalarType`` enum, to give a layout's scalar type as
    ExecuTorch's reader does (else the number). Raises ValueError where an offset falls
    outside ``data``.
    """
    buf = _Buffer(data)
    root = buf.table(buf.read("I", 0))
    return SimpleNamespace(
        version=root.scalar(0, "I"),
        segments=[SimpleNamespace(offset=s.scalar(0, "Q"), size=s.scalar(1, "Q"))
                  for s in root.tables(1)],
        named_data=[SimpleNamespace(key=n.string(0), segment_index=n.scalar(1, "I"),
                                    tensor_layout=_layout(n.table(2), scalar_type))
                    for n in root.tables(2)],
    )
