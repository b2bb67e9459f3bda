"""The machine the timing-cache tests play: an L4 (its facts), pinned for every test of a
module that imports ``machine``; and what those tests ask of it (its facts, its key, whether
an entry's metadata fits it, the metadata a stored entry of it carries)."""

from __future__ import annotations

from typing import Any

import pytest

from trtet_store.export import timing_cache

SM89 = {"gpu": "NVIDIA L4", "compute_capability": "sm_89",
        "tensorrt": ["tensorrt-cu12 10.14.1.48"], "cuda": "12.8", "driver": "570.124.06"}


@pytest.fixture(autouse=True)
def machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_cache, "gpu_facts", lambda: dict(SM89))


def facts() -> dict[str, Any]:
    """This machine's timing facts (no extra builder flags)."""
    return timing_cache.timing_facts({})


def key() -> str:
    return timing_cache.timing_key(facts())


def check(metadata: dict) -> str | None:
    """Why an entry with ``metadata`` is not for this machine, or None."""
    return timing_cache.entry_problem(metadata, facts())


def meta(out: bytes) -> dict:
    """The metadata of a stored timing entry of this machine holding the cache ``out``."""
    from trtet_store.testing.stub_tensorrt import FakeBuilder

    return {**timing_cache._metadata(facts()), "entries": FakeBuilder.count_entries(out)}


def entries(n: int, tag: str) -> dict[str, str]:
    """``n`` timing-cache entries (tactic key -> timing), distinct per ``tag``."""
    import xxhash

    return {xxhash.xxh3_64_hexdigest(f"{tag}{i}".encode()): f"{i:08x}" for i in range(n)}


def tiered(here: Any, name: str, s3: Any, url: str) -> Any:
    """An EngineCache ``here/name`` whose shared tier is ``s3://<bucket>/tier`` at ``url``."""
    import trtet_store

    return trtet_store.EngineCache(here / name, max_bytes=1 << 30, min_free=0,
                                   remote=f"s3://{s3.bucket}/tier", endpoint_url=url)
