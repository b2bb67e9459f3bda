"""A use stamp that cannot be written (``trtet_store.cache.files.CacheFiles.stamp``): the
open succeeds but the write fails (``keys/<key>.use`` is a device that answers ENOSPC, as a
full disk does): the stamp says it recorded nothing (False), and the hit is still served.

Real files in ``tmp_path`` (root makes the device node); no server, no torch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache

MiB = 1 << 20


def test_a_stamp_whose_write_fails_says_so_and_the_hit_is_served(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB)
    data = os.urandom(3000)
    (tmp_path / "src").write_bytes(data)
    assert cache.put("a", tmp_path / "src").stored
    use = cache.files.use("a")
    os.unlink(use)
    try:
        os.mknod(use, stat.S_IFCHR | 0o600, os.makedev(1, 7))  # /dev/full: writes ENOSPC
    except PermissionError:
        pytest.skip("no device nodes here")
    try:
        os.close(os.open(use, os.O_WRONLY))
    except OSError:
        pytest.skip("device nodes cannot be opened on this filesystem (nodev)")
    assert cache.files.stamp("a", hit=True) is False
    hit = cache.get("a")
    assert hit is not None
    with hit:
        assert os.pread(hit.fileno(), len(data) + 1, 0) == data
