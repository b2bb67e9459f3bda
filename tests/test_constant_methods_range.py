"""Issue 34 item 19: a ``constant_methods`` int outside int64 is refused by name, before the build.

A program stores an int as int64. ExecuTorch refused ``2**70`` only in
``to_executorch()``, after every TensorRT engine was built, in an error that
did not say which constant. Both ends of int64 still go through and load.
"""

from __future__ import annotations

import os

import pytest
from executorch.exir.error import ExportError

import trtet_store
from trtet_store.export import tensorrt as trt
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu


@pytest.fixture
def fake_builder(monkeypatch):
    builder = FakeBuilder(engine_sizes=(MiB,))
    monkeypatch.setattr(trt, "build_engines", builder)
    monkeypatch.setattr(trt, "check_available", lambda: None)
    return builder


@pytest.mark.parametrize("value", [2**70, 2**63, -(2**63) - 1, [1, {"deep": 2**64}]],
                         ids=["2**70", "2**63", "-2**63-1", "nested"])
def test_an_int_outside_int64_is_named_before_the_build(here_fs, fake_builder, value):
    module, inputs = linear_relu()
    with pytest.raises(ExportError) as info:
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte",
                                     constant_methods={"ok": 1, "x": value})
    assert "constant_methods['x']" in str(info.value)
    assert "int64" in str(info.value)
    assert fake_builder.built == []  # refused before any engine was built
    assert list(here_fs.iterdir()) == []


def test_both_ends_of_int64_are_written_and_read_back(here_fs):
    from executorch.runtime import Runtime

    module, inputs = linear_relu()
    trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", backend="xnnpack",
                                 constant_methods={"big": 2**63 - 1, "small": -(2**63)})
    program = Runtime.get().load_program(os.fspath(here_fs / "m.pte"))
    assert program.load_method("big").execute([]) == [2**63 - 1]
    assert program.load_method("small").execute([]) == [-(2**63)]
