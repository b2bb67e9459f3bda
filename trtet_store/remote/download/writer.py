"""One thread writes a fetch's downloaded ranges; the GET threads only download.

Four GET threads each doing their own buffered ``pwrite`` into one staged file
contend for the file's lock and for write-back throttling: on XFS the fetch
ran 1-5% slower than boto3's ``download_file``, which hands every chunk to a
single writer thread (s3transfer's IO queue). Here too one thread takes each
verified range, writes it into its run's staged file and journals it, while
the GET threads fill the next buffers.

Buffers come from a fixed pool, so memory stays bounded by the pool, and a
disk slower than the link holds the GETs back (no buffer is free until its
range is written) instead of queueing ranges in memory.

A range longer than a piece is handed over piece by piece as its bytes
arrive and check (:mod:`.ranges`): each piece is written and journaled in
the order it was queued, the range's own line after its last piece, and its
buffer goes back to the pool only after the last item that uses it.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from trtet_store.remote.download.plan import Range, Run
from trtet_store.remote.download.staging import Staging

#: Seconds between checks of the stop flag while waiting for a free buffer.
_POLL = 0.1


@dataclass(frozen=True)
class _Item:
    """One queued write: ``buf[at:at + rng.size]`` at ``rng`` (None: only give ``buf`` back)."""

    run: Run | None
    rng: Range | None
    buf: bytearray
    crc: int
    at: int
    then: tuple[Range, int] | None
    last: bool


class RangeWriter:
    """A pool of range buffers and the thread that writes filled ones; see the module docstring.

    Parameters
    ----------
    stage : Staging
        Where ranges are written and journaled.
    buffers : int
        Buffers in the pool (GETs in flight plus ranges waiting to be written).
    size : int
        Bytes per buffer (the fetch's range size).
    stop : threading.Event
        Set by the writer when a write fails, so the GET threads stop early.
    """

    def __init__(self, stage: Staging, buffers: int, size: int, stop: threading.Event) -> None:
        self._stage = stage
        self._size = size
        self._stop = stop
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(buffers):
            self._free.put(bytearray(size))
        self._todo: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="trtet-fetch-writer",
                                        daemon=True)
        self._thread.start()

    def buffer(self, size: int) -> bytearray | None:
        """A buffer of at least ``size`` bytes, waiting for one; None once the fetch stops."""
        while not self._stop.is_set():
            try:
                buf = self._free.get(timeout=_POLL)
            except queue.Empty:
                continue
            if size <= len(buf):
                return buf
            # A range longer than the range size (one chunk bigger than it): its own buffer.
            self._free.put(buf)
            return bytearray(size)
        return None

    def give_back(self, buf: bytearray) -> None:
        """Return a buffer whose range will not be written (a failed or stopped GET)."""
        if len(buf) == self._size:
            self._free.put(buf)

    def submit(self, run: Run, rng: Range, buf: bytearray, crc: int, *, at: int = 0,
               then: tuple[Range, int] | None = None, last: bool = True) -> None:
        """Queue verified bytes for writing: ``buf[at:at + rng.size]`` at ``rng``, journaled.

        ``then``: one more ``(range, crc)`` journaled after it (a range's own
        line after its last piece). ``last``: the buffer goes back to the pool
        once this is written (False for a range's earlier pieces).
        """
        self._todo.put(_Item(run, rng, buf, crc, at, then, last))

    def release(self, buf: bytearray) -> None:
        """Give ``buf`` back once the pieces of it queued before are written."""
        self._todo.put(_Item(None, None, buf, 0, 0, None, True))

    def _loop(self) -> None:
        while (item := self._todo.get()) is not None:
            try:
                if self.error is None and item.rng is not None:
                    with memoryview(item.buf) as view:
                        self._stage.write(item.run, item.rng,
                                          view[item.at:item.at + item.rng.size])
                    self._stage.record(item.rng, item.crc)
                    if item.then is not None:
                        self._stage.record(*item.then)
            except BaseException as exc:  # noqa: BLE001 - raised by close() in the fetch's thread
                self.error = exc
                self._stop.set()
            finally:
                if item.last:
                    self.give_back(item.buf)

    def close(self) -> None:
        """Write what is queued, stop the thread, and raise the first write's failure."""
        self._todo.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error
