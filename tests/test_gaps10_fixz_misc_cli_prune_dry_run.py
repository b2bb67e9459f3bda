"""``trtet-store cache prune --dry-run`` without ``--remote`` is refused (exit 2, one line,
_check_remote_args): the local cache prune has no dry run, so running it would evict for real
what the user asked only to see. The cache's files are left byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attacker import tree

from trtet_store import EngineCache
from trtet_store.cli import main
from trtet_store.io import MiB


@pytest.mark.parametrize("argv", [["--dry-run", "--max-bytes", "1"], ["--dry-run"],
                                  ["--max-bytes", "1", "--dry-run", "--json"]],
                         ids=["bound", "default-bound", "json"])
def test_cache_prune_dry_run_without_remote_is_refused_and_evicts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    directory = tmp_path / "cache"
    cache = EngineCache(directory, max_bytes=64 * MiB, min_free=0)
    for i in range(3):
        src = tmp_path / f"e{i}"
        src.write_bytes(os.urandom(64 * 1024 + i))
        cache.blobs.put(f"trt-e-{i:064x}", src, {"n": i})
    keys = sorted(e.key for e in cache.entries())
    assert len(keys) == 3
    before = tree(directory)
    capsys.readouterr()

    code = main(["cache", "--dir", os.fspath(directory), "prune", *argv])
    out, err = capsys.readouterr()
    assert sorted(e.key for e in EngineCache(directory, read_only=True).entries()) == keys, \
        f"cache prune {' '.join(argv)} (no --remote) evicted entries: exit {code}, {out!r}"
    assert tree(directory) == before, "the cache's files changed"
    assert code == 2, (code, out, err)
    assert out == "" and "--dry-run applies to prune --remote" in err, (out, err)
    assert err.count("\n") == 1, err
