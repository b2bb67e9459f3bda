"""BlobCache.single_flight's timeout: a NaN or negative one is refused before any lock.

A NaN compares false with everything, so a `timeout < 0` check lets it through, and
`waited >= nan` is never true: the waiter would wait for ever on a key another process
holds, the hang the timeout exists to bound.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache
from trtet_store.io.lock import try_lock, unlock_file


@pytest.mark.parametrize("timeout", [math.nan, -math.nan, -1.0, -math.inf])
def test_single_flight_refuses_a_timeout_that_is_not_a_number_of_seconds(
        tmp_path: Path, timeout: float) -> None:
    cache = BlobCache(tmp_path / "cache", max_bytes=1 << 20)
    # The key is held (as another process's build would hold it): a NaN let through
    # would spin here for ever rather than raise; the test's own timeout is the guard.
    lock_path = tmp_path / "cache" / "flights" / "k.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    held = try_lock(lock_path, create=True)
    assert held is not None
    try:
        with pytest.raises(ValueError, match="timeout must be >= 0 seconds or None"), \
                cache.single_flight("k", timeout=timeout):
            pass
    finally:
        unlock_file(held, lock_path)
