"""The fetch staging lock is held by one fetch at a time, whatever the interleaving (item 11).

A fetch that ends with nothing to resume unlinks its lock file while it holds
it, then releases it. A second fetch that opened that file just before the
unlink gets its ``flock`` once it is released: on the unlinked inode. A third
fetch then creates a new file at the path and locks it. Unless a taker
checks that the file it locked is still the one at the path (``io.lock``'s
``try_lock``), the second and the third both hold "the" lock.

The interleaving is forced: the second fetch runs in a thread, and the
storage engine's system call table (``io.fs.calls``, the seam every lock of
the engine opens its file through) holds it right after it opened the lock
file, until the first has released and the third holds.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from trtet_store.io import STAGING_DIR, ConcurrentWriteError, fs
from trtet_store.remote.download.plan import ObjectSpec, plan_object
from trtet_store.remote.download.staging import Staging, fetch_id

MiB = 1 << 20
URL = "s3://b/k/model.pte"


def plans():
    spec = ObjectSpec("model.pte", "k/model.pte", 2 * MiB, "e1", None)
    return [plan_object(0, spec, [], MiB)]


def test_a_fetch_that_opened_the_lock_file_before_it_was_unlinked_does_not_hold_it_too(
        here_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = here_fs / "model.pte"
    lock_path = here_fs / STAGING_DIR / f"fetch-{fetch_id(dest)}.lock"
    first = Staging.open(dest, URL, "v1", plans())
    opened, go = threading.Event(), threading.Event()
    real_open = fs.calls.open
    second_thread: list[threading.Thread] = []

    def open_then_wait(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if threading.current_thread() in second_thread and os.fspath(path) == \
                os.fspath(lock_path) and not opened.is_set():
            opened.set()  # the second fetch holds an fd to the first one's lock file
            assert go.wait(30)
        return fd

    monkeypatch.setattr(fs.calls, "open", open_then_wait)
    result: dict = {}

    def second() -> None:
        try:
            result["staging"] = Staging.open(dest, URL, "v1", plans())
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=second, daemon=True)
    second_thread.append(thread)
    thread.start()
    assert opened.wait(30), f"the second fetch never opened its lock file: {result}"
    # The first fetch ends with nothing to resume: its lock file goes, its lock is released.
    first.discard()
    first.close()
    assert not lock_path.exists()
    # A third fetch now takes the lock at the path: a new file.
    third = Staging.open(dest, URL, "v1", plans())
    try:
        go.set()
        thread.join(30)
        assert not thread.is_alive()
        held_twice = "staging" in result
        if held_twice:
            result["staging"].close()
        assert not held_twice, ("the second fetch holds a lock on the unlinked lock file while "
                                "the third holds the one at the path")
        assert isinstance(result.get("error"), ConcurrentWriteError), result
        assert "another fetch into" in str(result["error"])
    finally:
        go.set()
        third.discard()
        third.close()
    # Nothing left: no lock file, no staged run, no staging directory.
    assert sorted(os.listdir(here_fs)) == []


def test_a_fetch_whose_lock_is_held_is_refused_and_leaves_the_holders_files(
        here_fs: Path) -> None:
    dest = here_fs / "model.pte"
    first = Staging.open(dest, URL, "v1", plans())
    before = sorted(os.listdir(here_fs / STAGING_DIR))
    try:
        with pytest.raises(ConcurrentWriteError, match="another fetch into"):
            Staging.open(dest, URL, "v1", plans())
        assert sorted(os.listdir(here_fs / STAGING_DIR)) == before
    finally:
        first.discard()
        first.close()
    assert sorted(os.listdir(here_fs)) == []
