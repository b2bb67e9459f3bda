"""The machine the timing-cache tests play: an L4 (its facts), pinned for every test of a
module that imports ``machine``."""

from __future__ import annotations

import pytest

from trtet_store.export import timing_cache

SM89 = {"gpu": "NVIDIA L4", "compute_capability": "sm_89",
        "tensorrt": ["tensorrt-cu12 10.14.1.48"], "cuda": "12.8", "driver": "570.124.06"}


@pytest.fixture(autouse=True)
def machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_cache, "gpu_facts", lambda: dict(SM89))
