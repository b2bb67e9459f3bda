"""compile_and_save's engine_cache_timeout: a NaN or negative wait is refused before a build.

lowering.py checks it with `not >= 0`: a `< 0` check lets NaN through, and a NaN wait
for another process's build would never run out.
"""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.executorch(reason="compile_and_save lowers with torch.export")


@pytest.mark.parametrize("timeout", [math.nan, -1.0])
def test_compile_and_save_refuses_an_engine_cache_timeout_that_is_not_seconds(
        tmp_path, monkeypatch, timeout):
    import trtet_store
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

    monkeypatch.setattr(trt, "check_available", lambda: None)
    builder = FakeBuilder(engine_sizes=(4096,))
    monkeypatch.setattr(trt, "build_engines", builder)
    module, inputs = linear_relu()
    with pytest.raises(ValueError, match="engine_cache_timeout must be >= 0 seconds"):
        trtet_store.compile_and_save(module, inputs, tmp_path / "m.pte",
                                     engine_cache=trtet_store.EngineCache(
                                         tmp_path / "cache", min_free=0),
                                     engine_cache_timeout=timeout)
    assert builder.built == [] and not (tmp_path / "m.pte").exists()
