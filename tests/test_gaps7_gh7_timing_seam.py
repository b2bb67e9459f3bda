"""timing_cache.combine and count_entries, the TensorRT seam, against a recording stand-in
for the ``tensorrt`` module (this machine has no TensorRT; the stub builder replaces the
seam itself elsewhere): ``combine`` asks ``ITimingCache.combine`` with
``ignore_mismatch=False``, raises MergeRefused when TensorRT refuses, returns the
serialized merge; ``count_entries`` counts ``queryKeys`` and never builds for no bytes.
"""

from __future__ import annotations

import sys
import types

import pytest

from trtet_store.export import timing_cache
from trtet_store.export.timing_cache import MergeRefused


class _Cache:
    def __init__(self, log: list, data: bytes) -> None:
        self.log, self.keys = log, [k for k in bytes(data).split(b",") if k]

    def combine(self, other: _Cache, ignore_mismatch: bool) -> bool:
        self.log.append(("combine", ignore_mismatch))
        if other.keys and other.keys[0].startswith(b"other:") and not ignore_mismatch:
            return False
        self.keys = sorted(set(self.keys) | set(other.keys))
        return True

    def serialize(self) -> memoryview:
        return memoryview(b",".join(self.keys))

    def queryKeys(self) -> list:  # noqa: N802 - TensorRT's name
        return list(self.keys)


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> list:
    log: list = []
    mod = types.ModuleType("tensorrt")

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            log.append(("logger", level))

    class Config:
        def create_timing_cache(self, data: bytes) -> _Cache:
            log.append(("create", bytes(data)))
            return _Cache(log, data)

    class Builder:
        def __init__(self, logger: Logger) -> None:
            log.append(("builder",))

        def create_builder_config(self) -> Config:
            return Config()

    mod.Logger, mod.Builder = Logger, Builder
    monkeypatch.setitem(sys.modules, "tensorrt", mod)
    return log


def test_timing_cache_combine_asks_tensorrt_without_ignore_mismatch(trt):
    out = timing_cache.combine(b"a,c", b"b,c")
    assert out == b"a,b,c" and isinstance(out, bytes)
    assert ("combine", False) in trt and ("combine", True) not in trt
    assert ("create", b"a,c") in trt and ("create", b"b,c") in trt


def test_timing_cache_combine_refused_by_tensorrt_is_merge_refused(trt):
    with pytest.raises(MergeRefused, match="ITimingCache.combine refused them"):
        timing_cache.combine(b"a", b"other:x")
    assert trt.count(("combine", False)) == 1


def test_timing_cache_count_entries_counts_query_keys(trt):
    assert timing_cache.count_entries(b"a,b,c") == 3
    assert trt == [("logger", 2), ("builder",), ("create", b"a,b,c")]
    trt.clear()
    assert timing_cache.count_entries(b"") == 0
    assert trt == []  # no builder made for no bytes
