"""The pure-Python .ptd flatbuffer reader refuses an offset outside the buffer
(trtet_store/export/_executorch_private/flat_tensor.py), a negative one included.

A table's vtable sits at the table minus a signed 32-bit offset read from the
file, so a file can make it negative. ``struct.unpack_from`` takes a negative
position as counted from the buffer's end: unchecked, the reader would read
the tables at the end of the buffer as if the offset pointed at them, and give
fields from bytes the offset never named. Each flatbuffer here is built in the
test (as tests/test_first_hour.py builds its 64-bit one), then one offset is
rewritten.
"""

from __future__ import annotations

import struct

import pytest

from trtet_store.export._executorch_private.flat_tensor import read_flat_tensor


def _flat_tensor() -> bytes:
    """A FlatTensor flatbuffer: version 1, one segment (4096, 77), no named data."""
    import flatbuffers  # ExecuTorch's dependency (its generated readers use it)

    b = flatbuffers.Builder(0)
    b.StartObject(2)
    b.PrependUint64Slot(0, 4096, 0)
    b.PrependUint64Slot(1, 77, 0)
    seg = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(seg)
    segs = b.EndVector()
    b.StartObject(3)
    b.PrependUint32Slot(0, 1, 0)
    b.PrependUOffsetTRelativeSlot(1, segs, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"FT01")
    return bytes(b.Output())


def _named_flat_tensor() -> bytes:
    """A FlatTensor flatbuffer with one named datum, key ``weights/w``, segment 0."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    key = b.CreateString("weights/w")
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, key, 0)
    b.PrependUint32Slot(1, 0, 0)
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


def _with_vtable_at(data: bytes, where: int) -> bytes:
    """``data`` with the root table's soffset rewritten so its vtable is at ``where``."""
    root = struct.unpack_from("<I", data, 0)[0]
    return data[:root] + struct.pack("<i", root - where) + data[root + 4:]


def test_a_root_vtable_offset_pointing_before_the_buffer_is_refused() -> None:
    data = _flat_tensor()
    ft = read_flat_tensor(data)
    assert (ft.version, [(s.offset, s.size) for s in ft.segments]) == (1, [(4096, 77)])
    root = struct.unpack_from("<I", data, 0)[0]
    vtable = root - struct.unpack_from("<i", data, root)[0]

    # The vtable said to be len(data) bytes before its real place: at a negative
    # position whose bytes, counted from the end, are the real vtable's.
    bad = _with_vtable_at(data, vtable - len(data))
    with pytest.raises(ValueError, match=rf"offset {vtable - len(data)} \(\+2\) outside"):
        read_flat_tensor(bad)
    with pytest.raises(ValueError, match="outside the flatbuffer"):
        read_flat_tensor(_with_vtable_at(data, -1))  # one byte before the buffer


def test_a_root_vtable_offset_past_the_buffers_end_is_refused() -> None:
    data = _flat_tensor()
    for where in (len(data) - 1, len(data), len(data) + 1000):
        with pytest.raises(ValueError, match="outside the flatbuffer"):
            read_flat_tensor(_with_vtable_at(data, where))


def test_a_root_offset_past_the_end_is_refused() -> None:
    data = _flat_tensor()
    bad = struct.pack("<I", len(data) + 8) + data[4:]
    with pytest.raises(ValueError, match="outside the flatbuffer"):
        read_flat_tensor(bad)


def test_a_string_longer_than_the_rest_of_the_buffer_is_refused() -> None:
    data = _named_flat_tensor()
    assert [n.key for n in read_flat_tensor(data).named_data] == ["weights/w"]
    at = data.index(b"weights/w") - 4  # the string's length, just before its bytes
    assert struct.unpack_from("<I", data, at)[0] == len("weights/w")
    for n in (len(data) - at - 4 + 1, 2**32 - 1):  # one byte past the end; the most
        bad = data[:at] + struct.pack("<I", n) + data[at + 4:]
        with pytest.raises(ValueError, match=rf"a string of {n} bytes at {at} runs past"):
            read_flat_tensor(bad)
