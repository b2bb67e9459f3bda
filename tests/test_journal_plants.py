"""A write journal we did not make is never replayed, read whole, or let block a write.

Every write takes its destination's lock, then recovers abandoned journals
in the destination's directory; ``trtet-store recover DIR`` recovers every
journal in DIR. In a mode 1777 directory another user (uid 65534, a forked
child that drops to it) can plant a file under any journal's name. Here
each plant is real, on a real filesystem, and root is the victim (the
documentation's own way of running the tools, docs/testing.md):

- the trial's journals: one naming root's ``authorized_keys`` (in a 0700
  directory) as an output whose temp file is the attacker's, with root's key
  as a pin; one rolling back an "insert" whose temp file is a root 0600 file
  and whose host mode is 0666 for uid 65534;
- a journal whose paths are all where ours would be (so only its owner gives
  it away), replacing root's other program in the shared directory and
  deleting a root file there;
- a journal of root's own whose plan names a source outside its directory
  (a team's group-writable directory);
- a 1 GiB sparse file under journal names (another user's, and root's own);
- a FIFO and JSON nested 100,000 deep under another file's journal name,
  and a FIFO under another file's lock name.

Each test proves that root's files kept their digests, owners and modes,
that the planted journals are still there, and what was said.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, shared_dir

from trtet_store import recover, write_file
from trtet_store.io.journal import (
    DONE,
    JOURNAL_LIMIT,
    PUBLISHING,
    ROLLING_BACK,
    OutputPlan,
    PayloadPlan,
    Plan,
)
from trtet_store.io.names import journal_path, lock_path_of, temp_path

REPO = Path(__file__).resolve().parents[1]
T1, T2, T3 = "0123456789abcdef", "fedcba9876543210", "00112233aabbccdd"
PROGRAM = b"root's new program " * 64


@pytest.fixture
def top() -> Iterator[Path]:
    """A 0755 directory on the root disk that uid 65534 can reach (pytest's tmp_path is
    under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="journal-plants-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def state(*dirs: Path) -> dict[str, tuple]:
    """Every entry under each directory (itself too, links not followed): type, mode, owner,
    size, and a regular file's bytes."""
    out = {}
    for top in dirs:
        for path in [top, *sorted(top.rglob("*"))]:
            st = os.lstat(path)
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) and st.st_size < (1 << 20) \
                else None
            out[os.fspath(path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                    st.st_uid, st.st_gid, st.st_size, data)
    return out


def victim(root: Path) -> Path:
    """root's 0700 directory: authorized_keys, a private key and a 0600 secret."""
    home = root / "root-home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    for name, data in (("authorized_keys", b"ssh-ed25519 AAAA root@admin\n"),
                       ("id_ed25519", b"-----BEGIN OPENSSH PRIVATE KEY-----\nroot\n"),
                       ("shadow.conf", b"root:secret-hash:19000:0:99999:7:::\n" * 20)):
        (home / name).write_bytes(data)
        os.chmod(home / name, 0o600)
    return home


def journal_text(plan: Plan, state_: str) -> bytes:
    return (plan.to_json() + "\n" + f'{{"state":"{state_}"}}' + "\n").encode()


