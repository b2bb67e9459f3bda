"""export/build_versions.py build_versions / VERSIONED_DISTRIBUTIONS / _normalized: which
installed distributions a build's versions name (gap hunt 3): the pattern is anchored at
both ends (``torchvision``, ``torch-tensorrt-extras``-like names, ``nvidia-tensorrt`` are
not TensorRT or torch), and names are normalized as PEP 503 does (``TensorRT_CU12`` is
``tensorrt-cu12``, ``Torch.TensorRT`` is ``torch-tensorrt``). No torch: fake dist-infos on
the import path.
"""

from __future__ import annotations

import os

from trtet_store.export import build_versions


def _dist(where, name: str, version: str) -> None:
    info = where / f"{name.replace('-', '_').replace('.', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_build_versions_takes_only_torch_and_tensorrt_by_their_normalized_names(
        tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for name in ("torchvision", "torchaudio", "nvidia-tensorrt", "pytorch-triton",
                 "tensorrt_llm-extras!"):
        _dist(site, name, "9.9.9")
    _dist(site, "TensorRT_CU12", "10.14.1.48")
    _dist(site, "Torch.TensorRT", "2.9.0")
    monkeypatch.syspath_prepend(os.fspath(site))
    monkeypatch.setattr(build_versions, "_versions_seen", None)
    found = build_versions.build_versions()
    assert ("tensorrt-cu12", "10.14.1.48") in found, found
    assert ("torch-tensorrt", "2.9.0") in found, found
    assert not [n for n, v in found if v == "9.9.9"], found
    assert found == sorted(found)
