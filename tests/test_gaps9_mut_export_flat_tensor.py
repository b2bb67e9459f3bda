"""export/_executorch_private/flat_tensor.py read_flat_tensor (_Table.string, _Buffer.read):
the exact boundaries (gap hunt 3): a string or a scalar that ends exactly at the buffer's
last byte is read, one byte further is refused (a ``>`` that became ``>=`` would refuse
a good file; the refusal side is tests/test_audit9_flat_tensor_offsets.py).
No torch: the flatbuffers package only.
"""

from __future__ import annotations

import struct

import pytest
from test_audit9_flat_tensor_offsets import _flat_tensor, _named_flat_tensor

from trtet_store.export._executorch_private.flat_tensor import _Buffer, read_flat_tensor


def test_read_flat_tensor_takes_a_string_ending_at_the_last_byte() -> None:
    data = _named_flat_tensor()
    at = data.index(b"weights/w") - 4
    rest = len(data) - at - 4
    exact = data[:at] + struct.pack("<I", rest) + data[at + 4:]
    key = read_flat_tensor(exact).named_data[0].key
    assert key == data[at + 4:].decode("utf-8") and key.startswith("weights/w"), key
    over = data[:at] + struct.pack("<I", rest + 1) + data[at + 4:]
    with pytest.raises(ValueError, match=rf"a string of {rest + 1} bytes at {at} runs past"):
        read_flat_tensor(over)


def test_buffer_read_takes_a_scalar_ending_at_the_last_byte() -> None:
    buf = _Buffer(b"\x00" * 4 + struct.pack("<Q", 77))
    assert buf.read("Q", 4) == 77 and buf.read("I", 8) == 0
    for at in (5, 12, -1):
        with pytest.raises(ValueError, match=rf"offset {at} \(\+\d\) outside the flatbuffer"):
            buf.read("Q" if at == 5 else "I", at)
    assert read_flat_tensor(_flat_tensor()).segments[0].size == 77
