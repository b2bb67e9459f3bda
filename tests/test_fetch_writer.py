"""fetch's single writer thread: a write that fails stops the fetch, loses nothing, and resumes.

The GET threads hand each verified range to one writer thread
(``trtet_store.remote.download.writer``). A failure there (a disk error, a full
disk the preflight could not foresee) must reach the caller as itself, leave
the old local version byte-identical, and keep every range already written
and journaled, so the next fetch downloads only the rest. Faults are injected
into the real ``pwrite`` calls of the staged files (tests/faults.py); the
filesystem and the S3 server are real.
"""

from __future__ import annotations

import errno
import hashlib
import traceback
from pathlib import Path

import pytest
from faults import FaultInjector
from test_fetch import ENGINES, listing, publish_v, two_versions
from test_fetch_support import MiB, engine_bytes

from trtet_store import InsufficientSpaceError
from trtet_store.remote.download.receive import fetch


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("mode", ["enospc", "eio"])
def test_a_failed_range_write_stops_the_fetch_keeps_the_old_files_and_resumes(
        s3, here_fs, mode):
    v1, v2, sizes, _ = two_versions(seed=7)
    ptd = engine_bytes(8, 2 * MiB + 5)
    url = publish_v(s3, v1, sizes, ptd, prefix="w")
    fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB)
    before = {p.name: _sha(p) for p in (here_fs / "model.pte", here_fs / "model.ptd")}
    # v2: the second engine changed, so its 5 ranges of 1 MiB are downloaded.
    publish_v(s3, v2, sizes, ptd, prefix="w")

    # The fourth pwrite fails: the fetch journal's head and a blob's metadata come
    # first, so one range is written before it, in the writer thread.
    with FaultInjector(fail_at=4, mode=mode, only=frozenset({"pwrite"})) as inj, \
            pytest.raises(OSError) as info:
        fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB, concurrency=2)
    assert inj.fired == "pwrite"
    # It failed in the writer thread and reached the caller as itself; a full disk
    # as InsufficientSpaceError (what was needed, what is free), caused by it.
    err = info.value
    if mode == "enospc":
        assert isinstance(err, InsufficientSpaceError), repr(err)
        assert err.needed > 0 and "the disk filled during the fetch" in str(err)
        err = err.__cause__
    where = [Path(f.filename).name for f in traceback.extract_tb(err.__traceback__)]
    assert "writer.py" in where, where
    assert err.errno == (errno.ENOSPC if mode == "enospc" else errno.EIO)
    # The old version is untouched; what was staged waits for the resume.
    assert {p.name: _sha(p) for p in (here_fs / "model.pte", here_fs / "model.ptd")} == before
    assert listing(here_fs) == [".trtet-staging", "model.ptd", "model.pte"]

    report = fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB,
                   concurrency=2)
    assert (here_fs / "model.pte").read_bytes() == v2
    assert (here_fs / "model.ptd").read_bytes() == ptd
    # The ranges written before the failure are kept, not downloaded again.
    assert report.bytes_resumed >= MiB
    assert report.bytes_downloaded + report.bytes_resumed <= ENGINES[1] + sizes[0]
    assert listing(here_fs) == ["model.ptd", "model.pte"]