def plant(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` at ``path`` as uid 65534."""
    def write() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        os.write(fd, data)
        os.close(fd)
    as_nobody(write)
    assert os.lstat(path).st_uid == NOBODY


def move(source: Path, size: int, *, placement: str = "move", **kw) -> PayloadPlan:
    return PayloadPlan(source=os.fspath(source), offset=0, size=size, placement=placement,
                       reason="planted", chunk_size=1 << 20, chunk_digests=None,
                       consumed=True, **kw)


def trial_journals(shared: Path, home: Path) -> tuple[Path, Path]:
    """The trial's two journals, planted by uid 65534 in ``shared``.

    The first, of ``model.pte`` (what root writes next), publishing: its second
    output is root's authorized_keys with the attacker's file as its temp, and
    root's private key is one of its pins. The second, of ``report.pte``,
    rolling back an insert whose temp file is root's 0600 secret and whose
    host is a name in the shared directory, mode 0666, owner 65534.
    """
    evil = shared / "evil-keys"
    plant(evil, b"ssh-ed25519 AAAA attacker@evil\n")
    dest = shared / "model.pte"
    plan = Plan(token=T1, outputs=[
        OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                   size=len(PROGRAM)),
        OutputPlan(dest=os.fspath(home / "authorized_keys"), temp=os.fspath(evil), backup=None,
                   size=evil.stat().st_size)],
        pins=[os.fspath(home / "id_ed25519")])
    first = journal_path(dest, T1)
    plant(first, journal_text(plan, PUBLISHING))
    secret = home / "shadow.conf"
    report = shared / "report.pte"
    plan = Plan(token=T2, outputs=[OutputPlan(
        dest=os.fspath(report), temp=os.fspath(secret), backup=None,
        size=secret.stat().st_size,
        payloads=[move(shared / "loot", secret.stat().st_size, placement="insert",
                       host_mode=[0o666, NOBODY, NOBODY])])])
    second = journal_path(report, T2)
    plant(second, journal_text(plan, ROLLING_BACK))
    return first, second


def test_the_trials_planted_journals_are_left_alone_by_a_write_and_by_recover(top, caplog):
    shared = shared_dir(top)
    home = victim(top)
    first, second = trial_journals(shared, home)
    before = state(home)
    planted = state(shared)

    with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
        write_file(shared / "model.pte", [PROGRAM])
    assert (shared / "model.pte").read_bytes() == PROGRAM
    assert state(home) == before
    after = state(shared)
    del after[os.fspath(shared / "model.pte")]
    assert after == planted  # both journals, the attacker's files, the directory
    assert (f"ignoring write journal {first} is not ours: owned by uid {NOBODY}, not by "
            f"uid 0; left alone (writing {shared / 'model.pte'})") in caplog.messages

    outcomes = {o.journal: o for o in recover(shared)}
    assert outcomes[first].action == outcomes[second].action == "not ours"
    assert outcomes[second].detail == f"owned by uid {NOBODY}, not by uid 0; left alone"
    assert state(home) == before
    assert first.exists() and second.exists() and not (shared / "loot").exists()


def test_cli_recover_reports_planted_journals_and_leaves_them_alone(top):
    shared = shared_dir(top)
    home = victim(top)
    first, second = trial_journals(shared, home)
    before = state(home, shared)
    done = subprocess.run([sys.executable, "-m", "trtet_store.cli", "recover", shared],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert f"{first}: not ours ({shared / 'model.pte'}): owned by uid {NOBODY}, not by uid 0; " \
           "left alone" in lines
    assert f"{second}: not ours ({shared / 'report.pte'}): owned by uid {NOBODY}, not by " \
           "uid 0; left alone" in lines
    assert state(home, shared) == before


def test_a_journal_whose_only_flaw_is_its_owner_is_not_replayed(top, caplog):
    """Every path where a journal of ours would put it (so only the owner check stands):
    publishing would put the attacker's file over root's other program, and finishing
    would delete root's file that it names as a consumed source."""
    shared = shared_dir(top)
    other, kept = shared / "report.pte", shared / "weights.blob"
    other.write_bytes(b"root's other program\n" * 30)
    kept.write_bytes(b"root's weights\n" * 30)
    os.chmod(kept, 0o600)
    dest = shared / "model.pte"
    evil = temp_path(other, T1)
    plant(evil, b"attacker's program\n")
    plan = Plan(token=T1, outputs=[
        OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                   size=len(PROGRAM)),
        OutputPlan(dest=os.fspath(other), temp=os.fspath(evil), backup=None,
                   size=evil.stat().st_size, payloads=[move(kept, kept.stat().st_size)])])
    path = journal_path(dest, T1)
    plant(path, journal_text(plan, DONE))
    before = state(shared)

    with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
        write_file(dest, [PROGRAM])
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before  # root's program and weights, the journal, the attacker's temp
    assert any(m.startswith(f"ignoring write journal {path} is not ours: owned by uid "
                            f"{NOBODY}") for m in caplog.messages), caplog.messages
    (outcome,) = [o for o in recover(shared) if o.journal == path]
    assert outcome.action == "not ours"
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before


def test_a_journal_of_ours_naming_a_path_outside_its_directory_is_not_replayed(top):
    """root's own journal (as an older tool, or a copy, would leave) whose consumed source
    lies in a team's group-writable directory: finishing it would delete that file."""
    shared = shared_dir(top)
    team = top / "team"
    team.mkdir()
    os.chmod(team, 0o2775)
    weights = team / "weights.bin"
    weights.write_bytes(b"the team's weights\n" * 50)
    dest = shared / "model.pte"
    plan = Plan(token=T1, outputs=[
        OutputPlan(dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None,
                   size=len(PROGRAM), payloads=[move(weights, weights.stat().st_size)])])
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(plan, DONE))  # root's own
    before = state(team, shared)

    outcomes = recover(shared)
    assert [(o.journal, o.action, o.detail) for o in outcomes] == [
        (path, "not ours", f"its plan names the source {weights}, outside {shared} and any "
         "directory of ours; left alone")]
    assert state(team, shared) == before
    write_file(dest, [PROGRAM])
    assert weights.read_bytes() == b"the team's weights\n" * 50
    assert path.exists()


def rchar() -> int:
    """Bytes this process has read through read-like calls so far (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_sparse_gigabyte_under_journal_names_is_never_read(top):
    """Another user's (under our name and another's) and one of root's own: each is refused
    on its fstat, before a byte of it is read."""
    shared = shared_dir(top)
    dest = shared / "model.pte"
    theirs = [journal_path(dest, T1), journal_path(shared / "other.pte", T2)]
    for path in theirs:
        plant(path, b"")
        as_nobody(lambda p=path: os.truncate(p, 1 << 30))
    ours = journal_path(shared / "third.pte", T3)
    with open(ours, "wb") as f:
        f.truncate(1 << 30)
    before = state(shared)

    read_before = rchar()
    write_file(dest, [PROGRAM])
    assert rchar() - read_before < 4 << 20
    outcomes = {o.journal: o for o in recover(shared)}
    assert rchar() - read_before < 8 << 20
    assert outcomes[ours].action == "not ours"
    assert outcomes[ours].detail == (f"{1 << 30} bytes, over the {JOURNAL_LIMIT} such a file "
                                     "may hold; left alone")
    assert all(outcomes[p].action == "not ours" for p in theirs)
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before


def test_a_fifo_or_deep_json_under_other_names_never_fails_a_write(top, caplog):
    """A FIFO at another file's journal name and at another file's lock name, JSON nested
    100,000 deep at another's journal name (another user's, and root's own), and a FIFO
    at our own journal's name: the write goes ahead; recover reports each, and fails on none."""
    shared = shared_dir(top)
    dest = shared / "model.pte"
    fifo = journal_path(shared / "a.pte", T1)
    lock_fifo = lock_path_of(shared / "b.pte")
    our_fifo = journal_path(dest, T2)
    as_nobody(lambda: [os.mkfifo(p, 0o666) for p in (fifo, lock_fifo, our_fifo)])
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    theirs = journal_path(shared / "c.pte", T2)
    plant(theirs, deep)
    ours = journal_path(shared / "d.pte", T3)
    ours.write_bytes(deep)
    before = state(shared)

    with caplog.at_level(logging.WARNING, logger="trtet_store.recovery"):
        write_file(dest, [PROGRAM])
    assert dest.read_bytes() == PROGRAM
    assert (f"ignoring write journal {our_fifo} is not ours: a FIFO, not a regular file; left "
            f"alone (writing {dest})") in caplog.messages
    assert any(m.startswith(f"ignoring the unreadable journal {ours}") for m in caplog.messages)
    outcomes = {o.journal: o for o in recover(shared)}
    assert outcomes[fifo].detail == "a FIFO, not a regular file; left alone"
    assert outcomes[theirs].detail == f"owned by uid {NOBODY}, not by uid 0; left alone"
    assert outcomes[ours].action == "damaged"
    assert "nested too deep" in outcomes[ours].detail
    assert lock_fifo not in outcomes  # another's lock: not a stray of ours, left alone
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before

    done = subprocess.run([sys.executable, "-m", "trtet_store.cli", "recover", shared],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{our_fifo}: not ours ({dest}): a FIFO, not a regular file; left alone" in \
        done.stdout.splitlines()
    assert done.returncode == 1  # root's own damaged journal needs a person; nothing else
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before


def test_a_journal_of_ours_whose_temp_is_not_named_for_its_token_is_not_replayed(top):
    """root's own journal, rolling back, whose temp file is root's other program: a rollback
    deletes its temp files, so replaying it would delete that program."""
    shared = shared_dir(top)
    dest, other = shared / "model.pte", shared / "report.pte"
    other.write_bytes(b"root's other program\n" * 30)
    plan = Plan(token=T1, outputs=[OutputPlan(dest=os.fspath(dest), temp=os.fspath(other),
                                              backup=None, size=other.stat().st_size)])
    path = journal_path(dest, T1)
    path.write_bytes(journal_text(plan, ROLLING_BACK))
    before = state(shared)

    write_file(dest, [PROGRAM])
    outcomes = recover(shared)
    assert [(o.journal, o.action, o.detail) for o in outcomes] == [
        (path, "not ours", f"its plan names the temp file {other}, not {dest}'s for its "
         "token; left alone")]
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before


def test_recover_leaves_another_users_files_at_temp_and_lock_names_alone(top):
    """A temp name whose journal is gone and an unheld lock file are strays when they are
    ours; another user's at those names are theirs (root could remove them in a sticky
    directory, and must not)."""
    shared = shared_dir(top)
    theirs = [shared / f".notes.txt.trtet-{T1}.tmp", shared / f".notes.txt.trtet-{T2}.old",
              lock_path_of(shared / "b.pte")]
    for path in theirs:
        plant(path, b"another user's file\n")
    ours = [shared / f".mine.pte.trtet-{T3}.tmp", lock_path_of(shared / "mine.pte")]
    for path in ours:
        path.write_bytes(b"")
    before = state(shared)

    removed = sorted(o.journal for o in recover(shared) if o.action == "removed stray")
    assert removed == sorted(ours)
    assert state(shared) == {k: v for k, v in before.items() if Path(k) not in ours}


def test_a_plan_too_big_for_recovery_to_read_is_never_written(tmp_path):
    """Recovery reads at most JOURNAL_LIMIT bytes; a write whose plan could outgrow that (its
    amend lines repeat a payload's plan) is refused before its journal exists."""
    from trtet_store.io.journal import Journal

    dest = tmp_path / "model.pte"
    digests = list(range(1 << 62, (1 << 62) + JOURNAL_LIMIT // 40))  # ~20 bytes of JSON each
    plan = Plan(token=T1, outputs=[OutputPlan(
        dest=os.fspath(dest), temp=os.fspath(temp_path(dest, T1)), backup=None, size=1 << 40,
        payloads=[PayloadPlan(source=os.fspath(tmp_path / "a.blob"), offset=0, size=1 << 40,
                              placement="move", reason="", chunk_size=1 << 20,
                              chunk_digests=digests, consumed=True)])])
    assert len(plan.to_json()) > JOURNAL_LIMIT // 2
    with pytest.raises(OSError, match="over the 8388608 a journal may start with"):
        Journal.create(journal_path(dest, T1), plan)
    assert os.listdir(tmp_path) == []


def test_a_missing_source_directory_counts_only_under_a_directory_of_ours(top):
    """A staging directory deleted since is fine under the journal's directory; one under a
    team's group-writable directory is not (anyone there could make it before the replay)."""
    shared = shared_dir(top)
    team = top / "team"
    team.mkdir()
    os.chmod(team, 0o2775)
    dest = shared / "model.pte"
    for token, gone in ((T1, shared / ".trtet-staging"), (T2, team / "staging")):
        plan = Plan(token=token, outputs=[OutputPlan(
            dest=os.fspath(dest), temp=os.fspath(temp_path(dest, token)), backup=None, size=9,
            payloads=[move(gone / "0123456789abcdef-1.blob", 9, placement="insert")])])
        journal_path(dest, token).write_bytes(journal_text(plan, ROLLING_BACK))
    outcomes = {o.journal: o for o in recover(shared)}
    assert outcomes[journal_path(dest, T1)].action == "rolled back"
    assert outcomes[journal_path(dest, T2)].action == "not ours"
    assert outcomes[journal_path(dest, T2)].detail == (
        f"its plan names the source {team}/staging/0123456789abcdef-1.blob, outside {shared} "
        "and any directory of ours; left alone")
    assert os.listdir(team) == []


def test_a_journal_the_writer_may_not_even_read_never_blocks_its_write(top):
    """Not root: uid 65534 writes in a 1777 directory where another user (root here) left a
    0600 journal under its destination's journal name. Unreadable, it is another's, not a
    reason to refuse: the write goes ahead; recover reports it and leaves it."""
    shared = shared_dir(top)
    dest = shared / "model.pte"
    path = journal_path(dest, T1)
    path.write_bytes(b"{}\n")
    os.chmod(path, 0o600)
    before = state(shared)

    def write_and_recover() -> None:
        write_file(dest, [PROGRAM])
        (outcome,) = recover(shared)
        assert (outcome.journal, outcome.action, outcome.detail) == (
            path, "not ours", f"owned by uid 0, not by uid {NOBODY}; left alone")

    as_nobody(write_and_recover)
    assert dest.read_bytes() == PROGRAM and dest.stat().st_uid == NOBODY
    after = state(shared)
    del after[os.fspath(dest)]
    assert after == before
