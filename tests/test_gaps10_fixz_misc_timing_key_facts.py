"""The timing cache's key facts (timing_cache.gpu_facts, timing_facts, timing_key) as the
real function finds them, not a stand-in for it:

- every TensorRT distribution is keyed, whatever its CUDA flavour: an install of only
  ``tensorrt-cu12`` (no ``tensorrt`` meta-package; a real ``*.dist-info`` put first on
  ``sys.path``) is keyed by its version, and a TensorRT upgrade is another key;
- the GPU's name is keyed: two GPUs of one compute capability (an H100 and an H200, both
  sm_90) never share a timing entry, and one's entry is refused on the other.

The GPU is played through torch.cuda's answers (no second GPU here); the TensorRT install is
a real distribution that importlib.metadata reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trtet_store.export import timing_cache


def _dist(root: Path, name: str, version: str) -> Path:
    """A directory holding the installed distribution ``name`` ``version`` (its metadata)."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def _installed(monkeypatch: pytest.MonkeyPatch, site: Path) -> None:
    monkeypatch.setattr(sys, "path", [str(site), *[p for p in sys.path if "tensorrt" not in p]])


def test_an_install_of_tensorrt_cu12_alone_is_keyed_by_its_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _dist(tmp_path / "site-a", "tensorrt-cu12", "10.14.1.48")
    _dist(old, "tensorrt-cu12-libs", "10.14.1.48")
    new = _dist(tmp_path / "site-b", "tensorrt-cu12", "10.15.0.2")
    _dist(new, "tensorrt-cu12-libs", "10.15.0.2")

    _installed(monkeypatch, old)
    facts_old = timing_cache.timing_facts({})
    key_old = timing_cache.timing_key(facts_old)

    _installed(monkeypatch, new)  # pip install -U tensorrt-cu12
    facts_new = timing_cache.timing_facts({})
    assert timing_cache.timing_key(facts_new) != key_old, \
        f"TensorRT 10.14 and 10.15 (tensorrt-cu12) share the timing key {key_old}: " \
        f"{facts_old['tensorrt']} vs {facts_new['tensorrt']}"
    assert "tensorrt-cu12 10.14.1.48" in facts_old["tensorrt"], facts_old["tensorrt"]
    assert "tensorrt-cu12-libs 10.14.1.48" in facts_old["tensorrt"], facts_old["tensorrt"]
    assert "tensorrt-cu12 10.15.0.2" in facts_new["tensorrt"], facts_new["tensorrt"]
    problem = timing_cache.entry_problem(timing_cache._metadata(facts_old), facts_new)
    assert problem is not None and "10.14.1.48" in problem, problem


def test_two_gpus_of_one_capability_never_share_a_timing_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    seen = {}
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, _n=name, **k: _n)
        seen[name] = timing_cache.timing_facts({"disable_tf32": False})
    h100, h200 = seen.values()
    assert timing_cache.timing_key(h100) != timing_cache.timing_key(h200), \
        f"an H100 and an H200 (both sm_90) share the timing key {timing_cache.timing_key(h100)}"
    for name, facts in seen.items():
        assert facts.get("gpu") == name, facts
        assert facts["compute_capability"] == "sm_90", facts
    problem = timing_cache.entry_problem(timing_cache._metadata(h100), h200)
    assert problem is not None and "NVIDIA H100 80GB HBM3" in problem, problem
    assert timing_cache.entry_problem(timing_cache._metadata(h200), h200) is None
