"""recover(): finishes or undoes interrupted writes, idempotent, safe beside live writers.

Crashes here are real deaths: the write runs in a forked child that calls
``os._exit`` just before a chosen system call (CallHook), so no
``finally`` and no rollback runs, and the kernel drops the child's locks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import crash_child
import pytest
from crash_dying import CallHook, Nth, die, in_child
from crash_scenario import Scenario, content, kill_scenario
from crash_verdict import blob_files, check_recovered, collect_dead_store, journal_state
from digests import digest, file_digest

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import fs, recovery
from trtet_store.io import journal as journal_mod
from trtet_store.io.lock import ConcurrentWriteError
from trtet_store.io.lock import lock_file as _lock_file
from trtet_store.io.names import DEST_LOCK_SUFFIX as LOCK_SUFFIX
from trtet_store.io.units import KiB


def small_scenario(**changes) -> Scenario:
    """Two outputs (one replacing an old file), three blobs and a user file; 16 KiB chunks."""
    scn = Scenario(
        blobs=[(11, 300_001), (12, 200_000), (13, 70_000)],
        outputs={
            "m.pte": [["bytes", 1, 100], ["blob", 0], ["bytes", 2, 33], ["ext", "u.bin"],
                      ["blob", 1]],
            "m.ptd": [["bytes", 3, 10], ["blob", 2]],
        },
        old={"m.pte": (4, 1000)},
        externals={"u.bin": (5, 50_000)},
        store_chunk=16 * KiB,
        write_chunk=32 * KiB,
    )
    for k, v in changes.items():
        setattr(scn, k, v)
    return scn


def trace(scn: Scenario, root: Path) -> list[str]:
    """The system calls an uninterrupted write of ``scn`` makes, in order (in this process)."""
    staging, out, user = scn.install(root)
    store, blobs = scn.stage(staging)
    with CallHook(None, die) as hook, contextlib.suppress(OSError):
        scn.write(out, user, blobs)
    store.close()
    return hook.names


def nth(names: list[str], name: str, k: int) -> int:
    """The 1-based call number of the ``k``-th call of ``name``."""
    seen = 0
    for i, n in enumerate(names, 1):
        if n == name:
            seen += 1
            if seen == k:
                return i
    raise AssertionError(f"fewer than {k} calls of {name}: {names}")


def move_cut(k: int = 1) -> Nth:
    """The call just after the ``k``-th truncation of a move source, as this run makes it.

    The temp files are sized (``ftruncate``) before the first move step
    allocates (``fallocate``); every ``ftruncate`` after that cuts a move's
    source. A move truncates in a second thread, after its step's sync, while
    the next step is copied, so it need not follow an ``fdatasync`` directly.
    """
    return Nth("ftruncate", k, plus=1, after="fallocate")


def die_at(scn: Scenario, root: Path, at: int | Nth, *,
           action=die) -> tuple[Path, Path, Path]:
    """Stage and write ``scn`` in a child that dies before call ``at`` (a number or a mark)."""
    staging, out, user = scn.install(root)

    def child():
        _store, blobs = scn.stage(staging)
        with CallHook(at, action):
            scn.write(out, user, blobs)

    code = in_child(child)
    assert code == 86, f"the child did not die at call {at} (exit {code})"
    return staging, out, user


def actions(outcomes) -> list[str]:
    # Orphans (blobs of the dead store, kept) are reported too; they are not writes.
    return [o.action for o in outcomes if o.action not in ("removed stray", "orphan")]


# -- finishing or undoing -------------------------------------------------------------


def test_recover_rolls_back_when_finishing_a_move_finds_a_changed_source(here_fs):
    # The front of blob 0 changed after staging; the writer died after moving
    # its first steps. Finishing the move hits the changed chunk: recovery
    # must undo the write instead of failing (and failing again next time).
    scn = small_scenario(tamper=0)
    staging, out, user = die_at(scn, here_fs, move_cut(1))  # after the first move's first step
    assert journal_state(out) == "placing"
    outcomes = recover(out)
    assert actions(outcomes) == ["rolled back"], outcomes
    assert "does not match the digest" in outcomes[0].detail
    # It says where the blobs are: their store died with the writer.
    for path in blob_files(staging).values():
        assert str(path) in outcomes[0].detail
    assert "BlobStore.adopt" in outcomes[0].detail
    assert check_recovered(scn, staging, out, user) == "old"
    assert recover(out) == []
    collect_dead_store(staging)


def _journal_cut_short(scn: Scenario, root: Path, keep: float):
    """A writer that died while writing its plan: the journal holds ``keep`` of the plan line."""
    names = trace(scn, root)
    plan_write = nth(names, "pwrite", 1)  # the journal's plan line comes first
    assert names[plan_write - 2] == "open"
    staging, out, user = die_at(scn, root, plan_write + 1 if keep else plan_write)
    (path,) = journal_mod.journals_in(out)
    if keep:
        line = path.read_bytes()
        assert line.endswith(b"\n")
        path.write_bytes(line[: int(len(line) * keep)])
    return staging, out, user, path


@pytest.mark.parametrize("keep", [0, 0.5], ids=["empty", "torn"])
def test_recover_removes_a_journal_whose_plan_never_got_written(here_fs, keep):
    scn = small_scenario()
    staging, out, user, path = _journal_cut_short(scn, here_fs, keep)
    outcomes = recover(out)
    assert [o.action for o in outcomes if o.journal == path] == ["removed incomplete journal"]
    assert not path.exists()
    assert check_recovered(scn, staging, out, user) == "old"
    assert recover(out) == []
    collect_dead_store(staging)


def test_write_after_a_writer_died_writing_its_plan_succeeds(here_fs, caplog):
    scn = small_scenario()
    staging, out, user, path = _journal_cut_short(scn, here_fs, 0)
    with BlobStore(here_fs / "s2") as store:
        blob = store.put(b"x" * 100_000)
        with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
            write_file(out / "m.pte", [b"head", blob], consume=True)
    assert (out / "m.pte").read_bytes() == b"head" + b"x" * 100_000
    assert not path.exists()
    assert "never completely written" in caplog.text


def test_recover_leaves_an_empty_journal_alone_while_its_writer_lives(here_fs):
    # A live writer holds its destination's lock from before it creates the
    # journal until after it removes it; between creating the journal and
    # locking it, the journal is empty. Recovery must call that busy, and the
    # write must go on undisturbed.
    store = BlobStore(here_fs / "s")
    blob = store.put(b"y" * 300_000)
    out = here_fs / "out"
    out.mkdir()
    seen = []
    real_open = fs.calls.open

    def open_then_recover(path, flags, *mode):
        fd = real_open(path, flags, *mode)
        if os.fspath(path).endswith(".trtet-journal") and flags & os.O_CREAT:
            seen.extend(recover(out))  # the journal exists, empty and not yet locked
        return fd

    fs.calls.open = open_then_recover
    try:
        write_file(out / "m.pte", [b"h", blob], consume=True, chunk_size=64 * KiB)
    finally:
        fs.calls.open = real_open
    assert [o.action for o in seen] == ["busy"]
    assert (out / "m.pte").read_bytes() == b"h" + b"y" * 300_000
    assert sorted(p.name for p in out.iterdir()) == ["m.pte"]
    store.close()


# -- a rollback that had to take back published files ------------------------------------


def _fail_second_rename_then_die(scn: Scenario, root: Path, k: int):
    """The second output's rename fails (EIO); the writer dies before call ``k`` of its rollback.

    ``k`` counts the rollback's calls from the failed rename (1 = the next call).
    """
    assert trace(scn, root).count("rename") == 2
    second_rename = Nth("rename", 2)
    staging, out, user = scn.install(root)

    def child():
        _store, blobs = scn.stage(staging)

        def eio_then_die(n, name):
            if hook.found[second_rename] == n:
                raise OSError(errno.EIO, f"injected EIO at call {n} ({name})")
            die()

        with CallHook({second_rename, Nth("rename", 2, plus=k)}, eio_then_die) as hook:
            scn.write(out, user, blobs)

    code = in_child(child)
    return code, staging, out, user


@pytest.mark.parametrize("old_ptd", [True, False], ids=["both-old", "pte-old-only"])
def test_recover_finishes_a_rollback_that_was_taking_back_a_published_file(here_fs, old_ptd):
    # Two outputs; the first is renamed into place, the second's rename
    # fails, so the writer takes the first one back (rename it to its temp,
    # the backup of the old file to its name) and then unmoves. Die at each
    # call of that rollback: recovery must end with both old files and every
    # blob restored.
    scn = small_scenario()
    if old_ptd:
        scn.old["m.ptd"] = (6, 2000)
    # Every call of the taking back and the first unmoves, then every 10th.
    for k in [*range(1, 16), *range(20, 1000, 10)]:
        code, staging, out, user = _fail_second_rename_then_die(scn, here_fs, k)
        if code != 86:
            assert code == 1  # the rollback finished before call k: nothing left to do
            break
        state = journal_state(out)
        where = f"died at call {k} of the rollback (journal {state})"
        recover(out)
        verdict = check_recovered(scn, staging, out, user, where=where)
        # Dead before the rollback was recorded, the write was still publishing:
        # finishing it is right too. Once recorded, the old files must come back.
        assert verdict == "old" or state == "publishing", where
        collect_dead_store(staging)
    else:
        raise AssertionError("the rollback never finished")


# -- recovery beside other processes ---------------------------------------------------------


def test_concurrent_recovers_do_not_trip_over_each_other(here_fs, monkeypatch):
    # Two recover() calls on one directory (say, the user's and a new
    # writer's): a journal the other one just finished must be skipped, not
    # raise FileNotFoundError.
    scn = small_scenario()
    staging, out, user = die_at(scn, here_fs, move_cut(2))
    assert journal_mod.journals_in(out)
    real = recovery.journals_in
    others = []

    def listed_then_another_recovers(directory):
        found = real(directory)
        if found and not others:
            monkeypatch.setattr(recovery, "journals_in", real)
            others.extend(recover(directory))  # finishes them all, meanwhile
            monkeypatch.setattr(recovery, "journals_in", listed_then_another_recovers)
        return found

    monkeypatch.setattr(recovery, "journals_in", listed_then_another_recovers)
    mine = recover(out)
    assert actions(others) == ["rolled forward"] or actions(others) == ["rolled back"]
    assert actions(mine) == []
    check_recovered(scn, staging, out, user)
    collect_dead_store(staging)
def test_recover_never_removes_the_temp_file_of_a_live_writer(here_fs, monkeypatch):
    # A writer may create its journal and temp file while recover() is
    # looking for strays: the temp must not be taken for one.
    store = BlobStore(here_fs / "s", chunk_size=16 * KiB)
    blob = store.put(content(1, 500_000))
    out = here_fs / "out"
    out.mkdir()
    blocked, go = threading.Event(), threading.Event()
    result = {}

    def progress(done, total):
        blocked.set()
        go.wait(30)

    def writer():
        try:
            write_file(out / "live.pte", [b"head", blob], consume=True, chunk_size=64 * KiB,
                       progress=progress)
            result["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    real = recovery.journals_in
    calls = []
    thread = threading.Thread(target=writer)

    def writer_starts_meanwhile(directory):
        found = real(directory)
        calls.append(directory)
        if len(calls) == 2:  # the stray hunt's look at the journals
            thread.start()
            assert blocked.wait(30)
        return found

    monkeypatch.setattr(recovery, "journals_in", writer_starts_meanwhile)
    try:
        recover(out)
    finally:
        go.set()
        if thread.is_alive() or len(calls) >= 2:
            thread.join(30)
    assert result.get("ok"), result.get("error")
    assert (out / "live.pte").read_bytes() == b"head" + content(1, 500_000)
    store.close()
def test_recover_never_unlinks_a_lock_a_writer_just_took(here_fs, monkeypatch):
    # recover() removes lock files nobody holds. If a writer takes the lock
    # in between the check and the unlink, the writer must either be refused
    # or keep a lock that still guards the destination.
    dest = here_fs / "m.pte"
    lock_path = here_fs / f".m.pte{LOCK_SUFFIX}"
    lock_path.touch()  # left by a writer that died
    taken = []

    def writer_locks_first(real):
        def unlink(path, *args, **kwargs):
            if os.fspath(path).endswith(LOCK_SUFFIX) and not taken:
                try:
                    taken.append(_lock_file(lock_path, dest))
                except ConcurrentWriteError:
                    taken.append(None)
            return real(path, *args, **kwargs)

        return unlink

    monkeypatch.setattr(os, "unlink", writer_locks_first(os.unlink))
    monkeypatch.setattr(fs.calls, "unlink", writer_locks_first(fs.calls.unlink))
    recover(here_fs)
    monkeypatch.undo()
    assert taken
    if taken[0] is not None:
        # The writer holds a lock: a second writer must be refused.
        with pytest.raises(ConcurrentWriteError):
            _lock_file(lock_path, dest)
        os.close(taken[0])


# -- nothing to do, idempotence ---------------------------------------------------------------


def test_recover_with_nothing_to_do_does_nothing(here_fs):
    assert recover(here_fs) == []
    (here_fs / "model.pte").write_bytes(b"a finished output")
    (here_fs / ".hidden").write_bytes(b"not ours")
    (here_fs / "notes.trtet-journal.txt").write_bytes(b"not a journal either")
    before = {p.name: p.read_bytes() for p in here_fs.iterdir()}
    assert recover(here_fs) == []
    assert recover(os.fspath(here_fs)) == []
    assert {p.name: p.read_bytes() for p in here_fs.iterdir()} == before


def test_recover_of_a_missing_directory_says_so(here_fs):
    with pytest.raises(FileNotFoundError):
        recover(here_fs / "no-such-dir")


@pytest.mark.parametrize("where", ["placing", "publishing", "cleanup"])
def test_recover_is_idempotent(here_fs, where):
    scn = small_scenario()
    at = {"placing": move_cut(4),
          "publishing": Nth("rename", 1, plus=1),  # first output published, second not
          "cleanup": Nth("unlink", 1)}[where]  # every rename done, sources not released
    staging, out, user = die_at(scn, here_fs, at)
    first = recover(out)
    assert actions(first) == ["rolled forward"], first
    snapshot = {p.name: file_digest(p) for p in out.iterdir()}
    for _ in range(3):
        assert recover(out) == []
    assert {p.name: file_digest(p) for p in out.iterdir()} == snapshot
    assert check_recovered(scn, staging, out, user) == "new"
    collect_dead_store(staging)


# -- stale state: say what was found, delete nothing a journal needs --------------------------


def test_a_store_starting_beside_an_interrupted_write_keeps_its_files(here_fs, caplog):
    scn = small_scenario()
    staging, out, user = die_at(scn, here_fs, move_cut(3))
    blobs_before = blob_files(staging)
    assert len(blobs_before) == 3
    with caplog.at_level(logging.WARNING, logger="trtet_store.blobstore"), \
            BlobStore(staging) as store:
        assert store.collected == []  # the dead store's blobs are pinned by the journal
        assert blob_files(staging) == blobs_before
    assert "3 staged blob(s) of dead stores" in caplog.text  # kept: orphans, and pinned
    assert "recover" in caplog.text
    assert actions(recover(out)) in (["rolled forward"], ["rolled back"])
    check_recovered(scn, staging, out, user)
    collect_dead_store(staging)


def test_a_write_beside_an_interrupted_write_reports_it_and_leaves_it_alone(here_fs, caplog):
    scn = small_scenario()
    staging, out, user = die_at(scn, here_fs, move_cut(3))
    (journal,) = journal_mod.journals_in(out)
    before = {p.name: file_digest(p) for p in [*out.iterdir(), *staging.iterdir()]}
    with BlobStore(here_fs / "other") as store:
        blob = store.put(b"z" * 50_000)
        with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
            write_file(out / "other.pte", [b"o", blob], consume=True)
    assert "found an interrupted write of" in caplog.text and "m.pte" in caplog.text
    assert f"trtet-store recover {out}" in caplog.text
    after = {p.name: file_digest(p) for p in [*out.iterdir(), *staging.iterdir()]}
    assert after == {**before, "other.pte": digest(b"o" + b"z" * 50_000)}
    assert journal.exists()
    recover(out)
    (out / "other.pte").unlink()
    check_recovered(scn, staging, out, user)
    collect_dead_store(staging)


def test_a_write_of_the_same_destination_finishes_the_interrupted_one_first(here_fs, caplog):
    scn = small_scenario()
    staging, out, user = die_at(scn, here_fs, move_cut(3))
    with BlobStore(here_fs / "other") as store:
        blob = store.put(b"n" * 50_000)
        with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
            write_file(out / "m.pte", [b"n", blob], consume=True)
    assert "found an interrupted write of" in caplog.text and "recovering it first" in caplog.text
    assert (out / "m.pte").read_bytes() == b"n" + b"n" * 50_000
    assert not journal_mod.journals_in(out)
    # The interrupted write was finished or undone as a whole: its other
    # output tells which, and its blobs are where that says.
    ptd = out / "m.ptd"
    finished = ptd.exists()
    if finished:
        assert ptd.read_bytes() == scn.new_content()["m.ptd"]
    staged = scn.staged_digests()
    files = blob_files(staging)
    for i in range(3):
        assert (i in files) != finished
        if not finished:
            assert file_digest(files[i]) == staged[i]


# -- recover beside a live writer in another process --------------------------------------------


def test_recover_in_a_loop_while_another_process_writes_in_the_directory(here_fs):
    # A dead writer's leftovers (m.pte) and a live child writing model.pte
    # and model.ptd (16 MiB of blobs) in the same directory; recover() runs
    # over and over meanwhile. The dead write is finished or undone, the live
    # one completes untouched, recover() never raises.
    dead = small_scenario()
    staging, out, user = die_at(dead, here_fs / "live", move_cut(3))
    live = kill_scenario(scale=256 * KiB)
    for name, (seed, size) in live.old.items():
        (out / name).write_bytes(content(seed, size))
    for name, (seed, size) in live.externals.items():
        (user / name).write_bytes(content(seed, size))
    scn_file = here_fs / "live.json"
    scn_file.write_text(live.to_json())
    child = crash_child.spawn(scn_file, here_fs / "live")
    assert child.stdout.readline().strip() == "ready"
    seen = []
    while child.poll() is None:
        seen += recover(out)
    stdout, stderr = child.communicate()
    assert child.returncode == 0 and "done" in stdout, stderr
    seen += recover(out)
    acts = [o.action for o in seen]
    assert acts.count("rolled forward") + acts.count("rolled back") == 1, acts
    assert "busy" in acts, "recover never ran while the child was writing"
    new = live.new_content()
    for name in live.outputs:
        assert (out / name).read_bytes() == new[name], name
    m_pte = (out / "m.pte").read_bytes()
    assert m_pte in (dead.old_content()["m.pte"], dead.new_content()["m.pte"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.pte", "model.ptd", "m.pte"] + (["m.ptd"] if (out / "m.ptd").exists() else []))


def test_recover_removes_capability_probes_of_dead_writers_only(here_fs):
    # A writer tries operations on scratch files (.trtet-probe-<pid>-...) in
    # the output directory; killed in that instant, it leaves one behind.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = here_fs / f".trtet-probe-{dead.pid}-insert"
        left.write_bytes(b"")
        live = here_fs / f".trtet-probe-{alive.pid}-7f00aa"
        live.write_bytes(b"a link to a blob, say")
        outcomes = recover(here_fs)
        assert [(o.journal.name, o.action) for o in outcomes] == [(left.name, "removed stray")]
        assert not left.exists() and live.exists()
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("case", ["insert host", "copy"])
def test_a_store_started_before_recovery_keeps_what_the_journal_needs(here_fs, case):
    # The writer died; the user restarts and a new store opens in the
    # staging directory before anyone runs recover(). It must leave the dead
    # store's files that the journal needs, and its lock, so that recovery
    # can finish or undo the write and the files are collected afterwards.
    if case == "insert host":  # blob 0 becomes the output file (rename + insert)
        scn = small_scenario(outputs={"m.pte": [["bytes", 1, 4096], ["blob", 0]]},
                             blobs=small_scenario().blobs[:1])
        names = trace(scn, here_fs)
        assert "fallocate" in names, "no insert here"
        at = Nth("fallocate", 1, plus=1)  # renamed into place, room inserted
    else:  # consume=False: the blobs are copied and must survive
        scn = small_scenario(consume=False)
        at = Nth("copy_file_range", 3)
    staging, out, user = die_at(scn, here_fs, at)
    with BlobStore(staging) as early:
        assert early.collected == [], early.collected
    assert actions(recover(out)) in (["rolled back"], ["rolled forward"])
    check_recovered(scn, staging, out, user)
    collect_dead_store(staging)


def test_trtet_store_recover_command_finishes_an_interrupted_write(here_fs):
    scn = small_scenario()
    staging, out, user = die_at(scn, here_fs, move_cut(4))
    cli = [sys.executable, "-m", "trtet_store.cli", "recover", os.fspath(out)]
    first = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "rolled forward" in first.stdout or "rolled back" in first.stdout, first.stdout
    again = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout
    check_recovered(scn, staging, out, user)
    collect_dead_store(staging)
