"""fetch_set (sets.fetch) takes its member's blob locks (``cas.locked``) in sorted order, so
two fetch-sets into one store never deadlock.

Where a new blob is moved into place (``_may_move``: the store and the
destination on one ext4, no reflinks, no links) fetch_set holds every one of
the member's blob locks for the whole fetch. Two processes taking two such
locks in different orders (a ``set`` of digests iterates in an order that
differs between processes: str hashes are salted per process) can each hold
one and wait for the other forever. Sorted, a waiter holds none the other needs.

The member here names two blobs whose ``set`` order in this process is not
sorted. This test holds the lock of the first digest in sorted order (a real
``flock`` on the store's lock file, as another fetch-set would), starts the
fetch in a thread, and waits until the kernel shows it blocked on that lock
(``/proc/locks``). Then the other blob's lock must be free: a fetch-set
waiting on the first lock holds no other. Released, the fetch finishes and
places the member whole.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import xxhash

from trtet_store.io import try_lock, unlock_file
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.store import STORE_DIR, ContentStore


def _unsorted_pair() -> tuple[bytes, bytes]:
    """Two files' bytes whose blob names iterate unsorted as a set in this process (and
    come unsorted in the member's file order: ``.pte`` first)."""
    for seed in range(1000):
        rng = random.Random(seed)
        pte, ptd = rng.randbytes(3001), rng.randbytes(5003)
        names = [xxhash.xxh3_128(pte).hexdigest(), xxhash.xxh3_128(ptd).hexdigest()]
        # unsorted as the set fetch_set builds, and in the member's file order too
        if list(set(names)) != sorted(names) and names != sorted(names):
            return pte, ptd
    raise AssertionError("no pair of blobs iterates unsorted here")


def _waiting_on(ino: int) -> bool:
    """Whether some flock waits (``->``) on the file of inode ``ino`` (/proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        words = line.split()
        if "->" in words and any(w.endswith(f":{ino}") for w in words):
            return True
    return False


def test_a_fetch_set_waiting_for_one_blob_lock_holds_no_other(s3env: Any, tmp_path: Path,
                                                              make_fs: Any) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    pte_bytes, ptd_bytes = _unsorted_pair()
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pte").write_bytes(pte_bytes)
    (src / "weights.ptd").write_bytes(ptd_bytes)
    publish_set({"a": [src / "model.pte", src / "weights.ptd"]}, url,
                endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    lo, hi = sorted(xxhash.xxh3_128(b).hexdigest() for b in (pte_bytes, ptd_bytes))

    mnt = make_fs("ext4", 64)  # no reflinks: new blobs are moved, every lock held throughout
    cas = ContentStore(mnt / STORE_DIR)
    target = mnt / "a"
    got: list[Any] = []

    def fetch() -> None:
        try:
            got.append(fetch_set(url, target, "a", endpoint_url=s3env.endpoint.url))
        except BaseException as exc:  # noqa: BLE001 - said by the test below
            got.append(exc)

    worker = threading.Thread(target=fetch, daemon=True)
    with cas.locked(lo):  # another fetch-set holds the first blob's lock
        ino = os.stat(cas.seal_path(lo + ".lock")).st_ino
        worker.start()
        deadline = time.monotonic() + 30
        while not _waiting_on(ino):
            assert worker.is_alive(), f"fetch_set did not wait for the held lock: {got}"
            assert time.monotonic() < deadline, "fetch_set never waited for the held lock"
            time.sleep(0.02)
        path = cas.seal_path(hi + ".lock")
        fd = try_lock(path, create=True, wait=False)
        if fd is not None:
            unlock_file(fd, path)
        assert fd is not None, (
            f"fetch_set held blob {hi}'s lock while it waited for {lo}'s: its locks are not "
            "taken in sorted order (two fetch-sets can deadlock)")
    worker.join(30)
    assert not worker.is_alive() and got and not isinstance(got[0], BaseException), got
    assert (target / "model.pte").read_bytes() == pte_bytes
    assert (target / "weights.ptd").read_bytes() == ptd_bytes
    assert got[0].placed.get("move"), got[0].placed  # the moving path, where locks are held
