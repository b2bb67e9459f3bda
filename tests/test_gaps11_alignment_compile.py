"""compile_and_save's segment_alignment (trtet_store/export/compile.py ``_check_alignment``,
``executorch_config``): a power of two, refused before the build otherwise, bool included
(``True`` is the int 1 to Python, a power of two: it slipped through as "align to 1 byte",
so no engine sat on a page and every placement became a copy, without a word). The limits:
1 and 4096 are taken; 0, negative, 4095 and 4097 are not.
"""

from __future__ import annotations

import pytest

import trtet_store
from trtet_store.export.compile import _check_alignment

pytestmark = pytest.mark.executorch(reason="compile_and_save lowers with torch.export")


@pytest.mark.parametrize("alignment", [True, False, 0, -4096, 4095, 4097, 4096.0])
def test_check_alignment_refuses_what_is_not_a_power_of_two_int(alignment) -> None:
    with pytest.raises(ValueError, match="segment_alignment must be a power of two"):
        _check_alignment(alignment)


@pytest.mark.parametrize("alignment", [1, 2, 4096, 1 << 20])
def test_check_alignment_takes_powers_of_two(alignment) -> None:
    _check_alignment(alignment)


def test_compile_and_save_refuses_a_bool_segment_alignment_before_the_build(here_fs,
                                                                            monkeypatch):
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

    builder = FakeBuilder(engine_sizes=(1 << 20,))
    monkeypatch.setattr(trt, "build_engines", builder)
    monkeypatch.setattr(trt, "check_available", lambda: None)
    module, inputs = linear_relu()
    with pytest.raises(ValueError, match="segment_alignment must be a power of two"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", segment_alignment=True)
    assert builder.built == [] and list(here_fs.iterdir()) == []
