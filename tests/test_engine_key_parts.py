"""A build's key, part by part: the full key, the structure key (no weight bytes), the record.

Issue 46 item 1 (two keys per build) and the data of item 6 (a miss says
why): each part is digested apart, the full key hashes every part, the
structure key every part but the weight bytes, and the build record keeps
the parts.
"""

from __future__ import annotations

import torch

import trtet_store
from trtet_store.export import engine_key, engine_reuse
from trtet_store.export.engine_key import RECORD_KIND
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu


def _parts(module: torch.nn.Module, inputs: tuple, settings: dict | None = None
           ) -> engine_reuse.KeyParts:
    return engine_reuse.build_key_parts(torch.export.export(module, inputs), inputs, None,
                                        settings or {})


def _differ(a: engine_reuse.KeyParts, b: engine_reuse.KeyParts) -> set[str]:
    return {p for p in engine_reuse.KEY_PARTS if a.digests[p] != b.digests[p]}


def test_the_same_export_has_the_same_parts_and_the_full_key_is_the_fingerprint():
    module, inputs = linear_relu()
    a, b = _parts(module, inputs), _parts(module, inputs)
    assert a == b
    assert a.full == engine_reuse.build_fingerprint(torch.export.export(module, inputs), inputs,
                                                    None, {})
    assert a.full != a.structure
    assert set(a.digests) == set(engine_reuse.KEY_PARTS)


def test_new_weights_change_the_full_key_and_keep_the_structure_key():
    module, inputs = linear_relu()
    before = _parts(module, inputs)
    with torch.no_grad():
        module[0].weight.mul_(-1)
    after = _parts(module, inputs)
    assert _differ(before, after) == {"weights"}
    assert after.full != before.full
    assert after.structure == before.structure


def test_same_ops_different_widths_never_share_a_structure_key():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 16),)
    narrow = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    wide = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    a, b = _parts(narrow, inputs), _parts(wide, inputs)
    assert "weight_layout" in _differ(a, b)
    assert a.structure != b.structure


class _TwoLinears(torch.nn.Module):
    """Two 16x16 linears chained one way or the other: same ops, same shapes, other edges."""

    def __init__(self, l1_first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.l1_first = l1_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.l1_first:
            return torch.relu(self.l2(torch.relu(self.l1(x))))
        return torch.relu(self.l1(torch.relu(self.l2(x))))


def test_same_shapes_different_edges_never_share_a_structure_key():
    inputs = (torch.randn(2, 16),)
    a, b = _parts(_TwoLinears(True), inputs), _parts(_TwoLinears(False), inputs)
    # Same names, shapes and bytes of every weight: only the graph's edges tell them apart.
    assert _differ(a, b) == {"graph"}
    assert a.structure != b.structure


def test_settings_inputs_and_versions_are_parts_of_the_structure(monkeypatch):
    module, inputs = linear_relu()
    base = _parts(module, inputs, {"optimization_level": 3})
    assert _differ(base, _parts(module, inputs, {"optimization_level": 5})) == {"settings"}
    assert base.settings != _parts(module, inputs, {"optimization_level": 5}).settings
    bigger = (torch.randn(4, 16),)
    assert "inputs" in _differ(base, _parts(module, bigger, {"optimization_level": 3}))
    monkeypatch.setattr(engine_reuse, "build_versions", lambda: [("tensorrt", "99.0")])
    other = _parts(module, inputs, {"optimization_level": 3})
    assert _differ(base, other) == {"versions"}
    assert other.structure != base.structure
    assert other.versions == [["tensorrt", "99.0"]]


def test_the_build_record_keeps_its_key_parts(here_fs):
    module, inputs = linear_relu()
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    with installed(FakeBuilder(engine_sizes=(1 * MiB,))):
        trtet_store.compile_and_save(module, inputs, here_fs / "model.pte", engine_cache=cache)
    records = [e for e in cache.entries() if e.metadata.get("kind") == RECORD_KIND]
    assert len(records) == 1
    kept = records[0].metadata["key_parts"]
    parts = _parts(module, inputs)
    assert kept["digests"] == parts.digests
    assert kept["structure"] == parts.structure
    assert kept["versions"] == parts.versions and kept["gpu"] == parts.gpu


# -- a miss says why (issue 46 item 6) ----------------------------------------------------

def _export(here_fs, module, inputs, **settings):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0)
    with installed(FakeBuilder(engine_sizes=(1 * MiB,))):
        report = trtet_store.compile_and_save(module, inputs, here_fs / "model.pte",
                                              engine_cache=cache, **settings)
    [event] = report.engine_cache
    return event


def test_a_miss_names_the_part_that_changed_and_a_hit_names_none(here_fs, monkeypatch):
    module, inputs = linear_relu()
    first = _export(here_fs, module, inputs)
    assert first.outcome == "miss" and first.missed_because == engine_key.NOTHING_CLOSE
    assert _export(here_fs, module, inputs).missed_because is None  # a hit
    with torch.no_grad():
        module[0].bias.add_(1)
    assert _export(here_fs, module, inputs).missed_because == "weights changed"
    assert _export(here_fs, module, (torch.randn(4, 16),)).missed_because == \
        "input shapes changed"
    assert _export(here_fs, module, inputs, optimization_level=5).missed_because == \
        "settings changed: optimization_level"
    real = engine_reuse.build_versions()
    monkeypatch.setattr(engine_reuse, "build_versions",
                        lambda: [*real, ("tensorrt", "10.14.1")])
    because = _export(here_fs, module, inputs).missed_because
    assert because == "versions changed: tensorrt (none) -> 10.14.1"


def test_another_model_is_nothing_close(here_fs):
    module, inputs = linear_relu()
    _export(here_fs, module, inputs)
    other = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    torch.nn.init.ones_(other[0].weight)
    event = _export(here_fs, torch.nn.Sequential(other, torch.nn.Sigmoid()), inputs)
    assert event.missed_because == engine_key.NOTHING_CLOSE


def test_the_cli_prints_why_an_engine_missed():
    from trtet_store.cli.compile import _engine_event
    from trtet_store.export.engine_record import EngineCacheEvent

    event = EngineCacheEvent("e0", "trt-x-sm_90.e0", 10, "miss", "clone", True,
                             published=True, missed_because="weights changed")
    # Before what became of it in the shared tier: the line still ends with it.
    assert _engine_event(event) == \
        "miss, cached (clone), missed because weights changed, published"
