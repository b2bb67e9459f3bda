"""``Evictor.make_room(..., exclude=key)`` (``trtet_store.cache.evict``), through
``BlobCache.put``: a put never evicts the entry of the key it is putting to make its own
room. If the put is then skipped anyway (the rest is pinned by a hit), the key's previous
entry is still there, whole: a failed re-put never costs the entry it meant to replace.

The state: bound 10000 bytes; key ``k`` holds 4000 (the least recently used), key ``p``
5000 (pinned by an open hit). Putting 6000 new bytes under ``k`` cannot fit without
evicting ``p``, which is pinned: skipped, ``k`` untouched.

Real files in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cache import BlobCache


def test_a_skipped_re_put_never_evicts_the_entry_of_its_own_key(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=10_000)
    old, pinned, new = os.urandom(4000), os.urandom(5000), os.urandom(6000)
    for key, data in (("k", old), ("p", pinned)):
        (tmp_path / key).write_bytes(data)
        assert cache.put(key, tmp_path / key, {"v": key}).stored
    (tmp_path / "new").write_bytes(new)
    hold = cache.get("p")
    assert hold is not None
    with hold:
        result = cache.put("k", tmp_path / "new", {"v": "new"})
        assert not result.stored, result
        assert "k" not in result.evicted, result
        assert "in use" in (result.reason or ""), result.reason
    with cache.get("k") as hit:
        assert hit.path.read_bytes() == old and hit.metadata == {"v": "k"}, \
            "the skipped put evicted the entry of its own key"
    with cache.get("p") as hit:
        assert hit.path.read_bytes() == pinned
    assert os.listdir(cache.directory / "tmp") == []
