"""The cache's summary under a kill at every step, and a put's operations counted (issue 42 item 4).

Written by a second helper in parallel with tests/test_cache_summary.py
(the same design); kept for what that file does not do:

- SIGKILL at every step of a put, a replacing put and an eviction: a forked
  child counts its mutating calls (``os.open``, ``write``, ``rename``,
  ``unlink``, ``utime``, ``link``) and kills itself at the n-th, for every n
  until the operation completes. After each kill the summary on disk is
  either refused (rebuilt) or right, and a process that held the old state
  ends up with the records' numbers and keeps the bound.
- Records changed by a process of the previous release (no summary, run
  from ``git archive c328df2``): seen, and the bound holds. (A missing,
  stale or lying summary: tests/test_cache_summary.py.)
- A put's operations (record reads, directory listings, ``stat`` and
  ``open`` calls) are the same at 10 entries as at 1,000.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from trtet_store.cache import BlobCache
from trtet_store.cache.files import CacheFiles
from trtet_store.cache.summary import Summary

ROOT = Path(__file__).resolve().parents[1]
SIZE = 4096
#: Room for three entries of SIZE + a few bytes.
BOUND = 3 * SIZE + 100


def data(seed: int, size: int = SIZE) -> bytes:
    return seed.to_bytes(4, "little") * (size // 4) + bytes(size % 4)


def put(cache: BlobCache, key: str, seed: int, scratch: Path, size: int = SIZE):
    src = scratch / f"src-{os.getpid()}"
    src.write_bytes(data(seed, size))
    return cache.put(key, src)


def truth(cache: BlobCache) -> tuple[dict[str, tuple[str, int]], int]:
    """What the records say: key -> (blob, size), and the distinct blobs' bytes."""
    rows = {e.key: (e.blob, e.size) for e in cache.files.scan()}
    return rows, sum(dict(rows.values()).values())


def view(summary: Summary) -> tuple[dict[str, tuple[str, int]], int]:
    return {k: (r[0], r[1]) for k, r in summary._rows.items()}, summary.used


def from_disk(cache: BlobCache) -> tuple[bool, tuple[dict[str, tuple[str, int]], int]]:
    """A new process's first look: (whether it trusts the file, what it then knows)."""
    fresh = Summary(cache.directory, lambda: ((e.key, e.blob, e.size, e.last_use_ns)
                                              for e in cache.files.scan()))
    with cache.files.locked():
        fresh.check()
    return fresh.rebuilds == 0, view(fresh)


def agrees(cache: BlobCache) -> None:
    """Under the lock, ``cache``'s summary (stale in memory or not) says what the records say."""
    with cache.files.locked():
        cache.files.summary.check()
        assert view(cache.files.summary) == truth(cache)


# -- SIGKILL at every step --------------------------------------------------------------

#: The calls that change files (a kill before each is a distinct on-disk state).
STEPS = ("open", "write", "rename", "replace", "unlink", "utime", "link")


