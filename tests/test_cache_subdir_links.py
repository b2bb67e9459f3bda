"""A link planted in place of one of the cache's subdirectories is refused (issue 55 item 1).

The cache directory itself is checked with ``lstat`` and opened ``O_NOFOLLOW``; each of
its subdirectories (``keys/``, ``blobs/``, ``flights/``, ``tmp/``) must be a real
directory of ours too, checked under the directory's handle without following links.
Here one of them is replaced by a link to a directory of the same user that is not the
cache's (a project: files under the cache's own names): every opener refuses it in one
line, and nothing in the victim or the cache changes.
"""

from __future__ import annotations

import os

import pytest
from test_cache_security import cli, one_line_refusal, real_cache, snapshot

from trtet_store.cache import BlobCache, CacheDirectoryError
from trtet_store.io import MiB


@pytest.mark.parametrize("sub", ["blobs", "keys", "tmp", "flights"])
def test_a_link_in_place_of_a_subdirectory_is_refused(here_fs, sub):
    import trtet_store

    cache = real_cache(here_fs / "cache")
    victim = here_fs / "victim"
    victim.mkdir(mode=0o700)
    for name, data in ((f"{'0' * 32}-4", b"mine"), (f"{'1' * 6}-{'2' * 32}", b"stale?"),
                       ("notes.json", b'{"key": "x"}'), ("plan.lock", b"")):
        (victim / name).write_bytes(data)  # names the cache's recovery would act on
    saved = cache / f"{sub}.real"
    os.rename(cache / sub, saved)
    os.symlink(victim, cache / sub)
    before, cache_before = snapshot(victim), snapshot(cache)
    said = f"{cache / sub} is not a directory (a link?)"
    with pytest.raises(CacheDirectoryError, match=r"is not a directory \(a link\?\)") as refused:
        BlobCache(cache, max_bytes=16 * MiB)
    assert str(refused.value).startswith(said), refused.value
    for read_only in (False, True):
        with pytest.raises(CacheDirectoryError, match=r"is not a directory \(a link\?\)"):
            trtet_store.EngineCache(cache, read_only=read_only)
    for action in ("stats", "recover"):  # a read-only open and a writing one
        one_line_refusal(cli("--dir", cache, action), said)
    assert snapshot(victim) == before
    assert snapshot(cache) == cache_before
    os.unlink(cache / sub)
    os.rename(saved, cache / sub)
    hit = BlobCache(cache, max_bytes=16 * MiB).get("k" * 16)
    assert hit is not None  # the cache itself is fine once its own directory is back
    hit.close()
