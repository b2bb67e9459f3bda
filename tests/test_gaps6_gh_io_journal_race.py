"""io/journal.py open_if_abandoned: the journal is judged again on the descriptor it locked
(a gap hunt: no test swapped the journal's name between the owner check made before the
lock and the lock itself).

The owner check before the lock opens the name once; the lock opens it again. A second
process swaps the name between root's journal and uid 65534's (the same bytes, a plan
that passes every path rule) while recovery opens it over and over: every journal opened
must be root's file; uid 65534's is refused as not ours (or, swapped while locked, seen
as replaced), never read and acted on.
"""

from __future__ import annotations

import os
import signal
import time

from attacker import NOBODY
from test_audit_journal_plans import here as here  # the fixture  # noqa: PLC0414
from test_gaps_io_journal import first_output
from test_journal_plants import T1, journal_text

from trtet_store.io import NotOursError
from trtet_store.io.journal import ROLLING_BACK, Journal, Plan
from trtet_store.io.names import journal_path


def test_a_journal_swapped_before_its_lock_is_judged_on_the_locked_descriptor(here) -> None:
    text = journal_text(Plan(token=T1, outputs=[first_output(here)]), ROLLING_BACK)
    ours, theirs = here / "ours.j", here / "theirs.j"
    ours.write_bytes(text)
    theirs.write_bytes(text)
    os.chown(theirs, NOBODY, NOBODY)
    path = journal_path(here / "model.pte", T1)
    os.link(ours, path)
    pid = os.fork()
    if pid == 0:  # the swapper: another process, so it runs while recovery does
        try:
            i = 0
            while True:
                tmp = here / f"t{i % 2}"
                os.link((theirs, ours)[i % 2], tmp)
                os.rename(tmp, path)  # atomic: the name always exists
                i += 1
        finally:
            os._exit(0)
    opened, refused, theirs_opened = 0, 0, 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and opened + refused < 4000:
            try:
                journal = Journal.open_if_abandoned(path)
            except NotOursError as exc:
                assert str(exc) == (f"write journal {path} is not ours: owned by uid {NOBODY}, "
                                    "not by uid 0; left alone"), exc
                refused += 1
                continue
            except FileNotFoundError:
                continue  # replaced while being locked
            assert journal is not None
            try:
                opened += 1
                if os.fstat(journal.fd).st_uid != os.geteuid():
                    theirs_opened += 1
            finally:
                journal.close()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert theirs_opened == 0, f"{theirs_opened} of {opened} journals opened were uid {NOBODY}'s"
    assert opened and refused  # both files were met
    assert ours.read_bytes() == text and theirs.read_bytes() == text
    assert theirs.stat().st_uid == NOBODY
