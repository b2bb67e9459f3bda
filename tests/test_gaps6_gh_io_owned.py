"""io/owned.py: the owner is judged on the descriptor that was opened, never on a second
lookup of the name (a gap hunt: no test swapped the name between the open and the check).

A second process swaps the name between another user's file and ours (``rename``, so the name
always exists) while the victim reads it over and over: every read that succeeds must
return our bytes, and every refusal must name uid 65534. Judging the name again (a
``stat`` after the ``open``) lets a read open theirs and check ours.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from attacker import NOBODY

from trtet_store.io import NotOursError, read_ours


@pytest.fixture
def here(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    return d


def test_a_name_swapped_after_the_open_is_judged_by_what_was_opened(here: Path) -> None:
    ours, theirs = here / "ours", here / "theirs"
    ours.write_bytes(b"ours")
    theirs.write_bytes(b"theirs")
    os.chown(theirs, NOBODY, NOBODY)
    name = here / "j"
    os.link(ours, name)
    pid = os.fork()
    if pid == 0:  # the swapper: another process, so it runs while the victim does
        try:
            i = 0
            while True:
                tmp = here / f"t{i % 2}"
                os.link((theirs, ours)[i % 2], tmp)
                os.rename(tmp, name)  # atomic: the name always exists
                i += 1
        finally:
            os._exit(0)
    read, refused = [], []
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(read) + len(refused) < 20000:
            try:
                read.append(read_ours(name, limit=64))
            except NotOursError as exc:
                refused.append(str(exc))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert set(read) <= {b"ours"}, f"{read.count(b'theirs')} reads returned uid {NOBODY}'s bytes"
    assert all(f"owned by uid {NOBODY}, not by uid 0" in r for r in refused), refused[:3]
    assert read and refused  # both files were met
    assert ours.read_bytes() == b"ours" and theirs.read_bytes() == b"theirs"
    assert theirs.stat().st_uid == NOBODY
