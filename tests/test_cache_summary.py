"""The cache's summary (cache/summary.py): a put reads no other record, and the summary is
never trusted over the records (issue 42 item 4).

Record reads are counted by wrapping the cache's own ``_read_entry`` on the
instance (the real call still runs, on a real filesystem). Kills are real
SIGKILLs of a forked writer, sent by the writer itself at a step of its
summary (before a change's line, before its marker), while this process
keeps a cache open whose summary was loaded before the kill.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache

SIZE = 1000  # each entry's bytes: small, so the counts are about entries, not bytes


def _source(where: Path, seed: int) -> Path:
    path = where / f"src-{seed}"
    path.write_bytes(random.Random(seed).randbytes(SIZE))
    return path


def _fill(cache: BlobCache, where: Path, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        assert cache.put(f"k{i}", _source(where, i)).stored


def _records(cache: BlobCache) -> dict[str, tuple[str, int]]:
    """What the records say: each key's blob and size (read from disk now)."""
    return {e.key: (e.blob, e.size) for e in cache.files.scan()}


def _used(records: dict[str, tuple[str, int]]) -> int:
    return sum(dict(records.values()).values())


def _believed(cache: BlobCache) -> dict[str, tuple[str, int]]:
    """What this process's summary says, after the check the next locked step makes."""
    with cache.files.locked():
        summary = cache.files.summary
        summary.check()
        return {k: (r[0], r[1]) for k, r in summary._rows.items()}


def _count_reads(cache: BlobCache) -> Callable[[], int]:
    calls = [0]
    real = cache.files.read_entry

    def counted(key: str):
        calls[0] += 1
        return real(key)

    cache.files.read_entry = counted  # our own method, on this instance only
    return lambda: calls[0]


# -- (a) a put reads its own record only -------------------------------------------------------


def _put_reads(directory: Path, where: Path, n: int) -> tuple[int, int, tuple[str, ...]]:
    """Record reads of a put that fits and of one that evicts, in a cache of ``n`` entries."""
    cache = BlobCache(directory, max_bytes=(n + 1) * SIZE)
    _fill(cache, where, n)
    rebuilds = cache.files.summary.rebuilds
    reads = _count_reads(cache)
    assert cache.put("fits", _source(where, 10_001)).evicted == ()
    fits = reads()
    evicting = cache.put("evicts", _source(where, 10_002))
    assert cache.files.summary.rebuilds == rebuilds  # nothing changed behind its back
    return fits, reads() - fits, evicting.evicted


def test_a_puts_record_reads_do_not_grow_with_the_entries(here_fs: Path) -> None:
    small = _put_reads(here_fs / "c10", here_fs, 10)
    large = _put_reads(here_fs / "c500", here_fs, 500)
    assert small == large == (1, 1, ("k0",))  # its own key's record; the LRU victim


# -- (b) a missing, unreadable or stale summary is rebuilt from the records --------------------


