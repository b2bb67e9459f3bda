"""Power cut at every step of a write, on loop-mounted ext4 (also noauto_da_alloc) and XFS.

For each call number N of the transaction (counted by crash_dying.CallHook
around ``fs.calls``), a forked child stages the blobs and writes; just before
call N it shuts the filesystem down without flushing its log
(EXT4_IOC_SHUTDOWN / XFS_IOC_GOINGDOWN with the NOLOGFLUSH flag: whatever is
not durable is lost, as in a power cut) and dies. The parent unmounts,
mounts the image again (log replay, a fresh loop device), runs
``recover()`` and checks, as after a kill: outputs old or new
(byte-identical to an uninterrupted write) and agreeing, every blob's bytes
exactly once, no temp/journal/lock/pin file. One more cut comes just after
the write returned: then the new files must be there.

Two layouts: unaligned (every blob moved) and aligned (4 KiB headers: the
largest blob of each output hosts it by insert on ext4; blobs are cloned on
XFS). The blobs are synced before the write in the main test (an engine
built long ago); a second test leaves them as a fresh build would, only in
the page cache, and cuts the power once the write has touched a source
(every third call; every call under TRTET_LONG=1). A third test cuts the
power a second time at every call of the recovery after a first cut.

Every call is cut on ext4 on every run (and on XFS for the aligned layout,
the layout whose blobs are cloned). On the other filesystems (the XFS half
of the ``[ext4, xfs]`` tests, ``ext4-noauto_da_alloc`` and XFS unaligned) the
power is cut at every third call from an offset that changes every day
(``TRTET_CUT_OFFSET``, default the day of the year mod 3), so that three
consecutive days cut every call; the offset is printed and is in every
failure's message, to replay it (``TRTET_CUT_OFFSET=2 pytest ...``).
``TRTET_LONG=1`` cuts every call everywhere.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
from pathlib import Path

import pytest
from crash_dying import CallHook, die, in_child, power_cut
from crash_scenario import Scenario
from crash_verdict import check_recovered, collect_dead_store, journal_state
from digests import digest
from faults import slow_syncs
from filesystems import syncfs

from trtet_store import recover
from trtet_store.io import fs, transfer
from trtet_store.io.units import KiB

CONFIGS = {
    "ext4": ("ext4", []),
    "ext4-noauto_da_alloc": ("ext4", ["noauto_da_alloc"]),
    "xfs": ("xfs", []),
}

LONG = os.environ.get("TRTET_LONG", "").strip().lower() in ("1", "true", "yes")
#: Off the fully cut filesystems, every STRIDE-th call is cut, from CUT_OFFSET.
STRIDE = 3


def cut_offset() -> int:
    """``TRTET_CUT_OFFSET`` (0, 1 or 2), or the day of the year mod 3: every call in 3 days."""
    given = os.environ.get("TRTET_CUT_OFFSET", "").strip()
    if given:
        return int(given) % STRIDE
    return datetime.date.today().timetuple().tm_yday % STRIDE


CUT_OFFSET = cut_offset()


class Calls:
    """The call numbers a test cuts at, and how to replay the choice.

    ``full``: every call from ``first`` to ``last``; otherwise every
    :data:`STRIDE`-th from ``first + CUT_OFFSET`` (every call under TRTET_LONG=1).
    """

    def __init__(self, first: int, last: int, *, full: bool, say: bool = True) -> None:
        self.full = full or LONG
        start, step = (first, 1) if self.full else (first + CUT_OFFSET, STRIDE)
        self.numbers = range(start, last + 1, step)
        self.said = ("every call" if self.full else
                     f"every {STRIDE}rd call from offset {CUT_OFFSET} (replay: "
                     f"TRTET_CUT_OFFSET={CUT_OFFSET}; every call: TRTET_LONG=1)")
        if say:
            print(f"\ncutting at {self.said}: {len(self.numbers)} of {last - first + 1} calls")

    def __iter__(self):
        return iter(self.numbers)

    def __len__(self) -> int:
        return len(self.numbers)

    def where(self, text: str) -> str:
        """``text`` for a failure message, with the replay line when not every call is cut."""
        return text if self.full else f"{text} [{self.said}]"


def scenario(aligned: bool = False) -> Scenario:
    """Two outputs (both replacing old files), three consumed blobs and a copied user file.

    Unaligned, every blob is moved. Aligned (4 KiB headers before blobs 0 and
    2), the largest blob of each output hosts it on ext4 (insert: renamed
    into place, room inserted before it) and blobs are cloned on XFS.
    """
    head = 4096 if aligned else 100
    return Scenario(
        blobs=[(21, 150_001), (22, 100_000), (23, 40_000)],
        outputs={
            "m.pte": [["bytes", 1, head], ["blob", 0], ["bytes", 2, 33], ["ext", "u.bin"],
                      ["blob", 1]],
            "m.ptd": [["bytes", 3, 4096 if aligned else 10], ["blob", 2]],
        },
        old={"m.pte": (4, 1000), "m.ptd": (6, 5000)},
        externals={"u.bin": (5, 30_000)},
        store_chunk=16 * KiB,
        write_chunk=32 * KiB,
    )


class PowerCuts:
    """Runs the scenario on one mounted filesystem, cutting the power at chosen calls."""

    def __init__(self, fs_factory, mnt: Path, scn: Scenario, *, sync_blobs: bool,
                 foreign_commit: bool = False, hold_writeback: bool = False,
                 sync_delay: float = 0.0) -> None:
        self.factory = fs_factory
        self.foreign_commit = foreign_commit
        self.hold_writeback = hold_writeback
        self.sync_delay = sync_delay
        self.mnt = mnt
        self.root = mnt / "w"
        self.scn = scn
        self.sync_blobs = sync_blobs
        self.staged = scn.staged_digests()
        self.new = {k: digest(v) for k, v in scn.new_content().items()}
        self.stats: collections.Counter = collections.Counter()
        self.placements = ""

    def disk(self) -> contextlib.ExitStack:
        """How the disk behaves while the child writes: writeback held, syncs late."""
        stack = contextlib.ExitStack()
        stack.enter_context(held_writeback(self.hold_writeback))
        stack.enter_context(slow_syncs(self.sync_delay))
        return stack

    def trace(self) -> list[str]:
        """The calls of an uninterrupted write (in a child, as the cuts will run it)."""
        staging, out, user = self.scn.install(self.root)
        names_file = self.mnt / "trace.txt"

        def child():
            _store, blobs = self.scn.stage(staging)
            with self.disk(), CallHook(None, die) as hook:
                reports = self.scn.write(out, user, blobs)
            used = sorted({p.placement for r in reports for p in r.placements})
            names_file.write_text("+".join(used) + "\n" + "\n".join(hook.names))

        assert in_child(child) == 0
        self.placements, *names = names_file.read_text().split("\n")
        names_file.unlink()
        assert check_recovered(self.scn, staging, out, user, staged=self.staged,
                               new=self.new, where="uninterrupted") == "new"
        collect_dead_store(staging)
        return names

    def cut_at(self, at: int | None, where: str) -> str:
        """Cut the power before call ``at`` (None: right after the write returns); check."""
        self.cut_write_at(at, where)
        return self.check(where)

    def cut_write_at(self, at: int | None, where: str) -> None:
        """Stage and write in a child that cuts the power before call ``at``; remount."""
        staging, out, user = self.scn.install(self.root)
        syncfs(self.mnt)  # the old outputs and the user file are durable before the write

        def cut(*_):
            if self.foreign_commit:
                commit_journal(self.mnt)
            power_cut(self.mnt)
            die()

        def child():
            _store, blobs = self.scn.stage(staging)
            if self.sync_blobs:
                syncfs(self.mnt)
            with self.disk(), CallHook(at, cut):
                self.scn.write(out, user, blobs)
            cut()

        assert in_child(child) == 86, f"{where}: the child did not die at the cut"
        self.factory.remount(self.mnt)

    def cut_recovery_at(self, at: int, where: str) -> bool:
        """Run ``recover()`` in a child that cuts the power before its call ``at``.

        Returns False when recovery finished before making that many calls.
        """
        out = self.root / "out"

        def cut(*_):
            power_cut(self.mnt)
            die()

        def child():
            with CallHook(at, cut):
                recover(out)

        code = in_child(child)
        assert code in (0, 86), f"{where}: recovery failed in the child (exit {code})"
        if code == 86:
            self.factory.remount(self.mnt)
        return code == 86

    def check(self, where: str) -> str:
        """Recover in this process and check the invariants."""
        staging, out, user = self.root / "staging", self.root / "out", self.root / "user"
        state = journal_state(out) or "no journal"
        outcomes = recover(out)
        acts = ",".join(sorted({o.action for o in outcomes})) or "nothing"
        verdict = check_recovered(self.scn, staging, out, user, staged=self.staged,
                                  new=self.new, where=f"{where} (journal {state}, {acts})")
        assert recover(out) == [], f"{where}: recover is not idempotent"
        collect_dead_store(staging)
        self.stats[f"outputs {verdict}"] += 1
        self.stats[f"journal after the cut: {state}"] += 1
        return verdict


def _report(name: str, cuts: int, stats) -> None:
    print(f"\n{name}: {cuts} power cuts; lost: 0, torn: 0")
    for key, n in sorted(stats.items()):
        print(f"  {key}: {n}")


@pytest.mark.parametrize("layout", ["unaligned", "aligned"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_power_cut_at_every_step_loses_nothing(make_fs, fs_factory, config, layout):
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    cuts = PowerCuts(fs_factory, mnt, scenario(layout == "aligned"), sync_blobs=True)
    names = cuts.trace()
    # Every call on ext4, and on XFS aligned (its blobs are cloned); a rotating third elsewhere.
    calls = Calls(1, len(names), full=config == "ext4" or (config, layout) == ("xfs", "aligned"))
    for n in calls:
        cuts.cut_at(n, calls.where(f"{config}: cut before call {n} ({names[n - 1]})"))
    assert cuts.cut_at(None, f"{config}: cut after the write returned") == "new"
    _report(f"power cut at {calls.said} on {config}, {layout} ({cuts.placements})",
            len(calls) + 1, cuts.stats)
    assert cuts.stats["outputs old"] and cuts.stats["outputs new"]


@pytest.mark.parametrize("config", ["ext4", "xfs"])
def test_power_cut_with_large_inline_bytes_synced_and_journaled(make_fs, fs_factory,
                                                                monkeypatch, config):
    """An output's large inline bytes carry no digests: synced, then journaled as on disk.

    Forced here for the scenario's few bytes (the children inherit the
    setting). Another process's journal commit, then a power cut, before
    every call: the temp file's size can then be durable while its inline
    bytes are not, and a plan cut before its record has nothing to check
    them against: it must be rolled back, never finished with whatever the
    temp file holds.
    """
    from trtet_store.io import transaction

    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    # One output: with two, the other's inline bytes fail their digests at the
    # same cuts and hide whether this one's are checked at all.
    one = Scenario(blobs=[(21, 150_001), (22, 100_000)],
                   outputs={"m.pte": [["bytes", 1, 100], ["blob", 0], ["bytes", 2, 33],
                                      ["ext", "u.bin"], ["blob", 1]]},
                   old={"m.pte": (4, 1000)}, externals={"u.bin": (5, 30_000)},
                   store_chunk=16 * KiB, write_chunk=32 * KiB)
    cuts = PowerCuts(fs_factory, mnt, one, sync_blobs=True, foreign_commit=True)
    plain = cuts.trace()
    monkeypatch.setattr(transaction, "SYNC_INLINE_MIN", 1)
    names = cuts.trace()
    # The temp's fdatasync, then the journal line: one pwrite and one fsync
    # more (the moves' syncs, cuts and drops vary from run to run: one sync
    # covers every step copied since the last, one cut and one drop follow each).
    extra = collections.Counter(names)
    extra.subtract(plain)
    varying = ("fdatasync", "ftruncate", "fadvise")
    assert {k: v for k, v in extra.items() if v and k not in varying} == {
        "pwrite": 1, "fsync": 1}, (plain, names)
    calls = Calls(1, len(names), full=config == "ext4")
    for n in calls:
        cuts.cut_at(n, calls.where(f"{config}: commit, then cut before call {n} "
                                   f"({names[n - 1]})"))
    _report(f"journal commit, then power cut, at {calls.said} on {config}, large inline "
            f"bytes synced and journaled ({cuts.placements})", len(calls), cuts.stats)
    assert cuts.stats["outputs old"] and cuts.stats["outputs new"]


def commit_journal(mnt: Path) -> None:
    """Commit the filesystem's journal as another process's fsync would, at this instant.

    An fsync of an unrelated file commits ext4's running transaction, and
    forces XFS's log up to its last change, with every metadata change made
    before it (a truncation of a source, say), but writes back none of the
    write's own data pages. The kernel's periodic commit (5 s on ext4, XFS's
    log worker) can land at any instant the same way.
    """
    fd = os.open(mnt / "foreign", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x")
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("config", ["ext4", "xfs"])
def test_power_cut_after_a_foreign_journal_commit_loses_nothing(make_fs, fs_factory, config):
    # A move leaves each step's truncation of its source for the next step's
    # fdatasync to commit. If the source were truncated before its bytes
    # were durable in the temp file, a journal commit by anyone else at that
    # instant followed by a power cut would lose them: commit, then cut,
    # before every call of a write that moves every blob.
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    cuts = PowerCuts(fs_factory, mnt, scenario(False), sync_blobs=True, foreign_commit=True)
    names = cuts.trace()
    assert "move" in cuts.placements
    calls = Calls(1, len(names), full=config == "ext4")
    for n in calls:
        cuts.cut_at(n, calls.where(f"{config}: commit, then cut before call {n} "
                                   f"({names[n - 1]})"))
    _report(f"journal commit, then power cut, at {calls.said} on {config} "
            f"({cuts.placements})", len(calls), cuts.stats)
    assert cuts.stats["outputs old"] and cuts.stats["outputs new"]


@contextlib.contextmanager
def held_writeback(hold: bool):
    """While ``hold``, the write's ``sync_file_range`` calls start no writeback.

    A move starts writeback of each window as it writes it, so by the time
    a step is truncated its bytes are mostly on the disk whatever the order
    of the calls; without it they stay dirty until the step's own
    ``fdatasync``, as on a disk slower than the copy, and a truncation
    committed before that sync loses them at a power cut every time.
    """
    real = fs.calls.sync_file_range
    if hold:
        fs.calls.sync_file_range = lambda *args: None
    try:
        yield
    finally:
        fs.calls.sync_file_range = real


@pytest.mark.parametrize("config", ["ext4", "xfs"])
def test_power_cut_when_one_sync_covers_several_steps_loses_nothing(make_fs, fs_factory, config):
    # Syncs 5 ms late, writeback held, and another process's journal commit
    # before a power cut at every call: one sync covers the steps copied
    # while the one before it ran, and the source is cut past all of them.
    # A cut past a step copied after its sync began (still only in the page
    # cache) would be committed and the power cut would lose the step.
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    scn = scenario(False)
    cuts = PowerCuts(fs_factory, mnt, scn, sync_blobs=True, foreign_commit=True,
                     hold_writeback=True, sync_delay=0.005)
    names = cuts.trace()
    step = transfer.move_step(scn.write_chunk, scn.store_chunk)
    steps = sum(-(-size // step) for _, size in scn.blobs)
    assert 3 <= len(_move_steps(names)) < steps, (len(_move_steps(names)), steps)
    calls = Calls(1, len(names), full=config == "ext4")
    for n in calls:
        cuts.cut_at(n, calls.where(f"{config}: slow syncs, writeback held, commit, then cut "
                                   f"before call {n} ({names[n - 1]})"))
    _report(f"slow syncs (several steps each), writeback held, journal commit, then power cut, "
            f"at {calls.said} on {config}", len(calls), cuts.stats)
    assert cuts.stats["outputs old"] and cuts.stats["outputs new"]


@pytest.mark.parametrize("config", ["ext4", "xfs"])
def test_power_cut_after_a_foreign_commit_with_writeback_held_loses_nothing(make_fs, fs_factory,
                                                                            config):
    # The move copies step k+1 while a second thread syncs step k and then
    # truncates its source. Commit, then cut, before every call of a write
    # whose moved bytes stay dirty until their step's fdatasync: a
    # truncation that does not wait for its own step's sync (or that waits
    # for the sync of another step) is committed while the bytes it cut are
    # only in the page cache, and the power cut loses them.
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    cuts = PowerCuts(fs_factory, mnt, scenario(False), sync_blobs=True, foreign_commit=True,
                     hold_writeback=True)
    names = cuts.trace()
    assert "move" in cuts.placements
    assert len(_move_steps(names)) > 5  # many steps, cut in many calls
    calls = Calls(1, len(names), full=config == "ext4")
    for n in calls:
        cuts.cut_at(n, calls.where(f"{config}: writeback held, commit, then cut before call {n} "
                                   f"({names[n - 1]})"))
    _report(f"writeback held, journal commit, then power cut, at {calls.said} on {config}",
            len(calls), cuts.stats)
    assert cuts.stats["outputs old"] and cuts.stats["outputs new"]


def _move_steps(names: list[str]) -> list[int]:
    """Call numbers of the moves' source truncations.

    A move's sync thread syncs and then cuts its source while the caller
    copies the next steps, so the caller's calls can come between the two:
    a cut is an ``ftruncate`` with an ``fdatasync`` since the last
    ``ftruncate`` or ``open`` (a temp file is sized right after it is opened).
    """
    steps, synced = [], False
    for i, name in enumerate(names, 1):
        if name == "fdatasync":
            synced = True
        elif name in ("open", "ftruncate"):
            if name == "ftruncate" and synced:
                steps.append(i)
            synced = False
    return steps


@pytest.mark.parametrize("layout", ["unaligned", "aligned"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_power_cut_loses_no_blob_that_was_never_synced(make_fs, fs_factory, config, layout):
    # A fresh build: the blobs are only in the page cache when the write
    # starts. Once a write has truncated a source (move), renamed it (insert)
    # or shared its blocks (clone), its bytes must already be durable, or a
    # power cut takes them with it. Every third call here; every call in the
    # long variant.
    _unsynced_blobs(make_fs, fs_factory, config, layout, stride=3)


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("layout", ["unaligned", "aligned"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_power_cut_loses_no_blob_that_was_never_synced_at_any_call(make_fs, fs_factory, config,
                                                                   layout):
    _unsynced_blobs(make_fs, fs_factory, config, layout, stride=1)


def _unsynced_blobs(make_fs, fs_factory, config: str, layout: str, stride: int) -> None:
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    cuts = PowerCuts(fs_factory, mnt, scenario(layout == "aligned"), sync_blobs=False)
    names = cuts.trace()
    # From the first call that changes a source (a move's truncation, an
    # insert's rename or a clone) to the end of the write.
    first = min(i for i, n in enumerate(names, 1) if n in ("ftruncate", "rename", "clone_range")
                and i > names.index("fsync"))
    for n in range(first, len(names) + 1, stride):
        cuts.cut_at(n, f"{config}, {layout}: unsynced blobs, cut before call {n} "
                       f"({names[n - 1]})")
    _report(f"power cut after the first change to an unsynced blob on {config}, {layout}",
            len(range(first, len(names) + 1, stride)), cuts.stats)


@pytest.mark.parametrize("config", ["ext4", "xfs"])
def test_power_cut_during_recovery_loses_nothing(make_fs, fs_factory, config):
    # A first cut in the write, then a second one at each call of the
    # recovery that follows; a third recovery must still end it right.
    fstype, options = CONFIGS[config]
    mnt = make_fs(fstype, 300, mount_options=options)
    cuts = PowerCuts(fs_factory, mnt, scenario(), sync_blobs=True)
    names = cuts.trace()
    steps = _move_steps(names)
    first_cuts = {
        "early in the moves": steps[2] + 1,
        "after the last move step": steps[-1] + 1,
        "after the first rename": names.index("rename") + 2,
    }
    total = 0
    for label, at_write in first_cuts.items():
        # The recovery's calls: every one on ext4, a rotating third on XFS (until the
        # recovery ends before the call chosen: then it ran uncut to its end, and was checked).
        calls = Calls(1, 999, full=config == "ext4", say=False)
        for m in calls:
            where = calls.where(f"{config}: cut {label} (call {at_write}), then in recovery "
                                f"at call {m}")
            cuts.cut_write_at(at_write, where)
            cut_happened = cuts.cut_recovery_at(m, where)
            cuts.check(where)
            total += 1
            if not cut_happened:
                break
    said = Calls(1, 1, full=config == "ext4", say=False).said
    _report(f"power cut during recovery (at {said} of each recovery) on {config}", total,
            cuts.stats)


def test_three_consecutive_offsets_cut_every_call(monkeypatch, capsys):
    """The rotated stride leaves no call uncut over three runs, and says how to replay it."""
    monkeypatch.setattr("test_crash_powercut.LONG", False)
    cut: list[int] = []
    for offset in range(STRIDE):
        monkeypatch.setattr("test_crash_powercut.CUT_OFFSET", offset)
        calls = Calls(4, 200, full=False)
        assert len(calls) <= -(-197 // STRIDE)
        cut += calls
        assert f"TRTET_CUT_OFFSET={offset}" in calls.where("xfs: cut before call 7")
    assert sorted(cut) == list(range(4, 201))
    assert list(Calls(4, 200, full=True)) == list(range(4, 201))
    monkeypatch.setattr("test_crash_powercut.LONG", True)
    assert list(Calls(4, 200, full=False)) == list(range(4, 201))
    assert "TRTET_CUT_OFFSET=2;" in capsys.readouterr().out
