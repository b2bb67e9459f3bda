"""remote/download/writer.py: RangeWriter's promises (buffer, give_back, submit, close).

The contract (the module's docstring): buffers come from a fixed pool, so memory stays
bounded by it and a disk slower than the link holds the GETs back (``buffer()`` waits
until one is given back, and returns None once the fetch stops); a range longer than
the range size gets a buffer of its own that never joins the pool; one thread writes
each verified range and only then journals it (``Staging.write`` before
``Staging.record``: the journal never names bytes that are not on disk); a write that
fails (no space, on a real 2 MiB tmpfs) stops the GETs (the stop event), nothing
after it is written or journaled, and ``close()`` raises it.

The stage here is a small stand-in with Staging's two calls, writing with ``os.pwrite``
into a real file on a real filesystem (no os call is replaced).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from trtet_store.io.units import MiB
from trtet_store.remote.download.plan import Range, Run
from trtet_store.remote.download.writer import RangeWriter


class FileStage:
    """Staging's write/record over one real file: ``journal`` lists what was recorded."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.journal: list[tuple[int, int]] = []
        self.written: list[tuple[int, int]] = []

    def write(self, run: Run, rng: Range, data: memoryview) -> None:
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], rng.offset + done)
        os.fsync(self.fd)
        self.written.append((rng.offset, rng.size))

    def record(self, rng: Range, crc: int) -> None:
        self.journal.append((rng.offset, rng.size))


def _ranges(n: int, size: int) -> tuple[Run, list[Range]]:
    run = Run(0, 0, n * size)
    run.ranges = [Range(0, 0, i * size, size) for i in range(n)]
    return run, run.ranges


def test_the_pool_bounds_memory_a_full_size_range_waits_for_a_free_buffer() -> None:
    stop = threading.Event()
    writer = RangeWriter(None, 2, MiB, stop)  # type: ignore[arg-type] - buffer() only
    try:
        a, b = writer.buffer(MiB), writer.buffer(MiB)
        assert a is not None and b is not None and a is not b
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(writer.buffer(MiB)))
        t.start()
        time.sleep(0.4)
        assert got == []  # no third buffer while both are out: the GET waits
        writer.give_back(a)
        t.join(2)
        assert got and got[0] is a  # the same buffer again, not a new one
        # A range of exactly the range size never gets a buffer of its own.
        writer.give_back(got[0])  # type: ignore[arg-type]
        assert writer.buffer(MiB) is a
        writer.give_back(b)
        assert writer.buffer(MiB - 1) is b  # a smaller range uses a pool buffer too
    finally:
        stop.set()
        writer.close()


def test_buffer_returns_none_once_the_fetch_stops_while_waiting() -> None:
    stop = threading.Event()
    writer = RangeWriter(None, 1, MiB, stop)  # type: ignore[arg-type]
    try:
        assert writer.buffer(MiB) is not None
        threading.Timer(0.3, stop.set).start()
        start = time.monotonic()
        assert writer.buffer(MiB) is None
        assert 0.25 < time.monotonic() - start < 2
    finally:
        writer.close()


def test_a_range_longer_than_the_range_size_gets_its_own_buffer_that_never_joins_the_pool(
) -> None:
    stop = threading.Event()
    writer = RangeWriter(None, 1, MiB, stop)  # type: ignore[arg-type]
    try:
        big = writer.buffer(MiB + 4096)
        assert big is not None and len(big) == MiB + 4096
        pooled = writer.buffer(MiB)  # the pool's one buffer is still free
        assert pooled is not None and len(pooled) == MiB
        writer.give_back(big)  # not the pool's size: dropped, not pooled
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(writer.buffer(MiB)))
        t.start()
        time.sleep(0.3)
        assert got == []  # the big buffer did not become a pool buffer
        stop.set()
        t.join(2)
        assert got == [None]
    finally:
        stop.set()
        writer.close()


def test_each_range_is_written_then_journaled_in_order(tmp_path: Path) -> None:
    stage = FileStage(tmp_path / "staged")
    stop = threading.Event()
    writer = RangeWriter(stage, 3, MiB, stop)  # type: ignore[arg-type]
    run, ranges = _ranges(3, MiB)
    for i, rng in enumerate(ranges):
        buf = writer.buffer(MiB)
        assert buf is not None
        buf[:] = bytes([i + 1]) * MiB
        writer.submit(run, rng, buf, i)
    writer.close()
    assert stage.journal == stage.written == [(r.offset, r.size) for r in ranges]
    data = Path(tmp_path / "staged").read_bytes()
    assert data == b"".join(bytes([i + 1]) * MiB for i in range(3))


def test_a_write_that_runs_out_of_space_stops_the_fetch_journals_nothing_unwritten(
        make_fs) -> None:
    mnt = make_fs("tmpfs", 2)
    stage = FileStage(mnt / "staged")
    stop = threading.Event()
    writer = RangeWriter(stage, 4, MiB, stop)  # type: ignore[arg-type]
    run, ranges = _ranges(3, MiB)  # 3 MiB onto a 2 MiB filesystem
    # Then a write that would fit (over bytes already there): queued after the failing
    # one, it must not be written either (nothing after a failed write is).
    ranges.append(Range(0, 0, 0, MiB))
    for i, rng in enumerate(ranges):
        buf = writer.buffer(MiB)
        if buf is None:  # the writer already stopped the fetch
            break
        buf[:] = bytes([i + 1]) * MiB
        writer.submit(run, rng, buf, i)
    deadline = time.monotonic() + 5
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.is_set()  # the GET threads are told to stop
    assert writer.buffer(MiB) is None  # and get no buffer from now on
    with pytest.raises(OSError) as err:
        writer.close()
    assert err.value.errno == errno.ENOSPC
    # The journal names only ranges whose bytes were written whole, in order, and
    # nothing after the failed one was written.
    assert stage.journal == stage.written
    assert len(stage.written) < 4
    assert stage.written == [(r.offset, r.size) for r in ranges[:len(stage.written)]]
    assert (0, MiB) not in stage.written[1:]
    with open(mnt / "staged", "rb") as f:
        assert f.read(MiB) == bytes([1]) * MiB  # the first range's bytes, not the late one's
    os.close(stage.fd)
