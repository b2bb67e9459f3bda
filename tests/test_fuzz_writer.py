"""Hypothesis stateful fuzzing of the move-or-copy writer on real ext4, XFS and tmpfs.

A :class:`WriterMachine` keeps a model (each live blob's bytes, each
destination's bytes, each user file's bytes) and drives the real engine on a
real filesystem with random steps:

- stage blobs of random sizes (around chunk boundaries too) in stores with
  random digest chunk sizes; create user files (``ExternalFile``);
- write one or two outputs from random piece lists (inline bytes, zero
  padding, blobs, user files, a blob twice), random chunk sizes, consume or
  not, optionally with a fault injected at a random system call: an EIO, a
  short write or ENOSPC (in this process: the writer rolls back), or a crash
  (in a forked child that dies at that call; then ``recover()``);
- release blobs, and run ``recover()`` when there is nothing to do.

After every step: every live blob's file has its bytes; every destination
holds its old content or the new one, both outputs agreeing (the model then
follows); no temp, journal, lock or pin file is anywhere; the staging
directory holds exactly the live blobs and the store's lock.

Default run: a bounded profile per configuration (about a minute in all);
``TRTET_LONG=1``: 2,500 examples per configuration, 10,000 in all.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import crash_scenario
import pytest
from crash_dying import CallHook, die, in_child
from faults import FaultInjector
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trtet_store import BlobStore, ExternalFile, recover, write_files
from trtet_store.io.units import KiB

# (fstype of the output, fstype of the staging directory or None for the same)
CONFIGS = {
    "ext4": ("ext4", None),
    "xfs": ("xfs", None),
    "tmpfs": ("tmpfs", None),
    "tmpfs-staging-ext4-out": ("ext4", "tmpfs"),
}
SIZES = {"ext4": 200, "xfs": 300, "tmpfs": 200}
DEFAULT_EXAMPLES = {"ext4": 100, "xfs": 80, "tmpfs": 150, "tmpfs-staging-ext4-out": 60}
LONG_EXAMPLES = 2500
DESTS = ("a.pte", "b.ptd", "c.bin")

blob_sizes = st.one_of(
    st.integers(0, 200_000),
    st.sampled_from([1, 4095, 4096, 4097, 16 * KiB - 1, 16 * KiB, 64 * KiB + 1, 128 * KiB]),
)
chunk_sizes = st.one_of(st.sampled_from([4 * KiB, 16 * KiB, 64 * KiB, 1 << 20]),
                        st.integers(1000, 300_000))


class WriterMachine(RuleBasedStateMachine):
    """One example: a fresh directory tree on the filesystems under test."""

    out_root: Path  # set per configuration
    staging_root: Path
    examples = 0
    faults_fired: dict[str, int]
    outcomes: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        n = type(self).examples
        self.out = self.out_root / f"ex{n}" / "out"
        self.user = self.out_root / f"ex{n}" / "user"
        self.staging = self.staging_root / f"ex{n}-staging"
        for d in (self.out, self.user, self.staging):
            d.mkdir(parents=True)
        self.stores: list[BlobStore] = []
        # Every blob ever staged, in order, with its bytes: a consumed or
        # released one stays as None. Steps draw a slot of this list, never of
        # the live blobs: which blobs a write consumes depends on the
        # placement and on where a crash lands, which Hypothesis cannot
        # replay, and a draw that depends on it makes a failing example
        # unreplayable (FlakyStrategyDefinition in CI).
        self.slots: list[tuple[object, bytes] | None] = []
        self.dests: dict[str, bytes | None] = dict.fromkeys(DESTS)
        self.externals: dict[str, bytes] = {}
        self.seed = 0

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        shutil.rmtree(self.out.parent, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)

    # -- staging ---------------------------------------------------------------------

    @initialize(chunk=st.sampled_from([4 * KiB, 16 * KiB, 64 * KiB]))
    def open_store(self, chunk):
        self.stores.append(BlobStore(self.staging, chunk_size=chunk))

    @rule(size=blob_sizes, store=st.integers(0, 1))
    def create_blob(self, size, store):
        if store >= len(self.stores):
            self.stores.append(BlobStore(self.staging, chunk_size=16 * KiB))
            store = len(self.stores) - 1
        self.seed += 1
        data = crash_scenario.content(self.seed, size)
        self.slots.append((self.stores[store].put(data), data))

    @rule(size=st.integers(1, 100_000))
    def create_user_file(self, size):
        self.seed += 1
        name = f"u{len(self.externals)}.bin"
        data = crash_scenario.content(10_000 + self.seed, size)
        (self.user / name).write_bytes(data)
        self.externals[name] = data

    @property
    def blobs(self) -> list[tuple[object, bytes]]:
        """(Blob, bytes) of the live blobs."""
        return [slot for slot in self.slots if slot is not None]

    @precondition(lambda self: self.slots)
    @rule(data=st.data())
    def release_blob(self, data):
        i = data.draw(st.integers(0, len(self.slots) - 1))
        if self.slots[i] is None:
            self._count("release of a blob already gone")
            return
        blob, _ = self.slots[i]
        self.slots[i] = None
        blob.close()

    # -- writing ---------------------------------------------------------------------

    def _pieces(self, data, n_outputs: int):
        """Random piece lists (and their expected bytes) for ``n_outputs`` outputs."""
        items = []
        for _ in range(n_outputs):
            pieces, expect = [], []
            for _ in range(data.draw(st.integers(0, 6))):
                kind = data.draw(st.sampled_from(["bytes", "zeros", "blob", "blob", "ext"]))
                if kind == "bytes":
                    b = data.draw(st.binary(max_size=5000))
                    pieces.append(b)
                    expect.append(b)
                elif kind == "zeros":
                    n = data.draw(st.integers(1, 9000))
                    pieces.append(b"\0" * n)
                    expect.append(b"\0" * n)
                elif kind == "blob" and self.slots:
                    slot = self.slots[data.draw(st.integers(0, len(self.slots) - 1))]
                    if slot is not None:
                        pieces.append(slot[0])
                        expect.append(slot[1])
                elif kind == "ext" and self.externals:
                    name = data.draw(st.sampled_from(sorted(self.externals)))
                    pieces.append(ExternalFile.of(self.user / name))
                    expect.append(self.externals[name])
            items.append((pieces, b"".join(expect)))
        return items

    @rule(data=st.data(), chunk=chunk_sizes, consume=st.booleans(),
          fault=st.sampled_from(["none", "none", "eio", "short", "enospc", "crash", "crash"]),
          at=st.one_of(st.integers(1, 50), st.integers(1, 400)))
    def write(self, data, chunk, consume, fault, at):
        n_outputs = data.draw(st.integers(1, 2))
        names = data.draw(st.permutations(DESTS))[:n_outputs]
        items = self._pieces(data, n_outputs)
        outputs = [(self.out / name, pieces) for name, (pieces, _) in zip(names, items,
                                                                           strict=True)]
        new = {name: expect for name, (_, expect) in zip(names, items, strict=True)}
        old = {name: self.dests[name] for name in names}
        used = [p for _, pieces in outputs for p in pieces if p in [b for b, _ in self.blobs]]
        # Blobs a successful write may consume (move, insert, a consuming
        # clone): consume=True and used once. Whether it does depends on the
        # placement it gets (a copy, or a clone that fell back to a copy,
        # leaves the source), so only "may" is checked.
        consumable = {id(b) for b in used if consume and b.size > 0
                      and sum(1 for u in used if u is b) == 1}

        raised = None
        if fault == "crash":
            def child():
                with CallHook(at, die):
                    write_files(outputs, consume=consume, chunk_size=chunk)

            code = in_child(child)
            assert code in (0, 86), f"the writing child failed (exit {code})"
            recover(self.out)
            self._count("crash fired" if code == 86 else "crash after the end")
        elif fault == "none":
            write_files(outputs, consume=consume, chunk_size=chunk)
            self._count("no fault")
        else:
            with FaultInjector(fail_at=at, mode=fault) as inj:
                try:
                    write_files(outputs, consume=consume, chunk_size=chunk)
                except OSError as exc:
                    raised = exc
            self._count(f"{fault} fired" if inj.fired else f"{fault} after the end")
            if raised is not None:
                recover(self.out)  # only cleanup is left if it failed after the commit point

        # Which happened: the new files (all of them) or none.
        got = {name: self._read(name) for name in names}
        if all(got[n] == new[n] for n in names):
            outcome = "new"
        elif all(got[n] == old[n] for n in names):
            outcome = "old"
        else:
            raise AssertionError(f"fault {fault} at call {at}: outputs neither all old nor "
                                 f"all new: { {n: len(g or b'') for n, g in got.items()} }")
        if fault == "none":
            assert outcome == "new"
        self._count(f"outputs {outcome}")
        if outcome == "new":
            self.dests.update(new)
            for i, slot in enumerate(self.slots):
                if slot is None or os.path.exists(slot[0].path):
                    continue  # the invariants check a live blob's bytes
                blob = slot[0]
                assert id(blob) in consumable, f"{blob} is gone, but could not be consumed"
                self._count("blobs consumed")
                blob.close()
                self.slots[i] = None

    @rule()
    def recover_with_nothing_to_do(self):
        assert recover(self.out) == []

    def _read(self, name: str) -> bytes | None:
        path = self.out / name
        return path.read_bytes() if path.exists() else None

    def _count(self, key: str) -> None:
        type(self).outcomes[key] = type(self).outcomes.get(key, 0) + 1

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def every_blob_is_reconstructible(self):
        for blob, content in self.blobs:
            assert Path(blob.path).read_bytes() == content, f"{blob} lost bytes"

    @invariant()
    def every_destination_is_old_or_new_and_nothing_stray(self):
        for name, content in self.dests.items():
            assert self._read(name) == content, name
        assert sorted(p.name for p in self.out.iterdir()) == sorted(
            n for n, c in self.dests.items() if c is not None)
        assert sorted(p.name for p in self.user.iterdir()) == sorted(self.externals)
        for name, content in self.externals.items():
            assert (self.user / name).read_bytes() == content
        expected = {os.path.basename(b.path) for b, _ in self.blobs}
        expected |= {name + ".meta" for name in expected}  # each blob's metadata sidecar
        expected |= {f".store-{s.token}.lock" for s in self.stores}
        assert {p.name for p in self.staging.iterdir()} == expected


def _run(make_fs, config: str, examples: int, *, derandomize: bool,
         check_coverage: bool = True):
    out_type, staging_type = CONFIGS[config]
    out_root = make_fs(out_type, SIZES[out_type])
    staging_root = make_fs(staging_type, SIZES[staging_type]) if staging_type else out_root
    machine = type(f"WriterMachine_{config.replace('-', '_')}", (WriterMachine,), {
        "out_root": out_root, "staging_root": staging_root, "examples": 0,
        "outcomes": {},
    })
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=20, deadline=None, derandomize=derandomize,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True))
    print(f"\nfuzz {config}: {machine.examples} examples; "
          + ", ".join(f"{k}: {v}" for k, v in sorted(machine.outcomes.items())))
    if not check_coverage:
        return
    assert machine.outcomes.get("crash fired", 0) > 0
    assert any(machine.outcomes.get(f"{m} fired", 0) for m in ("eio", "short", "enospc"))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fuzz_writer(make_fs, config):
    # The same examples every run, so that the faults and crashes _run checks
    # for are sure to fire: random runs of 60 once drew only two crash
    # writes, neither firing.
    _run(make_fs, config, DEFAULT_EXAMPLES[config], derandomize=True)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fuzz_writer_random(make_fs, config, random_budget):
    # New examples every run (this one found a lock leak the fixed ones miss);
    # which faults they fire is luck, so only the invariants are checked. The
    # budget is the Hypothesis profile's (conftest.py): 25 a configuration on
    # every run, 2,500 under TRTET_LONG=1; the fixed examples above are the
    # ones that must fire the faults.
    print(f"\nfuzz {config}: random budget {random_budget} examples")
    _run(make_fs, config, random_budget, derandomize=False, check_coverage=False)


@pytest.mark.slow
@pytest.mark.timeout(8 * 3600)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_fuzz_writer_long(make_fs, config):
    _run(make_fs, config, LONG_EXAMPLES, derandomize=False)

