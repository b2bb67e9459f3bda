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
