"""io/orphans.py stale_parts: only a dead store's regular ``.part`` files, with their sizes.

What ``trtet-store recover DIR`` names (and ``--discard-parts`` removes): a file of a
store whose lock is held (a live store, still writing it) is not stale; a finished
``.blob`` of a dead store is no ``.part``; a directory at a ``.part`` name is no
half-written file; a ``.part`` named for no store is nobody's. Each operand of
``if token is None or not f.name.endswith(PART_SUFFIX) or live.alive(token)`` and the
``S_ISREG`` check; nothing is changed by the look.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from attacker import tree

from trtet_store.io.names import store_lock_path
from trtet_store.io.orphans import stale_parts

DEAD, LIVE = "0123456789abcdef", "fedcba9876543210"


def test_only_a_dead_stores_regular_part_files_are_stale(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir(mode=0o700)
    dead = staging / f"{DEAD}-1.blob.part"
    dead.write_bytes(b"d" * 1000)
    (staging / f"{DEAD}-2.blob").write_bytes(b"a finished blob")  # no .part
    (staging / f"{DEAD}-3.blob.part").mkdir()  # a directory at a .part name
    (staging / "notes.part").write_bytes(b"a user's own")  # no store's token in its name
    live = staging / f"{LIVE}-1.blob.part"
    live.write_bytes(b"l" * 500)
    lock = store_lock_path(staging, LIVE)
    lock.write_bytes(b"")
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the live store holds its lock
    try:
        before = tree(staging)
        assert stale_parts(staging) == [(dead, 1000)]
        assert tree(staging) == before
    finally:
        os.close(fd)
    # its lock released (the store gone), its part is stale too
    assert stale_parts(staging) == [(dead, 1000), (live, 500)]
