"""``place_files(..., link=True)`` (sets/place.py): the ``.pte`` is renamed over its name last.

The hard links are made under temporary names and renamed over the runtime's
names, the ``.ptd`` files first and the program last: a failure (or crash)
between two renames leaves the OLD program, never a new ``.pte`` beside an old
``.ptd`` it does not match. Here the second ``.ptd``'s rename fails for real (a
directory holds its name): the old ``model.pte`` is still there, byte-identical,
the store's blobs unchanged (0444), no temporary link left.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from sets_helpers import write

from trtet_store.sets.place import place_files


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_failed_ptd_rename_with_link_true_leaves_the_old_program(tmp_path: Path) -> None:
    store = tmp_path / "store"
    blobs = [write(store / f"blob{i}", 10_000 + i, 40 + i) for i in range(3)]
    for b in blobs:
        os.chmod(b, 0o444)
    dest = tmp_path / "dest"
    old_pte = write(dest / "model.pte", 5_000, 1)
    old_a = write(dest / "a.ptd", 6_000, 2)
    (dest / "b.ptd").mkdir()  # the second .ptd's name: its rename fails (a non-empty directory)
    (dest / "b.ptd" / "keep").write_bytes(b"x")
    before = {p.name: digest(p) for p in (old_pte, old_a)}
    store_before = {b.name: (digest(b), os.lstat(b).st_mode) for b in blobs}

    files = [("model.pte", blobs[0], 10_000, None), ("a.ptd", blobs[1], 10_001, None),
             ("b.ptd", blobs[2], 10_002, None)]
    with pytest.raises(OSError):  # noqa: PT011 (EISDIR or ENOTEMPTY, by the kernel)
        place_files(dest, files, 1 << 20, link=True)

    assert digest(dest / "model.pte") == before["model.pte"], \
        "link=True renamed the new program over model.pte before its .ptd files"
    assert os.lstat(dest / "model.pte").st_ino != os.lstat(blobs[0]).st_ino
    assert (dest / "b.ptd" / "keep").read_bytes() == b"x"
    assert sorted(os.listdir(dest)) == ["a.ptd", "b.ptd", "model.pte"], os.listdir(dest)
    assert {b.name: (digest(b), os.lstat(b).st_mode) for b in blobs} == store_before
    assert all(stat.S_IMODE(os.lstat(b).st_mode) == 0o444 for b in blobs)