def _replace(path: Path, data: bytes) -> None:
    """A new file in its place (a new inode, as any rewrite of it would be)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", ["deleted", "garbage", "stale copy", "a key missing"])
def test_a_summary_that_is_not_the_records_is_rebuilt_and_the_bound_holds(
        here_fs: Path, damage: str) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=4 * SIZE)
    summary = cache.directory / "summary"
    _fill(cache, here_fs, 1)
    old = summary.read_bytes()  # what it said with one entry
    _fill(cache, here_fs, 3, first=1)  # full: 4 entries
    if damage == "deleted":
        summary.unlink()
    elif damage == "garbage":
        _replace(summary, b"\x00garbage\n")
    elif damage == "stale copy":  # a real summary of this cache, from before 3 puts
        _replace(summary, old)
    else:  # well formed, one key fewer than the records: claims 1000 bytes fewer
        lines = summary.read_bytes().splitlines()
        snap = json.loads(lines[0])
        for line in lines[1:]:
            change = json.loads(line)
            snap["entries"][change["put"][0]] = change["put"][1:]
        del snap["entries"]["k3"]
        _replace(summary, json.dumps(snap).encode() + b"\n")
    rebuilds = cache.files.summary.rebuilds
    assert cache.put("new", _source(here_fs, 99)).evicted == ("k0",)
    records = _records(cache)
    assert _used(records) <= 4 * SIZE and set(records) == {"k1", "k2", "k3", "new"}
    assert cache.files.summary.rebuilds == rebuilds + 1
    assert _believed(cache) == records
    assert _believed(BlobCache(cache.directory, max_bytes=4 * SIZE)) == records


def test_records_changed_by_code_that_knows_no_summary_are_seen(here_fs: Path) -> None:
    """An older release changes keys/ under the lock and writes no summary line."""
    live = BlobCache(here_fs / "c", max_bytes=4 * SIZE)
    _fill(live, here_fs, 3)
    older = BlobCache(live.directory, max_bytes=100 * SIZE)
    older.files.summary.put = older.files.summary.drop = lambda *a, **k: None  # knows no summary
    _fill(older, here_fs, 2, first=3)  # 5 entries now: over live's bound
    older.evictor.drop_key("k1", "an older release's drop")  # 4 left
    assert live.put("new", _source(here_fs, 99)).evicted == ("k0",)
    records = _records(live)
    assert set(records) == {"k2", "k3", "k4", "new"} and _used(records) <= 4 * SIZE
    assert _believed(live) == records


# -- (c) a writer SIGKILLed between its records and its summary --------------------------------


def _killed_at(directory: Path, where: Path, step: str, max_bytes: int, seed: int) -> None:
    """Fork a writer that puts one entry and kills itself at ``step`` of its summary."""
    pid = os.fork()
    if pid == 0:  # the writer
        try:
            cache = BlobCache(directory, max_bytes=max_bytes)
            real = getattr(cache.files.summary, step)

            def die(*args, **kwargs):
                os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)

            setattr(cache.files.summary, step, die)
            cache.put(f"k{seed}", _source(where, seed))
        finally:
            os._exit(3)  # not killed: the step was never reached
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


@pytest.mark.parametrize("evicts", [False, True], ids=["put", "eviction"])
@pytest.mark.parametrize("step", ["_append", "_mark"], ids=["before the line",
                                                           "before the marker"])
def test_a_kill_between_the_records_and_the_summary_is_seen(
        here_fs: Path, step: str, evicts: bool) -> None:
    bound = (3 if evicts else 10) * SIZE
    live = BlobCache(here_fs / "c", max_bytes=bound)
    _fill(live, here_fs, 3)
    assert _believed(live) == _records(live)  # loaded before the kill
    _killed_at(live.directory, here_fs, step, bound, seed=50)
    records = _records(live)
    # On disk: the new record (a put), or the victim's record gone (an eviction, before it)
    assert ("k50" in records, "k0" in records) == ((False, False) if evicts else (True, True))
    assert _believed(live) == records  # the live process sees it
    assert live.put("after", _source(here_fs, 51)).stored
    records = _records(live)
    assert _used(records) <= bound and _believed(live) == records
    fresh = BlobCache(live.directory, max_bytes=bound)
    assert _believed(fresh) == records


# -- the marker on each filesystem --------------------------------------------------------------


@pytest.mark.parametrize("fstype,mib", [("ext4", 64), ("xfs", 300), ("btrfs", 114),
                                        ("tmpfs", 16)])
def test_the_marker_holds_on_each_filesystem_so_nothing_is_rebuilt(make_fs, fstype: str,
                                                                     mib: int) -> None:
    """keys/ keeps the marker's nanoseconds: no put, and no later open, reads every record."""
    mnt = make_fs(fstype, mib)
    cache = BlobCache(mnt / "c", max_bytes=4 * SIZE)
    _fill(cache, mnt, 1)  # an empty cache has no summary: its first put "rebuilds" from none
    rebuilds = cache.files.summary.rebuilds
    _fill(cache, mnt, 5, first=1)  # two evictions among them
    again = BlobCache(cache.directory, max_bytes=4 * SIZE)
    assert (cache.files.summary.rebuilds - rebuilds, again.files.summary.rebuilds) == (0, 0)
    assert _believed(again) == _records(again) and set(_records(again)) == {"k2", "k3", "k4",
                                                                              "k5"}
