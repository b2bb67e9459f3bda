"""io/recovery.py _remove_strays: another user's LINK at a stray temp's name is theirs.

The sweep judges whose an entry is by its ``lstat`` (``if os.lstat(f).st_uid != euid``):
uid 65534's symbolic link at a temp file's name (no journal of its token), pointing at a
file of root's, is left alone in a shared (1777) directory, the link and its target both;
root's own stray temp beside it is removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, listing, reachable_dir

from trtet_store import recover
from trtet_store.io.names import temp_path


@pytest.fixture
def top() -> Iterator[Path]:
    with reachable_dir("gaps9-strays-", 0o1777) as path:
        yield path


def test_another_users_link_at_a_stray_temps_name_is_left_alone(top: Path) -> None:
    target = top / "roots.pte"
    target.write_bytes(b"root's program")
    link = temp_path(top / "theirs.pte", "0123456789abcdef")
    as_nobody(lambda: os.symlink(target, link))
    mine = temp_path(top / "mine.pte", "fedcba9876543210")
    mine.write_bytes(b"a stray of ours")
    before = {k: v for k, v in listing(top).items() if k != mine.name}
    outcomes = recover(top)
    assert [(o.journal, o.action) for o in outcomes] == [(mine, "removed stray")]
    assert listing(top) == before
    assert os.lstat(link).st_uid == NOBODY and target.read_bytes() == b"root's program"
