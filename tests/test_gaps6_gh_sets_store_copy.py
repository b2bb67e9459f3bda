"""The store's copy from a referenced file (``_copy_reference``), given a source that fails.

The copy goes to a fresh temp file of the store, renamed to the blob's name
only when whole: a source found shorter than the blob (truncated since it was
opened) fails the copy with EIO, and neither the temp file nor a blob is left
in the store; a whole copy is the source's bytes, 0444, and no temp is left.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from trtet_store.sets import store as store_mod
from trtet_store.sets.store import ContentStore

SIZE = 3 * 4096 + 5


def _setup(tmp_path: Path, have: int) -> tuple[ContentStore, Path, Path]:
    cas = ContentStore(tmp_path / "store")
    src = tmp_path / "placed.ptd"
    src.write_bytes(b"S" * have)
    cas.root.mkdir(mode=0o700, exist_ok=True)
    return cas, src, cas.path("0" * 32)


def test_a_source_shorter_than_the_blob_leaves_no_temp_and_no_blob(tmp_path: Path) -> None:
    cas, src, dest = _setup(tmp_path, SIZE - 100)
    before = sorted(os.listdir(cas.root))
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as caught:
            store_mod._copy_reference(fd, src, dest, SIZE)
    finally:
        os.close(fd)
    assert caught.value.errno == errno.EIO, caught.value
    assert sorted(os.listdir(cas.root)) == before, os.listdir(cas.root)  # no .tmp, no blob
    assert src.read_bytes() == b"S" * (SIZE - 100)


def test_a_whole_copy_is_the_source_s_bytes_read_only_and_leaves_no_temp(tmp_path: Path) -> None:
    cas, src, dest = _setup(tmp_path, SIZE)
    before = sorted(os.listdir(cas.root))
    fd = os.open(src, os.O_RDONLY)
    try:
        store_mod._copy_reference(fd, src, dest, SIZE)
    finally:
        os.close(fd)
    assert dest.read_bytes() == src.read_bytes()
    assert stat.S_IMODE(os.lstat(dest).st_mode) == 0o444
    assert sorted(os.listdir(cas.root)) == sorted([*before, dest.name])
