"""``BlobCache.single_flight(timeout=)`` (``trtet_store.cache.store``) and the ``timeout`` of
``merge_in`` (``trtet_store.cache.mergeable``), which waits on it:

- a timeout that is not a number >= 0 is refused before any wait or lock file: ``-1``, and
  NaN (``nan < 0`` is False, and ``waited >= nan`` is never true: a NaN let through waits
  for ever on a held key instead of giving up);
- merge_in's ``timeout`` reaches the key's single flight: while another holder keeps the
  key, merge_in gives up with CacheWaitTimeout after about ``timeout`` seconds (it does not
  wait for the holder), and leaves the entry and the cache's tmp/ as they were.

The holder is this process on another descriptor (flock is per open file). Real files in
``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache, CacheWaitTimeout
from trtet_store.cache.mergeable import merge_in

MiB = 1 << 20


@pytest.mark.parametrize("timeout", [math.nan, -math.nan, -1.0, -1e-9])
def test_single_flight_refuses_a_timeout_that_is_not_a_number_ge_0(tmp_path: Path,
                                                                     timeout: float) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=MiB)
    with pytest.raises(ValueError, match="timeout must be >= 0 seconds"), \
            cache.single_flight("k", timeout=timeout):
        pass
    assert os.listdir(cache.directory / "flights") == []  # no lock file made


def test_merge_in_refuses_a_nan_timeout_before_any_wait(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=MiB)
    learned = tmp_path / "learned"
    learned.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="timeout must be >= 0 seconds"):
        merge_in(cache, "k", learned, lambda cur, new: (new, {}), lambda m: None, {},
                 limit=MiB, timeout=math.nan)
    assert cache.get("k") is None


def test_merge_in_gives_up_after_its_timeout_while_another_holds_the_key(tmp_path: Path
                                                                         ) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=MiB)
    (tmp_path / "entry").write_bytes(b"old" * 100)
    assert cache.put("k", tmp_path / "entry", {"n": 0}).stored
    learned = tmp_path / "learned"
    learned.write_bytes(b"new" * 100)
    outcome: list[object] = []

    def merge() -> None:
        start = time.monotonic()
        try:
            merge_in(cache, "k", learned, lambda cur, new: (cur + new, {}), lambda m: None,
                     {"n": 1}, limit=MiB, timeout=0.3)
            outcome.append(("merged", time.monotonic() - start))
        except CacheWaitTimeout as exc:
            outcome.append(("timeout", time.monotonic() - start, exc))

    with cache.single_flight("k"):  # the holder
        worker = threading.Thread(target=merge, daemon=True)
        worker.start()
        worker.join(5)
        finished_while_held = not worker.is_alive()
    worker.join(10)
    assert finished_while_held, f"merge_in waited for the holder, not {0.3} s: {outcome}"
    assert outcome and outcome[0][0] == "timeout", outcome
    assert 0.25 <= outcome[0][1] < 4, outcome
    with cache.get("k") as hit:  # the entry as it was
        assert hit.path.read_bytes() == b"old" * 100 and hit.metadata == {"n": 0}
    assert os.listdir(cache.directory / "tmp") == []
