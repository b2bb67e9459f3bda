"""``cache/directory.py``'s ``_check_subdirs``: a subdirectory of the cache (``keys/``,
``blobs/``, ...) that is ours but writable by others is refused, as the cache directory
itself is. Anyone who can write ``keys/`` can plant a record, a FIFO or a link there
(``test_cache_records_not_ours``), and anyone who can write ``blobs/`` can swap a blob
between its seal and its hit. The cache refuses to open, and changes nothing.

Real directories in ``tmp_path``; no server, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attacker import tree

from trtet_store.cache import BlobCache
from trtet_store.cache.layout import SUBDIRS

MiB = 1 << 20


@pytest.mark.parametrize("sub", ["keys", "blobs"])
@pytest.mark.parametrize("mode", [0o777, 0o720, 0o702])
def test_a_subdirectory_writable_by_others_is_refused(tmp_path: Path, sub: str,
                                                      mode: int) -> None:
    cache = BlobCache(tmp_path / "c", max_bytes=MiB)
    (tmp_path / "e").write_bytes(b"engine")
    assert cache.put("k", tmp_path / "e").stored
    os.chmod(tmp_path / "c" / sub, mode)
    before = tree(tmp_path / "c")
    with pytest.raises(PermissionError, match=f"{sub}: it is writable by others"):
        BlobCache(tmp_path / "c", max_bytes=MiB)
    assert tree(tmp_path / "c") == before  # nothing changed, nothing removed


def test_the_subdirectories_the_cache_makes_are_private(tmp_path: Path) -> None:
    old = os.umask(0)  # a umask only removes bits: 0700 whatever it is
    try:
        BlobCache(tmp_path / "c", max_bytes=MiB)
    finally:
        os.umask(old)
    for sub in SUBDIRS:
        assert (tmp_path / "c" / sub).stat().st_mode & 0o777 == 0o700, sub
