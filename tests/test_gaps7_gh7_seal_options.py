"""io.options.AutoChunk's bounds: ``0 < minimum <= limit`` (a fixed budget is
``minimum == limit``), anything else refused when it is made; the default budget is
DEFAULT_CHUNK_SIZE (64 MiB), the same object whether taken from io.options or
io.transaction (where it lived before)."""

from __future__ import annotations

import pytest

from trtet_store.io import AutoChunk, write_file
from trtet_store.io import transaction as transaction_module
from trtet_store.io.options import DEFAULT_CHUNK_SIZE
from trtet_store.io.units import MiB


def test_autochunk_takes_a_fixed_budget_and_refuses_a_bad_one(tmp_path) -> None:
    fixed = AutoChunk(limit=3 * MiB, minimum=3 * MiB)  # never shrinks, never grows
    assert (fixed.limit, fixed.minimum) == (3 * MiB, 3 * MiB)
    out = tmp_path / "f.bin"
    write_file(out, [b"x" * 4096], chunk_size=fixed)
    assert out.read_bytes() == b"x" * 4096
    for limit, minimum in ((3 * MiB, 3 * MiB + 1), (3 * MiB, 0), (3 * MiB, -1), (0, 0)):
        with pytest.raises(ValueError, match="0 < minimum <= limit"):
            AutoChunk(limit=limit, minimum=minimum)
    assert AutoChunk().limit == DEFAULT_CHUNK_SIZE == 64 * MiB and AutoChunk().minimum == 3 * MiB
    assert transaction_module.AutoChunk is AutoChunk
    assert transaction_module.DEFAULT_CHUNK_SIZE == DEFAULT_CHUNK_SIZE
