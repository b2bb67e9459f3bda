"""read_flat_tensor (export/_executorch_private/flat_tensor.py): a table whose vtable is
shorter than a field's slot has that field at its default.

A flatbuffer builder trims the vtable after the last field written: a FlatTensor with its
version alone has a 6-byte vtable, and ``segments`` and ``named_data`` (slots 6 and 8)
are absent, read as empty, never taken from the bytes after the vtable (the table's own
offset field).
"""

from __future__ import annotations

import struct

from trtet_store.export._executorch_private.flat_tensor import read_flat_tensor


def _version_only(version: int) -> bytes:
    import flatbuffers  # ExecuTorch's dependency (its generated readers use it)

    b = flatbuffers.Builder(0)
    b.StartObject(3)
    b.PrependUint32Slot(0, version, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"FT01")
    return bytes(b.Output())


def test_fields_past_a_short_vtable_are_absent_not_read_from_the_table() -> None:
    data = _version_only(7)
    root = struct.unpack_from("<I", data, 0)[0]
    vtable = root - struct.unpack_from("<i", data, root)[0]
    assert struct.unpack_from("<H", data, vtable)[0] == 6  # version's slot alone
    got = read_flat_tensor(data)
    assert (got.version, got.segments, got.named_data) == (7, [], [])


def _with_layout(key: str, scalar_type: int, sizes: list[int], dim_order: list[int]) -> bytes:
    """A FlatTensor with one named datum and its TensorLayout (scalar type, sizes, dim order)."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    name = b.CreateString(key)
    b.StartVector(4, len(sizes), 4)
    for s in reversed(sizes):
        b.PrependInt32(s)
    sz = b.EndVector()
    b.StartVector(1, len(dim_order), 1)
    for d in reversed(dim_order):
        b.PrependUint8(d)
    do = b.EndVector()
    b.StartObject(3)
    b.PrependInt8Slot(0, scalar_type, 0)
    b.PrependUOffsetTRelativeSlot(1, sz, 0)
    b.PrependUOffsetTRelativeSlot(2, do, 0)
    layout = b.EndObject()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUint32Slot(1, 3, 0)
    b.PrependUOffsetTRelativeSlot(2, layout, 0)
    nd = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(nd)
    nds = b.EndVector()
    b.StartObject(3)
    b.PrependUint32Slot(0, 1, 0)
    b.PrependUOffsetTRelativeSlot(2, nds, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"FT01")
    return bytes(b.Output())


def test_a_named_datums_tensor_layout_is_read_field_by_field() -> None:
    data = _with_layout("weights/w", 6, [2, 3, 400000], [0, 2, 1])
    got = read_flat_tensor(data)
    [nd] = got.named_data
    assert (nd.key, nd.segment_index) == ("weights/w", 3)
    layout = nd.tensor_layout
    assert (layout.scalar_type, layout.sizes, layout.dim_order) == (6, [2, 3, 400000], [0, 2, 1])
    # With ExecuTorch's ScalarType enum given, the scalar type as ExecuTorch's reader gives it.
    import enum

    class ScalarType(enum.IntEnum):
        FLOAT = 6

    typed = read_flat_tensor(data, ScalarType).named_data[0].tensor_layout
    assert typed.scalar_type is ScalarType.FLOAT
    # No layout written: None, as ExecuTorch's reader gives an absent table.
    bare = read_flat_tensor(_version_only(1))
    assert bare.named_data == []


def test_a_named_datum_without_a_key_reads_as_the_empty_key() -> None:
    import flatbuffers

    b = flatbuffers.Builder(0)
    b.StartObject(3)
    b.PrependUint32Slot(1, 2, 0)  # a segment index, no key, no layout
    nd = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(nd)
    nds = b.EndVector()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(2, nds, 0)
    root = b.EndObject()
    b.Finish(root)
    [nd_read] = read_flat_tensor(bytes(b.Output())).named_data
    assert (nd_read.key, nd_read.segment_index, nd_read.tensor_layout) == ("", 2, None)
