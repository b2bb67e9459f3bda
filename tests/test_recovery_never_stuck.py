"""No journal is stuck: recovery finishes, rolls back, or says what is missing and what it did.

Issue 22, finding 5: a move whose source disappears left a journal that
``recover()`` could never finish, raising a bare FileNotFoundError on every
call, and every later write of the destination failed naming a staging blob
the user never mentioned. Two ways in: two threads consuming one Blob at
once, and a staging directory deleted after a killed move. Now the second
write of a blob is refused before anything moves, and a journal whose source
is gone is rolled back as far as it goes and reported ``"stuck"`` with a
:class:`StuckJournalError` naming the missing file, without blocking new
writes of its destination, until ``recover(..., abandon=True)`` gives it up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from crash_dying import die, in_child
from digests import digest, file_digest
from faults import WrappedCalls

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import names
from trtet_store.io.errors import BlobInUseError, StuckJournalError
from trtet_store.io.units import KiB, MiB

OLD = b"old model" * 1000


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class DieMovingFrom(WrappedCalls):
    """End the process (as SIGKILL would) while a blob under ``directory`` is moved out:
    before its ``cuts``-th truncation, or, with ``at``, at the first call named ``at``
    once it was emptied. (By the source's own descriptor: the steps' syncs and cuts
    may run in another thread than its copies.)"""

    def __init__(self, directory: Path, cuts: int = 0, at: str | None = None) -> None:
        self.directory, self.cuts, self.at = os.fspath(directory) + "/", cuts, at
        self.seen = 0
        self.emptied = False

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if name == "ftruncate" and _path_of(args[0]).startswith(self.directory):
                self.seen += 1
                if self.at is None and self.seen == self.cuts:
                    die()
                self.emptied = args[1] == 0
            elif name == self.at and self.emptied:
                die()
            return real(*args, **kwargs)

        return call


def _kill_while_moving(root: Path, cuts: int = 0, at: str | None = None):
    """Write m.pte from two blobs, one staged in s1 and one in s2, in a child killed
    while it moves s1's (the payload before s2's, so moved after it)."""
    s1, s2, out = root / "s1", root / "s2", root / "out"
    out.mkdir()
    (out / "m.pte").write_bytes(OLD)
    data1, data2 = os.urandom(200 * KiB + 3), os.urandom(100 * KiB + 5)

    def child() -> None:
        store1 = BlobStore(s1, chunk_size=16 * KiB)
        store2 = BlobStore(s2, chunk_size=16 * KiB)
        b1, b2 = store1.put(data1), store2.put(data2)
        with DieMovingFrom(s1, cuts, at):
            write_file(out / "m.pte", [b"h" * 100, b1, b"t" * 10, b2], consume=True,
                       chunk_size=64 * KiB, placements={"move"})

    assert in_child(child) == 86, "the writer was not killed"
    return s1, s2, out, data1, data2


def _writes(outcomes):
    return [o for o in outcomes if o.action not in ("orphan", "removed stray")]


def test_a_staging_directory_deleted_in_the_middle_of_a_move_leaves_a_named_stuck_write(
        here_fs):
    # s2's blob moved whole, s1's by one step (killed before its second cut);
    # then s1 is deleted.
    s1, s2, out, data1, data2 = _kill_while_moving(here_fs, cuts=2)
    shutil.rmtree(s1)
    (journal,) = out.glob(names.journal_glob())
    outcomes = _writes(recover(out))
    assert [o.action for o in outcomes] == ["stuck"]
    stuck = outcomes[0]
    assert isinstance(stuck.error, StuckJournalError)
    # It names the missing file, and says what it did with the rest.
    assert stuck.error.filename.startswith(os.fspath(s1))
    assert f"the source {stuck.error.filename} is missing" in stuck.detail
    assert "destinations keep what they had" in stuck.detail
    (b2,) = s2.glob("*.blob")
    assert f"have all their bytes back: {b2}" in stuck.detail
    assert "--abandon" in stuck.detail
    # The rest was rolled back: s2's blob has all its bytes again, m.pte is as it was.
    assert digest(b2.read_bytes()) == digest(data2)
    assert (out / "m.pte").read_bytes() == OLD
    # What holds the bytes moved out of s1's blob is kept: the journal and the temp file.
    (temp,) = [p for p in out.iterdir() if names.temp_token(p.name)]
    assert journal.exists() and stuck.error.kept == [os.fspath(temp)]
    # Idempotent: the same again, nothing raised.
    assert [o.action for o in _writes(recover(out))] == ["stuck"]
    assert digest(b2.read_bytes()) == digest(data2)
    # A new write of m.pte is not blocked by it.
    with BlobStore(here_fs / "s3") as store:
        new = os.urandom(50 * KiB)
        write_file(out / "m.pte", [b"new", store.put(new)], consume=True)
    assert digest((out / "m.pte").read_bytes()) == digest(b"new" + new)
    assert journal.exists() and temp.exists()
    # Given up only when asked; it says what.
    outcomes = _writes(recover(out, abandon=True))
    assert [o.action for o in outcomes] == ["abandoned"]
    assert os.fspath(temp) in outcomes[0].detail
    assert f"bytes moved out of {stuck.error.filename}" in outcomes[0].detail
    assert sorted(p.name for p in out.iterdir()) == ["m.pte"]
    assert digest((out / "m.pte").read_bytes()) == digest(b"new" + new)
    assert _writes(recover(out)) == []
    assert digest(b2.read_bytes()) == digest(data2)  # abandoning took nothing else


def test_a_move_finished_before_its_staging_directory_was_deleted_is_rolled_forward(here_fs):
    # Killed at the temp file's sync before publish: every byte of both blobs is
    # in the temp file, the sources are empty; then s1 goes.
    s1, s2, out, data1, data2 = _kill_while_moving(here_fs, at="fsync")
    shutil.rmtree(s1)
    outcomes = _writes(recover(out))
    assert [o.action for o in outcomes] == ["rolled forward"], outcomes
    want = b"h" * 100 + data1 + b"t" * 10 + data2
    assert digest((out / "m.pte").read_bytes()) == digest(want)
    assert sorted(p.name for p in out.iterdir()) == ["m.pte"]
    assert list(s2.glob("*.blob")) == []  # consumed: its emptied source is gone


def test_trtet_store_recover_says_stuck_and_abandon_gives_it_up(here_fs):
    s1, s2, out, data1, data2 = _kill_while_moving(here_fs, cuts=2)
    shutil.rmtree(s1)
    cli = [sys.executable, "-m", "trtet_store.cli", "recover", os.fspath(out)]
    first = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert first.returncode == 1, first.stderr
    assert ": stuck (" in first.stdout and os.fspath(s1) in first.stdout, first.stdout
    assert "Traceback" not in first.stderr and "FileNotFoundError" not in first.stderr
    given_up = subprocess.run(cli + ["--abandon"], capture_output=True, text=True, timeout=120)
    assert given_up.returncode == 0, given_up.stderr
    assert ": abandoned (" in given_up.stdout, given_up.stdout
    again = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout
    assert (out / "m.pte").read_bytes() == OLD


def test_a_stuck_write_that_may_still_publish_refuses_a_new_write_naming_the_file(here_fs):
    # Killed after the journal said publishing, before the rename; the temp file
    # cannot be renamed (immutable). Finishing it later would put it over
    # whatever a new write published, so the new write is refused, by name.
    s1, s2, out, data1, data2 = _kill_while_moving(here_fs, at="rename")
    (temp,) = [p for p in out.iterdir() if names.temp_token(p.name)]
    subprocess.run(["chattr", "+i", os.fspath(temp)], check=True)
    try:
        with BlobStore(here_fs / "s3") as store:
            blob = store.put(b"x" * 1000)
            with pytest.raises(StuckJournalError) as refused:
                write_file(out / "m.pte", [b"new", blob], consume=True)
            assert not blob.consumed
            assert file_digest(blob.path) == digest(b"x" * 1000)
        assert os.fspath(temp) in str(refused.value)
        assert (out / "m.pte").read_bytes() == OLD
        assert [o.action for o in _writes(recover(out))] == ["stuck"]
    finally:
        subprocess.run(["chattr", "-i", os.fspath(temp)], check=True)
    # Once the temp file can be renamed, the interrupted write is finished first.
    outcomes = _writes(recover(out))
    assert [o.action for o in outcomes] == ["rolled forward"]
    want = b"h" * 100 + data1 + b"t" * 10 + data2
    assert digest((out / "m.pte").read_bytes()) == digest(want)


def test_a_blob_consumed_by_two_writes_at_once_is_refused_at_the_second(make_fs):
    mnt = make_fs("ext4", 400)
    store = BlobStore(mnt / "s")
    out = mnt / "out"
    out.mkdir()
    published = []
    for r in range(12):
        data = os.urandom(8 * MiB)
        blob = store.put(data)
        barrier = threading.Barrier(2)
        results: dict[int, object] = {}

        def write(t: int, r=r, blob=blob, barrier=barrier, results=results) -> None:
            barrier.wait()
            try:
                write_file(out / f"{r}-{t}.pte", [b"h" * 100, blob], consume=True,
                           chunk_size=4 * MiB)
                results[t] = "ok"
            except (BlobInUseError, ValueError, OSError) as exc:
                results[t] = exc

        threads = [threading.Thread(target=write, args=(t,)) for t in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results) == [0, 1]
        won = [t for t, v in results.items() if v == "ok"]
        assert len(won) == 1, f"round {r}: {results}"
        lost = results[1 - won[0]]
        # Refused before anything moved: in use, or (the other one done) released.
        assert isinstance(lost, BlobInUseError) or (
            isinstance(lost, ValueError) and "was released" in str(lost)), f"round {r}: {lost!r}"
        published.append(f"{r}-{won[0]}.pte")
        assert digest((out / published[-1]).read_bytes()) == digest(b"h" * 100 + data)
        assert blob.consumed
        # The loser left nothing: no temp file, no journal, no lock.
        assert sorted(p.name for p in out.iterdir()) == sorted(published)
    assert store.blobs() == []
    store.close()