def _killed_at(n: int, directory: Path, op: Callable[[BlobCache], object]) -> bool:
    """Fork: open the cache, then run ``op`` and SIGKILL at its n-th step. True if killed."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            cache = BlobCache(directory, max_bytes=BOUND)
            count = 0

            def hook(real: Callable) -> Callable:
                def call(*a, **k):
                    nonlocal count
                    count += 1
                    if count == n:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*a, **k)
                return call

            for name in STEPS:
                setattr(os, name, hook(getattr(os, name)))
            op(cache)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, status
    return False


def _kill_every_step(root: Path, setup: Callable[[BlobCache, Path], None],
                     op: Callable[[Path], Callable[[BlobCache], object]]) -> dict[str, int]:
    scratch = root / "scratch"
    scratch.mkdir()
    seen = {"trusted": 0, "refused": 0, "steps": 0}
    n = 0
    while True:
        n += 1
        directory = root / f"c{n}"
        before = BlobCache(directory, max_bytes=BOUND)  # holds the state before the op
        setup(before, scratch)
        agrees(before)
        killed = _killed_at(n, directory, op(scratch))
        trusted, disk = from_disk(before)
        if trusted:  # never trusted when it disagrees with the records
            assert disk == truth(before), n
        seen["trusted" if trusted else "refused"] += 1
        agrees(before)  # a process that held the old state catches up
        r = put(before, "after", 99, scratch)
        assert r.stored, r.reason
        assert truth(before)[1] <= BOUND
        agrees(before)
        reopened = BlobCache(directory, max_bytes=BOUND)
        assert from_disk(reopened) == (True, truth(reopened))
        if not killed:
            seen["steps"] = n - 1
            return seen
        assert n < 500, "the operation never completed"


def _three(cache: BlobCache, scratch: Path) -> None:
    for i in range(3):
        assert put(cache, f"k{i}", i, scratch).stored
    cache.get("k0").close()  # k1 is now the least recently used: the summary learns it lazily


def test_a_kill_at_every_step_of_a_put_that_evicts_never_leaves_a_trusted_wrong_summary(
        here_fs: Path) -> None:
    seen = _kill_every_step(here_fs, _three,
                            lambda scratch: lambda c: put(c, "new", 7, scratch))
    assert seen["steps"] >= 10 and seen["refused"] >= 3, seen
    print(seen)


def test_a_kill_at_every_step_of_a_replacing_put_never_leaves_a_trusted_wrong_summary(
        here_fs: Path) -> None:
    seen = _kill_every_step(here_fs, _three,
                            lambda scratch: lambda c: put(c, "k2", 8, scratch))
    assert seen["steps"] >= 10 and seen["refused"] >= 3, seen


def test_a_kill_at_every_step_of_an_eviction_never_leaves_a_trusted_wrong_summary(
        here_fs: Path) -> None:
    seen = _kill_every_step(here_fs, _three, lambda scratch: lambda c: c.prune(SIZE))
    assert seen["steps"] >= 6 and seen["refused"] >= 2, seen


# -- missing, stale, lying, foreign -------------------------------------------------------

def _full(here_fs: Path) -> tuple[BlobCache, Path]:
    scratch = here_fs / "scratch"
    scratch.mkdir()
    cache = BlobCache(here_fs / "c", max_bytes=BOUND)
    _three(cache, scratch)
    return cache, scratch


def _bounded_after_a_put(cache: BlobCache, scratch: Path) -> None:
    r = put(cache, "new", 50, scratch)
    assert r.stored, r.reason
    rows, used = truth(cache)
    assert used <= BOUND, f"the bound broke: {used} > {BOUND} bytes, {sorted(rows)}"
    agrees(cache)


def test_records_changed_by_the_previous_release_are_seen(here_fs: Path, tmp_path: Path) -> None:
    """A process of the release before the summary (c328df2) puts and evicts; we keep the bound."""
    cache, scratch = _full(here_fs)
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", os.fspath(ROOT), "archive", "c328df2",
                              "trtet_store"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", os.fspath(old)], input=archive, check=True)
    src = scratch / "old-src"
    src.write_bytes(data(60))
    code = ("import sys; from trtet_store.cache import BlobCache; "
            "c = BlobCache(sys.argv[1], max_bytes=10 * int(sys.argv[3])); "
            "r = c.put('from-old', sys.argv[2]); assert r.stored and not r.evicted, r; "
            "import trtet_store.cache.store as s; print(s.__file__)")
    done = subprocess.run([sys.executable, "-c", code, os.fspath(cache.directory),
                           os.fspath(src), str(SIZE)], env=dict(os.environ, PYTHONPATH=old),
                          capture_output=True, text=True, timeout=120, cwd=old)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(os.fspath(old)), done.stdout  # the old code ran
    assert not (old / "trtet_store" / "cache" / "summary.py").exists()
    assert from_disk(cache)[0] is False
    agrees(cache)
    assert "from-old" in truth(cache)[0] and truth(cache)[1] == 4 * SIZE  # its bound: 10x
    _bounded_after_a_put(cache, scratch)  # evicts two, not one


# -- a put's cost in operations ---------------------------------------------------------

class _Counter:
    """Counts, while on, record reads, directory listings, stat and open calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.counts = {"record reads": 0, "listings": 0, "stat": 0, "open": 0}
        real_read = CacheFiles.read_entry

        def read_entry(cache, key):
            self._add("record reads")
            return real_read(cache, key)

        monkeypatch.setattr(CacheFiles, "read_entry", read_entry)
        for name, what in (("listdir", "listings"), ("stat", "stat"), ("open", "open")):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name), what))

    def _add(self, what: str) -> None:
        if self.on:
            self.counts[what] += 1

    def _wrap(self, real: Callable, what: str) -> Callable:
        def call(*a, **k):
            self._add(what)
            return real(*a, **k)
        return call

    def of(self, fn: Callable[[], object]) -> dict[str, int]:
        self.counts = dict.fromkeys(self.counts, 0)
        self.on = True
        try:
            fn()
        finally:
            self.on = False
        return dict(self.counts)


def _costs(root: Path, entries: int, counter: _Counter) -> dict[str, dict[str, int]]:
    scratch = root / "scratch"
    scratch.mkdir()
    size = 512
    cache = BlobCache(root / "c", max_bytes=(entries + 1) * size)
    for i in range(entries):
        assert put(cache, f"e{i}", i, scratch, size).stored
    cache.get("e0").close()
    out = {
        "put": counter.of(lambda: put(cache, f"e{entries}", entries, scratch, size)),
        "put that evicts 1": counter.of(lambda: put(cache, "x", 10**6, scratch, size)),
        "get": counter.of(lambda: cache.get("e3").close()),
    }
    r = put(cache, "y", 10**6 + 1, scratch, size)
    assert len(r.evicted) == 1 and r.evicted[0] != "e0", r  # e0 was hit: not the LRU
    return out


def test_a_puts_operations_do_not_grow_with_the_entry_count(make_fs, monkeypatch) -> None:
    mnt = make_fs("tmpfs", 64)
    counter = _Counter(monkeypatch)
    (mnt / "small").mkdir()
    (mnt / "large").mkdir()
    small = _costs(mnt / "small", 10, counter)
    large = _costs(mnt / "large", 1000, counter)
    print(small, large)
    assert large == small
    assert small["put"]["record reads"] <= 2 and small["put"]["listings"] == 0
