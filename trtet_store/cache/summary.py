"""The cache's summary: the used bytes and the last-use order, so that a put reads no other record.

The records in ``keys/`` are the truth; the summary is what the bound needs
from them (each key's blob, size and last use, the blobs' reference counts,
the used bytes), kept in memory by each process and in ``<cache>/summary``
(:data:`~trtet_store.cache.layout.SUMMARY`) on disk:

- **The file.** Line 1 is a snapshot (every key); each later line is one
  change (a key put, a key dropped), appended under the cache-wide lock.
  Every ``max(1024, 2 x entries)`` changes the file is compacted into one
  snapshot again (io's ``write_atomic``), so reading it stays linear in the
  entries and appending stays constant per change, amortized.
- **Who may trust it: the keys directory's mtime.** Each line carries a
  generation (one more than the line before) and the lines chain a CRC-32.
  After each change the summary records, it sets ``keys/``'s mtime to a
  *marker*: the generation as seconds since the epoch (so, in 1970) and the
  chain in the nanoseconds. Any other change of ``keys/`` (a record renamed
  in or unlinked by a process killed before it appended its line, or by a
  process of an older release that knows no summary, or by hand) makes the
  kernel set the mtime to the real time, which is never a 1970 marker. The
  process that takes the lock next finds a marker that is not the file's
  last one (one ``stat``) and rebuilds the summary from the records. A file
  rewritten with other numbers (a lying or stale summary) breaks the chain,
  so it is never trusted either. The check is exact on filesystems that
  keep nanoseconds (XFS, ext4, btrfs, tmpfs); where mtimes are coarser it
  always fails, and the cache rebuilds each time: slow, never wrong.
- **Last use, lazily.** A hit stamps its key's ``.use`` file and takes no
  lock (store.py), so the summary's use times are lower bounds. Eviction
  pops the least recent *known* use, ``stat``s that key's ``.use`` (one
  call), and evicts it only when the stamp is no newer; a newer stamp puts
  the key back in its new place. Since stamps only move forward, the key it
  evicts is the least recently used of all. Each re-placement answers a hit
  since the last look, so an eviction of k victims costs O(k log n) plus
  the hits it catches up on.
- **After a power cut** no line or marker is trusted: every write open runs
  recovery, which reads every record anyway, and :meth:`Summary.agree`
  rewrites the summary when it does not match them.

Nothing here knows what a key means, or how a record is laid out: the
store hands :class:`Summary` a scan of its records.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import random
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trtet_store.cache.layout import SUMMARY
from trtet_store.io import write_atomic

log = logging.getLogger("trtet_store.cache")

#: The summary file's format (its first line's ``"summary"``).
FORMAT = 1
#: Compaction: a snapshot once the appended lines exceed max(this, 2 x entries).
MIN_COMPACT = 1024
_NS = 10**9

#: One key as the summary knows it: (blob name, size, last use in ns).
Row = tuple[str, int, int]


class _Untrusted(Exception):
    """The summary on disk is missing, unreadable or not the one the marker names."""


class Summary:
    """What :meth:`~trtet_store.cache.evict.Evictor.make_room` needs, without reading every record.

    Every method runs under the cache-wide lock. :meth:`begin` is called when
    the lock is taken; the first query after it checks the file and the
    marker (two ``stat`` calls, plus the lines other processes appended).

    Parameters
    ----------
    directory : Path
        The cache directory (``keys/`` and ``tmp/`` in it).
    scan : callable
        ``() -> iterable of (key, blob, size, last_use_ns)``: every readable
        record, read from disk (the rebuild).
    """

    def __init__(self, directory: Path, scan: Callable[[], Iterable[tuple[str, str, int, int]]]
                 ) -> None:
        self.path = directory / SUMMARY
        self.keys = directory / "keys"
        self.tmp = directory / "tmp"
        self._scan = scan
        self._rows: dict[str, list] = {}        # key -> [blob, size, known last use]
        self._blobs: dict[str, list[int]] = {}  # blob -> [size, keys naming it]
        self._heap: list[tuple[int, str]] = []  # (known last use, key); stale items skipped
        self.used = 0
        self._gen = 0
        self._chain = 0
        self._ino = -1
        self._offset = 0
        self._lines = 0  # changes appended since the snapshot
        self._loaded = False  # the in-memory state is the file's (ino, offset, gen, chain)
        self._checked = False  # checked since the lock was taken
        #: How many times the summary was rebuilt from the records (tests count it).
        self.rebuilds = 0

    # -- trust --------------------------------------------------------------------------

    def begin(self) -> None:
        """The lock was just taken: others may have changed the records since we held it."""
        self._checked = False

    def _marker(self) -> int:
        return self._gen * _NS + self._chain % _NS

    def check(self) -> None:
        """Make the in-memory state the records' (under the lock): load, or rebuild."""
        if self._checked:
            return
        try:
            mark = os.stat(self.keys).st_mtime_ns
            st = os.stat(self.path)
            if not (self._loaded and st.st_ino == self._ino and st.st_size == self._offset):
                self._load(st)
            if mark != self._marker():
                raise _Untrusted(f"keys/ changed since its last line (mtime {mark} ns)")
        except (_Untrusted, OSError, ValueError) as exc:
            log.info("engine cache: rebuilding the summary from the records: %s", exc)
            self.rebuild()
        self._checked = True

    def _load(self, st: os.stat_result) -> None:
        """Read what the file adds to our state: its new lines, or all of it if replaced."""
        tail = self._loaded and st.st_ino == self._ino and st.st_size > self._offset
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            if os.fstat(f.fileno()).st_ino != st.st_ino:
                raise _Untrusted("replaced while read")
            if tail:
                f.seek(self._offset)
            else:
                self._loaded = False
            data = f.read()
        if not data.endswith(b"\n"):
            raise _Untrusted("a line cut short")
        for line in data.splitlines(keepends=True):
            try:
                change = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise _Untrusted("an unreadable line") from None
            if not self._loaded:
                if change.get("summary") != FORMAT:
                    raise _Untrusted(f"not a summary of format {FORMAT}")
                self._reset({k: tuple(v) for k, v in change["entries"].items()})
                self._gen, self._chain, self._lines = int(change["gen"]), 0, 0
                self._loaded, self._ino, self._offset = True, st.st_ino, 0
            else:
                if change.get("gen") != self._gen + 1:
                    raise _Untrusted(f"generation {change.get('gen')} after {self._gen}")
                self._gen += 1
                self._lines += 1
                if "put" in change:
                    key, blob, size, used = change["put"]
                    self._set(str(key), str(blob), int(size), int(used))
                else:
                    self._unset(str(change["drop"]))
            self._chain = zlib.crc32(line, self._chain)
            self._offset += len(line)

    def rebuild(self) -> None:
        """Read every record and write the summary anew (the records are the truth)."""
        self.rebuilds += 1
        self._reset({key: (blob, size, used) for key, blob, size, used in self._scan()})
        self._snapshot()
        self._checked = True

    def agree(self, rows: dict[str, Row]) -> None:
        """Recovery read every record (``rows``): keep the summary if it says the same, else reset.

        Only blob and size are compared; last uses are taken from ``rows``
        (they were just read), in memory only.
        """
        self._checked = False
        with contextlib.suppress(_Untrusted, OSError, ValueError):
            st = os.stat(self.path)
            self._load(st)
            if os.stat(self.keys).st_mtime_ns == self._marker() and \
                    {k: tuple(r[:2]) for k, r in self._rows.items()} == \
                    {k: tuple(r[:2]) for k, r in rows.items()}:
                self._reset(rows)
                self._checked = True
                return
        self.rebuilds += 1
        self._reset(rows)
        self._snapshot()
        self._checked = True

    # -- the state ------------------------------------------------------------------------

    def _reset(self, rows: dict[str, Row]) -> None:
        self._rows, self._blobs, self.used = {}, {}, 0
        for key, (blob, size, used) in rows.items():
            self._set(key, blob, int(size), int(used), push=False)
        self._heap = [(row[2], key) for key, row in self._rows.items()]
        heapq.heapify(self._heap)

    def _set(self, key: str, blob: str, size: int, used: int, *, push: bool = True) -> None:
        self._unset(key)
        self._rows[key] = [blob, size, used]
        ref = self._blobs.setdefault(blob, [size, 0])
        if ref[1] == 0:
            self.used += size
        ref[1] += 1
        if push:
            heapq.heappush(self._heap, (used, key))

    def _unset(self, key: str) -> None:
        row = self._rows.pop(key, None)
        if row is None:
            return
        ref = self._blobs[row[0]]
        ref[1] -= 1
        if ref[1] == 0:
            del self._blobs[row[0]]
            self.used -= ref[0]

    # -- queries (each checks first) -----------------------------------------------------

    def used_bytes(self) -> int:
        """The distinct blobs' sizes that records name."""
        self.check()
        return self.used

    def refs(self, blob: str) -> int:
        """How many keys' records name ``blob``."""
        self.check()
        ref = self._blobs.get(blob)
        return 0 if ref is None else ref[1]

    def row(self, key: str) -> Row | None:
        self.check()
        row = self._rows.get(key)
        return None if row is None else (row[0], row[1], row[2])

    def __len__(self) -> int:
        self.check()
        return len(self._rows)

    def least_recent(self, last_use: Callable[[str], int | None]) -> Iterator[str]:
        """Keys from the least recently used on, each once; ``last_use(key)`` reads its stamp.

        A key whose stamp is newer than the summary knew goes back in its new
        place (see the module doc). Keys yielded and not dropped meanwhile
        (pinned, excluded) are put back when the iteration ends.
        """
        self.check()
        given: list[str] = []
        seen: set[str] = set()
        try:
            while self._heap:
                used, key = heapq.heappop(self._heap)
                row = self._rows.get(key)
                if row is None or row[2] != used or key in seen:
                    continue  # a stale item: the key went, or was put or stamped since
                stamp = last_use(key)
                if stamp is not None and stamp > used:
                    row[2] = stamp
                    heapq.heappush(self._heap, (stamp, key))
                    continue
                seen.add(key)
                given.append(key)
                yield key
        finally:
            for key in given:
                row = self._rows.get(key)
                if row is not None:
                    heapq.heappush(self._heap, (row[2], key))
            if len(self._heap) > 2 * len(self._rows) + 64:
                self._heap = [(row[2], key) for key, row in self._rows.items()]
                heapq.heapify(self._heap)

    # -- changes (after the records changed on disk) ----------------------------------------

    def put(self, key: str, blob: str, size: int, last_use_ns: int) -> None:
        """``key``'s record now names ``blob`` (it is durable): record it."""
        self.check()
        self._set(key, blob, size, last_use_ns)
        self._append({"put": [key, blob, size, last_use_ns]})

    def drop(self, key: str) -> None:
        """``key``'s record is gone from disk: record it."""
        self.check()
        if key in self._rows:
            self._unset(key)
            self._append({"drop": key})

    def _append(self, change: dict) -> None:
        """One line, then the marker; a failure leaves the old marker: the next check rebuilds.

        With no file loaded (none yet: an empty cache's first put; or a failed
        write) the whole state is written as a snapshot instead, so the next
        check loads it rather than reading every record again.
        """
        if not self._loaded:
            self._snapshot(empty_too=True)
            return
        line = json.dumps({"gen": self._gen + 1, **change}, separators=(",", ":")).encode() \
            + b"\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_ino != self._ino or not self._loaded:
                    raise _Untrusted("the summary file was replaced")
                if os.write(fd, line) != len(line):
                    raise OSError("a short append")
            finally:
                os.close(fd)
            self._gen += 1
            self._chain = zlib.crc32(line, self._chain)
            self._offset += len(line)
            self._lines += 1
            self._mark()
            if self._lines > max(MIN_COMPACT, 2 * len(self._rows)):
                self._snapshot()
        except (_Untrusted, OSError) as exc:
            # The change is on disk and in memory; the file lags: the next check rebuilds.
            log.info("engine cache: could not append to the summary (%s): it will be rebuilt",
                     exc)
            self._loaded = False

    def _snapshot(self, *, empty_too: bool = False) -> None:
        """Write every key as one line (io's write_atomic), then the marker.

        An empty cache with no summary gets none (nothing to trust; a check
        then costs one listing of an empty ``keys/``), unless ``empty_too``.
        """
        if not empty_too and not self._rows and not os.path.lexists(self.path):
            self._loaded = False
            return
        gen = random.randrange(1, 1 << 24)  # a new lineage: an old copy never matches
        line = json.dumps({"summary": FORMAT, "gen": gen,
                           "entries": {k: list(r) for k, r in self._rows.items()}},
                          separators=(",", ":")).encode() + b"\n"
        try:
            write_atomic(self.path, line, temp_dir=self.tmp)
            self._ino = os.stat(self.path).st_ino
            self._gen, self._chain = gen, zlib.crc32(line)
            self._offset, self._lines, self._loaded = len(line), 0, True
            self._mark()
        except OSError as exc:  # a full disk: this state serves this lock; next one rebuilds
            log.info("engine cache: could not write the summary: %s", exc)
            self._loaded = False

    def _mark(self) -> None:
        os.utime(self.keys, ns=(time.time_ns(), self._marker()))
