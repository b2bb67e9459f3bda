"""EngineCache(lease_ttl=, wait_timeout=) (trtet_store/export/engine_cache.py, ``EngineCache.
__init__``): numbers that are not seconds are refused when the cache is made, before its
directory is touched: NaN and infinities for ``lease_ttl`` (``not math.isfinite``), NaN for
``wait_timeout`` (``math.isnan``: a ``< 0`` check lets it through, and a NaN wait for another
machine's build never runs out), and a bool for either (True is 1 s to Python, never what
a caller meant). The limits themselves: ``wait_timeout=0`` and ``inf`` are taken, a tiny
positive ``lease_ttl`` is taken, ``-0.0`` is not a ttl.
"""

from __future__ import annotations

import math

import pytest

from trtet_store import EngineCache


@pytest.mark.parametrize("ttl", [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, -1])
def test_engine_cache_refuses_a_lease_ttl_that_is_not_positive_seconds(tmp_path, ttl) -> None:
    d = tmp_path / "cache"
    with pytest.raises(ValueError, match="lease_ttl must be > 0 seconds, got "):
        EngineCache(d, remote="s3://bucket", lease_ttl=ttl)
    assert not d.exists()


@pytest.mark.parametrize("value", [True, False])
def test_engine_cache_refuses_a_bool_for_lease_ttl_or_wait_timeout(tmp_path, value) -> None:
    d = tmp_path / "cache"
    with pytest.raises(TypeError, match="lease_ttl must be seconds"):
        EngineCache(d, remote="s3://bucket", lease_ttl=value)
    with pytest.raises(TypeError, match="wait_timeout must be seconds or None, got bool"):
        EngineCache(d, remote="s3://bucket", wait_timeout=value)
    assert not d.exists()


@pytest.mark.parametrize("wait", [math.nan, -math.nan, -math.inf, -0.5])
def test_engine_cache_refuses_a_wait_timeout_that_is_nan_or_negative(tmp_path, wait) -> None:
    d = tmp_path / "cache"
    with pytest.raises(ValueError, match="wait_timeout must be >= 0 seconds or None, got "):
        EngineCache(d, remote="s3://bucket", wait_timeout=wait)
    with pytest.raises(ValueError, match="wait_timeout must be >= 0 seconds or None"):
        EngineCache(d, wait_timeout=wait)  # without a tier too
    assert not d.exists()


def test_engine_cache_takes_the_limits_themselves(tmp_path) -> None:
    d = tmp_path / "cache"
    assert EngineCache(d, remote="s3://bucket", wait_timeout=0).wait_timeout == 0
    assert EngineCache(d, remote="s3://bucket", wait_timeout=math.inf).wait_timeout == math.inf
    tiny = EngineCache(d, remote="s3://bucket", lease_ttl=1e-3)
    assert tiny.lease_ttl == 1e-3 and tiny.wait_timeout == 2e-3  # WAIT_TIMEOUT_TTLS x ttl
    assert tiny.remote.lease_ttl == 1e-3
