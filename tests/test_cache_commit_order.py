"""BlobCache's commit, in order: the blob durable before the record that names it, and a
reader that meets a commit half-way neither serves it nor drops it (issue 45 items 1, 2).

A SIGKILL keeps the page cache, so a put whose blob is never fsynced passes
every kill test; the order of the syncs is checked here on the calls
themselves: ``os.fsync``/``os.fdatasync`` (and io's ``fs.calls`` table, which
``fsync_dir`` uses) are wrapped in this process to record which inode each
synced, while the real calls still run on a real filesystem.

The half-way states are set up with a pause inside the real commit: the put
runs in a thread whose cache's ``_write_json`` (the step that writes a seal
and a record) waits on an event before or after each write, while the test
reads the cache from another thread.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache import BlobCache
from trtet_store.io import BlobStore, fs

MiB = 1024 * 1024


def _content(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


class _SyncRecorder:
    """Records, in order, ``(op, (st_dev, st_ino), path)`` of every fsync and fdatasync."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, tuple[int, int], str]] = []
        self._lock = threading.Lock()
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))
            monkeypatch.setattr(fs.calls, name, self._wrap(name, getattr(fs.calls, name)))

    def _wrap(self, name: str, real: Callable[[int], None]) -> Callable[[int], None]:
        def call(fd: int) -> None:
            st = os.fstat(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            real(fd)  # the real call, on the real filesystem
            with self._lock:
                self.events.append((name, (st.st_dev, st.st_ino), path))

        return call

    def first(self, path: Path) -> int:
        """Index of the first sync of ``path``'s inode (it must have one)."""
        st = os.stat(path)
        for i, (_, ino, _) in enumerate(self.events):
            if ino == (st.st_dev, st.st_ino):
                return i
        raise AssertionError(f"{path} was never fsynced: {self.events}")


def _put(placement: str, make_fs: Any, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[BlobCache, _SyncRecorder, Any]:
    fstype = {"copy": "ext4", "clone": "xfs", "link": "ext4", "staged blob": "ext4"}[placement]
    mnt = make_fs(fstype, 400 if fstype == "xfs" else 64)
    cache = BlobCache(mnt / "c", max_bytes=64 * MiB)
    data = _content(7, 5 * MiB + 3)
    if placement == "staged blob":
        store = BlobStore(mnt / "staging")
        with store.writer() as w:
            w.write(data)
        source: Any = w.blob
    else:
        source = mnt / "src"
        # Written through the page cache, never synced by us: a link of it must be.
        with open(source, "wb") as f:
            f.write(data)
    recorder = _SyncRecorder(monkeypatch)
    result = cache.put("k", source, consume=placement in ("link", "staged blob"))
    assert result.stored, result
    expected = {"copy": "copy", "clone": "clone", "link": "link", "staged blob": "link"}
    assert result.placement == expected[placement], result
    return cache, recorder, result


@pytest.mark.parametrize("placement", ["copy", "clone", "link", "staged blob"])
def test_the_blob_is_durable_before_the_record_that_names_it(
        placement: str, make_fs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, rec, result = _put(placement, make_fs, monkeypatch)
    blob = cache.directory / "blobs" / f"{result.digest}-{result.size}"
    assert blob.exists(), sorted(os.listdir(cache.directory / "blobs"))
    record = cache.directory / "keys" / "k.json"
    blob_synced, record_synced = rec.first(blob), rec.first(record)
    assert blob_synced < record_synced, (
        f"the record was synced (event {record_synced}) before the blob's data "
        f"(event {blob_synced}): {rec.events}")
    # The blob's rename into blobs/ is durable (the directory synced) before the record.
    blobs_dir = os.stat(cache.directory / "blobs")
    dir_syncs = [i for i, (_, ino, _) in enumerate(rec.events)
                 if ino == (blobs_dir.st_dev, blobs_dir.st_ino)]
    assert any(blob_synced < i < record_synced for i in dir_syncs), rec.events
    with cache.get("k") as hit:
        assert hit.size == 5 * MiB + 3


# -- a reader meets a commit half-way --------------------------------------------------------


class _PausedCommit:
    """Runs ``cache.put(key, source)`` in a thread that stops at one point of the commit.

    The points are before and after each seal or record write
    (``files.blobs.write`` of ``blobs/*.json``, ``files.write_json`` of ``keys/*.json``):
    ``pause_at`` is the index of the point in that order.
    """

    def __init__(self, cache: BlobCache, key: str, source: Path, pause_at: int) -> None:
        self.cache, self.pause_at = cache, pause_at
        self.paused, self.go = threading.Event(), threading.Event()
        self.points: list[str] = []
        self.result: Any = None
        real, real_seal = cache.files.write_json, cache.files.blobs.write

        def write(path: Path, write: Callable[[], None]) -> None:
            self._point(f"before {path.parent.name}/{path.name}")
            write()
            self._point(f"after {path.parent.name}/{path.name}")

        # The seams: this instance only.
        cache.files.write_json = lambda path, data: write(path, lambda: real(path, data))
        cache.files.blobs.write = lambda name, seal: write(
            cache.files.blobs.seal_path(name), lambda: real_seal(name, seal))
        self.thread = threading.Thread(target=self._run, args=(key, source), daemon=True)

    def _point(self, where: str) -> None:
        self.points.append(where)
        if len(self.points) - 1 == self.pause_at:
            self.paused.set()
            assert self.go.wait(60), "the test never let the commit go on"

    def _run(self, key: str, source: Path) -> None:
        self.result = self.cache.put(key, source)

    def __enter__(self) -> _PausedCommit:
        self.thread.start()
        assert self.paused.wait(30), f"the commit never reached point {self.pause_at}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.thread.join(60)
        del self.cache.files.write_json, self.cache.files.blobs.write


def _read_in_thread(read: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as exc:  # reported by the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _get_bytes(cache: BlobCache, key: str) -> bytes | None:
    hit = cache.get(key)
    if hit is None:
        return None
    with hit:
        return hit.path.read_bytes()


@pytest.mark.parametrize("reader", ["get", "verify"])
@pytest.mark.parametrize("pause_at", range(4))
def test_a_reader_meeting_a_commit_half_way_neither_serves_nor_drops_it(
        pause_at: int, reader: str, here_fs: Path) -> None:
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    data = _content(3, 2 * MiB + 5)
    (here_fs / "src").write_bytes(data)
    other = BlobCache(here_fs / "c", max_bytes=64 * MiB)  # a second handle, as a reader's
    read = {"get": lambda: _get_bytes(other, "k"), "verify": other.verify}[reader]
    with _PausedCommit(cache, "k", here_fs / "src", pause_at) as commit:
        t, seen = _read_in_thread(read)
        # A reader that does not wait for the lock answers now; one that wants to
        # drop the entry waits for the commit to end, then drops it.
        t.join(2)
    t.join(60)
    assert commit.result is not None and commit.result.stored, commit.result
    assert seen and not isinstance(seen[0], BaseException), seen
    if reader == "get":
        assert seen[0] in (None, data), "a half-committed entry was served other bytes"
    else:
        assert seen[0].dropped == (), seen[0]
    # The entry committed whole and is still there: nobody dropped it half-way.
    assert _get_bytes(cache, "k") == data, (
        f"the entry committed while a reader ({reader}) met it at "
        f"{commit.points[pause_at]!r} was dropped")
    assert [e.key for e in cache.entries()] == ["k"]
    seal = commit.points[0].split("/", 1)[1]
    assert commit.points == [f"before blobs/{seal}", f"after blobs/{seal}",
                             "before keys/k.json", "after keys/k.json"], commit.points


@pytest.mark.parametrize("reader", ["get", "verify"])
def test_a_reader_of_the_old_entry_never_drops_the_entry_that_replaced_it(
        reader: str, here_fs: Path) -> None:
    """A reader read ``k``'s record (blob A); before it looks at A, a put gives ``k`` blob B
    and removes A (no hit pins it). The reader finds A gone: a miss, but ``k`` now names B,
    committed whole, and must stay.

    The put runs from a hook at the reader's next step, its read of A's seal.
    """
    cache = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    old, new = _content(1, MiB + 1), _content(2, MiB + 2)
    (here_fs / "old").write_bytes(old)
    (here_fs / "new").write_bytes(new)
    assert cache.put("k", here_fs / "old").stored
    other = BlobCache(here_fs / "c", max_bytes=64 * MiB)
    real = other.files.blobs.read
    replaced: list[Any] = []

    def replace_first(*args: Any, **kwargs: Any) -> Any:
        if not replaced:
            replaced.append(cache.put("k", here_fs / "new"))
        return real(*args, **kwargs)

    other.files.blobs.read = replace_first  # the seam: this instance only
    if reader == "get":
        got = _get_bytes(other, "k")
        assert got in (None, old, new)
    else:
        other.verify()
    del other.files.blobs.read
    assert replaced and replaced[0].stored, replaced
    assert _get_bytes(cache, "k") == new, (
        f"the entry that replaced the one a reader ({reader}) was reading was dropped")
