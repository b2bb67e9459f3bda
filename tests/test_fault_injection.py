"""Faults inside the blob writer, adoption and recovery's own I/O (issue 12: the fs.calls seam).

An EIO or ENOSPC is injected at every system call, one run per call: each
run either succeeds or raises, and loses nothing (sources and staged bytes
by digest, outputs old or new, no stray file once recovery has run cleanly).
"""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

import pytest
from digests import digest, file_digest
from faults import FaultInjector, count_calls

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import fs
from trtet_store.io.units import KiB, MiB

COUNTS: dict[str, int] = {}


def _stage(store: BlobStore, data: bytes) -> object:
    with store.writer(metadata={"fingerprint": "fp"}) as w:
        for i in range(0, len(data), 100 * KiB):
            w.write(data[i:i + 100 * KiB])
    return w.blob


@pytest.mark.parametrize("mode", ["eio", "enospc"])
def test_fault_at_every_call_of_the_blob_writer(here_fs, mode):
    data = os.urandom(3 * MiB + 17)
    staging = here_fs / "s"
    with BlobStore(staging, chunk_size=64 * KiB) as store:
        total = count_calls(lambda: _stage(store, data).close())
        assert total > 10
        for n in range(1, total + 1):
            before = sorted(p.name for p in staging.iterdir())
            with FaultInjector(fail_at=n, mode=mode) as inj:
                try:
                    blob = _stage(store, data)
                except OSError:
                    blob = None
            assert inj.fired, f"call {n} never happened"
            if blob is not None:
                # a fault the writer may survive (e.g. drop-behind advice): bytes intact
                assert file_digest(blob.path) == digest(data) == blob.digest
                blob.close()
            assert sorted(p.name for p in staging.iterdir()) == before, f"call {n} {inj.fired}"
        COUNTS[f"writer-{mode}"] = total


@pytest.mark.parametrize("mode", ["eio", "enospc"])
def test_fault_at_every_call_of_adopt(here_fs, mode):
    src = here_fs / "user.bin"
    data = os.urandom(MiB)
    with BlobStore(here_fs / "s") as store:
        src.write_bytes(data)
        total = count_calls(lambda: store.adopt(src).close())
        assert src.read_bytes() == data  # given back on close
        for n in range(1, total + 1):
            with FaultInjector(fail_at=n, mode=mode) as inj:
                try:
                    blob = store.adopt(src)
                except OSError:
                    blob = None
            assert inj.fired
            if blob is not None:
                assert file_digest(blob.path) == digest(data)
                blob.close()
            assert file_digest(src) == digest(data), f"call {n} ({inj.fired})"
            assert [p.name for p in (here_fs / "s").iterdir()
                    if not p.name.startswith(".store-")] == []
        COUNTS[f"adopt-{mode}"] = total


def _crash_mid_move(root: Path) -> tuple[bytes, Path, Path]:
    """A child stages a blob, starts moving it into out/m.pte and is SIGKILLed mid-move.

    The child is forked from this process rather than started as a fresh interpreter:
    recovery's fault matrix prepares one crash per call, and an interpreter's start-up
    was most of its time. It is still another process that dies by SIGKILL mid-move,
    its locks and open files going with it.
    """
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "m.pte").write_bytes(b"old")
    data = os.urandom(MiB)
    said, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(said)
            store = BlobStore(root / "s", chunk_size=64 << 10)
            blob = store.put(data)
            os.write(tell, os.fsencode(blob.path) + b"\n")
            real, n = fs.calls.ftruncate, [0]

            def die(fd: int, size: int) -> None:
                real(fd, size)
                if os.fstat(fd).st_size == size and size % (64 << 10) == 0 and size < MiB:
                    n[0] += 1
                    if n[0] == 3:
                        os.kill(os.getpid(), signal.SIGKILL)

            fs.calls.ftruncate = die
            write_file(out / "m.pte", [b"h" * 100, blob], consume=True,
                       chunk_size=64 << 10, placements=["move"])
        finally:
            os._exit(1)
    os.close(tell)
    with os.fdopen(said, "rb") as pipe:
        told = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    source = Path(os.fsdecode(told.strip()))
    assert 0 < source.stat().st_size < MiB  # the move had started
    return data, out, source


@pytest.mark.parametrize("direction", ["forward", "back"])
@pytest.mark.parametrize("mode", ["eio", "enospc"])
def test_fault_at_every_call_of_recovery(here_fs, direction, mode):
    def prepare(i: int) -> tuple[bytes, Path, Path]:
        data, out, source = _crash_mid_move(here_fs / f"r{i}")
        if direction == "back":
            # the header never reached the disk: recovery must give the bytes back
            temp = next(out.glob(".m.pte.trtet-*.tmp"))
            with open(temp, "r+b") as f:
                f.write(b"X")
        return data, out, source

    data, out, source = prepare(0)
    assert count_calls(lambda: recover(out)) > 5
    failures = 0
    # At every call, until a recovery ends before the call to fault: how many
    # calls a recovery makes varies a little (it resumes the move where the
    # crash left it, and one sync covers every step copied since the last).
    for n in itertools.count(1):
        data, out, source = prepare(n)
        with FaultInjector(fail_at=n, mode=mode) as inj:
            try:
                recover(out)
            except OSError:
                failures += 1
        ended = not inj.fired  # this recovery made fewer than n calls
        outcomes = recover(out)  # a clean run finishes whatever the faulted one left
        where = f"{direction} {mode} at call {n} ({inj.fired}); then {outcomes}"
        content = (out / "m.pte").read_bytes()
        if direction == "back":
            assert content == b"old", where
        assert content in (b"old", b"h" * 100 + data), where
        if content == b"old":
            assert file_digest(source) == digest(data), f"LOST: {where}"
        else:
            assert not source.exists(), where
        assert sorted(p.name for p in out.iterdir()) == ["m.pte"], where
        acts = recover(out)  # only orphans may be left to report
        assert all(o.action == "orphan" for o in acts), (where, acts)
        if ended:
            total = n - 1
            break
    COUNTS[f"recovery-{direction}-{mode}"] = total
    print(f"\nrecovery {direction} {mode}: {total} calls faulted, {failures} raised, lost 0")
