"""io/seal.py: a re-read compares every chunk digest, and a file that is not a regular file
never holds a seal (a gap hunt: no test sealed chunk digests that disagree with the bytes,
nor held a seal against a FIFO or a directory).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from trtet_store.io import MiB, Seal, bytes_digested


def test_a_re_read_refuses_a_seal_whose_chunk_digests_are_not_the_bytes(tmp_path: Path) -> None:
    """seal.py recheck: ``digest != self.digest or tuple(chunks) != self.chunk_digests``.
    A seal whose whole digest is right but whose chunk digests were altered (a seal file
    edited, or written by a bug) must be refused and never renewed: the chunk digests are
    what a range is later checked against."""
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * MiB + 7))
    fd = os.open(path, os.O_RDONLY)
    try:
        seal = Seal.read(fd, MiB)
        chunks = list(seal.chunk_digests)
        chunks[1] ^= 1
        bad = dataclasses.replace(seal, chunk_digests=tuple(chunks))
        before = bytes_digested()
        assert bad.check(fd, os.fstat(fd), full=True) == ("digest mismatch (first bad chunk 1)",
                                                          None)
        assert bytes_digested() == before + seal.size  # it was read, once
        st = os.fstat(fd)  # the identity moved: a re-read, the same verdict
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        assert bad.check(fd, os.fstat(fd)) == ("digest mismatch (first bad chunk 1)", None)
        assert seal.check(fd, os.fstat(fd))[0] is None  # the true seal still holds
    finally:
        os.close(fd)


def test_a_fifo_or_a_directory_never_holds_a_seal(tmp_path: Path) -> None:
    """seal.py holds: ``if not stat.S_ISREG(st.st_mode)``. A FIFO planted at a blob's name
    has the size 0 an empty blob is sealed with; it must be refused as not a regular file
    (never "identity", which would re-read it: a FIFO read hangs)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    empty = Seal(0, "0" * 32, MiB, (), (1, 2, 0, 4, 5))
    assert empty.holds(os.stat(fifo)) == "the blob is not a regular file"
    d = tmp_path / "d"
    d.mkdir()
    st = os.stat(d)
    assert Seal(st.st_size, "0" * 32, MiB, (0,), ()).holds(st) == "the blob is not a regular file"
