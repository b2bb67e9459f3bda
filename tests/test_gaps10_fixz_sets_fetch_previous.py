"""fetch_set over a previous member: its files are removed only after the new ones are placed.

``dest`` holds member ``a`` (fetched before, its record there). fetch_set of member ``b``
into it fails at the placement (the user left a directory under b's file name,
``b.pte/``): the previous member's files are byte-identical after (same inode, mode), the
directory and what it holds untouched, no stray files. The previous member's files are
remove_unlisted's once the new member is checked and placed, never before.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set


def _tree(directory: Path) -> dict[str, tuple[str, int, int]]:
    out = {}
    for root, dirs, names in os.walk(directory):
        for n in sorted(dirs + names):
            p = Path(root) / n
            st = os.lstat(p)
            data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out[os.path.relpath(p, directory)] = (data, st.st_mode, st.st_ino)
    return out


def test_a_failed_placement_leaves_the_previous_member_s_files(s3env: Any,
                                                               tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    src = tmp_path / "src"
    a = write(src / "a" / "a.pte", 70_000, 1)
    b = write(src / "b" / "b.pte", 90_000, 2)
    publish_set({"a": [a], "b": [b]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    out = tmp_path / "out"
    fetch_set(url, out, "a", endpoint_url=s3env.endpoint.url)
    (out / "b.pte").mkdir()
    (out / "b.pte" / "notes.txt").write_bytes(b"the user's")
    before = _tree(out)
    assert {"a.pte", "b.pte", "b.pte/notes.txt"} <= set(before), before

    with pytest.raises(IsADirectoryError, match="b.pte"):
        fetch_set(url, out, "b", endpoint_url=s3env.endpoint.url)
    assert _tree(out) == before, "the previous member's files changed under a failed fetch"
    assert (out / "a.pte").read_bytes() == a.read_bytes()
