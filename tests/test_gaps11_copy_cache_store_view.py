"""``copy.copy(BlobCache)`` (``trtet_store.cache.store.BlobCache.__copy__``): a view of the
same files with its OWN bounds. Export raises the floor on such a view (``min_free`` +
the room a save needs) while other threads go on using the shared cache; so:

- a bound set on the view (``max_bytes``, ``min_free``) is the view's alone: the cache it
  was copied from keeps its own, and its puts are judged by them;
- the view's put, prune and drop go through the view's evictor (its bounds), not the
  original's (a putter left shared would ignore the raised floor);
- the view sees and serves the same entries (one directory).

Real files in a loop-mounted ext4 (``here_fs``); no server, no torch.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from trtet_store.cache import BlobCache

MiB = 1 << 20


def _src(where: Path, name: str, size: int) -> Path:
    p = where / name
    p.write_bytes(os.urandom(size))
    return p


def test_a_views_raised_floor_is_its_own_and_its_puts_keep_it(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    view = copy.copy(cache)
    view.min_free = 1 << 60  # more than any disk: a put through the view must not fit
    assert cache.min_free == 0 and cache.evictor.min_free == 0
    assert view.evictor is not cache.evictor
    skipped = view.put("v", _src(here_fs, "v", 4096))
    assert not skipped.stored, skipped
    assert "min_free" in skipped.reason, skipped.reason
    assert cache.get("v") is None
    stored = cache.put("o", _src(here_fs, "o", 4096))  # the original's floor is still 0
    assert stored.stored, stored.reason
    hit = view.get("o")  # the same files
    assert hit is not None
    hit.close()


def test_a_views_smaller_bound_is_its_own_and_its_puts_keep_it(here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    view = copy.copy(cache)
    view.max_bytes = 1000
    assert cache.max_bytes == 64 * MiB
    skipped = view.put("v", _src(here_fs, "v", 4096))
    assert not skipped.stored and "larger than the cache's bound of 1000" in skipped.reason, \
        skipped
    assert cache.put("o", _src(here_fs, "o", 4096)).stored
    # The view's prune is to its own bound: the original's entry (4096 > 1000) goes...
    assert view.prune() == ["o"]
    # ...and the original's prune to its own keeps what fits.
    assert cache.put("o", _src(here_fs, "o2", 4096)).stored
    assert cache.prune() == []
    assert cache.get("o") is not None
