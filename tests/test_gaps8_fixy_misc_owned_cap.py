"""A capped read (``read_fd_capped``, under ``read_ours``/``open_ours``) asks no more than cap+1.

The size is checked on ``fstat`` when the file is opened; a file that grows after that
is refused by the read itself. That read must never ask the kernel for more than
``limit + 1`` bytes in all: a small record (a lock's, a manifest's) that another process
fills with gigabytes must not cost a 1 MiB buffer per read.

The bytes asked for are counted by the kernel: ``rchar`` of ``/proc/thread-self/io``
(every byte ``read``/``pread`` returned to this thread). The file really grows between
the ``fstat`` and the read (appended through another descriptor); nothing is mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.io import NotOursError, open_ours, read_fd_capped, read_ours

MiB = 1 << 20
IO = Path("/proc/thread-self/io")


def _rchar() -> int:
    for line in IO.read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def _read_counted(fn) -> tuple[object, int]:
    """``fn()``'s result (or exception) and the bytes this thread read meanwhile."""
    _rchar()  # the first read of the proc file, outside the count
    before = _rchar()
    try:
        got: object = fn()
    except Exception as exc:  # noqa: BLE001 - returned to the test
        got = exc
    after = _rchar()
    # The second look at /proc/thread-self/io is counted too: its own size.
    return got, after - before - len(IO.read_bytes())


pytestmark = pytest.mark.skipif(not IO.exists(), reason="no per-thread I/O accounting here")


@pytest.mark.parametrize("limit", [100, 4096, 300_000])
def test_a_file_grown_after_open_ours_is_read_no_further_than_the_cap(here_fs: Path,
                                                                      limit: int) -> None:
    path = here_fs / "record.json"
    path.write_bytes(b"{" + b" " * (limit - 2) + b"}")  # exactly the cap: accepted at open
    with open_ours(path, limit=limit) as fd:
        with open(path, "ab") as other:  # another writer fills it after the fstat
            other.write(os.urandom(8 * MiB))
        got, asked = _read_counted(lambda: read_fd_capped(fd, limit, path))
    assert isinstance(got, NotOursError), got
    assert f"grew past the {limit} bytes such a file may hold" in str(got)
    assert asked <= limit + 1, \
        f"the capped read asked for {asked} bytes of a file capped at {limit}"
    assert path.stat().st_size == limit + 8 * MiB  # the file itself is left alone


def test_a_file_within_its_cap_is_read_whole_and_no_more(here_fs: Path) -> None:
    path = here_fs / "small"
    data = os.urandom(5000)
    path.write_bytes(data)
    got, asked = _read_counted(lambda: read_ours(path, limit=6000))
    assert got == data
    assert asked == len(data), f"read_ours of {len(data)} bytes read {asked}"
