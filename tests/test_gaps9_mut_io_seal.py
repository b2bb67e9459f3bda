"""io/seal.py Seal: each decision of holds / recheck / check / renewed, on real files.

- holds: a FIFO is no sealed file; another size is said before the identity;
- recheck: the whole-file digest and every chunk digest must both be the sealed ones (a
  seal with the right chunks under another file's digest, or the right digest with other
  chunks, vouches for nothing);
- check: an unchanged identity is trusted unread, unless ``full`` asks for a read, which
  then finds a same-size rewrite whose identity was put back (mtime restored; the ctime
  is faked by comparing against the identity as it is after the rewrite);
- renewed(relink=True): only while nothing but the ctime moved.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from trtet_store.io import Seal, bytes_digested
from trtet_store.io.digests import file_identity

CS = 4096


def _sealed(p: Path, data: bytes) -> Seal:
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        return Seal.read(fd, CS)
    finally:
        os.close(fd)


def _fd(p: Path) -> int:
    return os.open(p, os.O_RDONLY)


def test_holds_refuses_a_fifo_and_says_another_size_first(tmp_path: Path) -> None:
    seal = _sealed(tmp_path / "f", b"x" * 100)
    fifo = tmp_path / "q"
    os.mkfifo(fifo)
    assert seal.holds(os.lstat(fifo)) == "the blob is not a regular file"
    (tmp_path / "f").write_bytes(b"x" * 101)
    assert seal.holds(os.lstat(tmp_path / "f")) == "size 101, sealed 100 (truncated or extended)"


def test_recheck_needs_both_the_digest_and_every_chunk(tmp_path: Path) -> None:
    p = tmp_path / "f"
    seal = _sealed(p, b"a" * CS + b"b" * 10)
    fd = _fd(p)
    try:
        assert seal.recheck(fd) is None
        other_digest = dataclasses.replace(seal, digest="0" * 32)
        assert other_digest.recheck(fd) == "digest mismatch (first bad chunk None)"
        other_chunks = dataclasses.replace(seal, chunk_digests=(seal.chunk_digests[0], 7))
        assert other_chunks.recheck(fd) == "digest mismatch (first bad chunk 1)"
        shorter = dataclasses.replace(seal, size=seal.size - 1)
        assert shorter.recheck(fd) == f"read {seal.size} bytes, sealed {seal.size - 1}"
    finally:
        os.close(fd)


def test_check_trusts_an_unchanged_identity_unread_and_full_reads_it(tmp_path: Path) -> None:
    p = tmp_path / "f"
    seal = _sealed(p, b"c" * (CS + 5))
    fd = _fd(p)
    try:
        st = os.fstat(fd)
        before = bytes_digested()
        assert seal.check(fd, st) == (None, None)
        assert bytes_digested() == before  # unread
        assert seal.check(fd, st, full=True) == (None, seal)  # read: the same bytes
        assert bytes_digested() == before + CS + 5
    finally:
        os.close(fd)
    # rewritten in place, same size, mtime put back; sealed as it is now (so its
    # identity holds): only full finds the bytes changed
    old = os.stat(p)
    with open(p, "r+b") as f:
        f.write(b"C")
    os.utime(p, ns=(old.st_atime_ns, old.st_mtime_ns))
    now = os.stat(p)
    fake = dataclasses.replace(seal, identity=file_identity(now))
    fd = _fd(p)
    try:
        assert fake.check(fd, now) == (None, None)
        problem, renewed = fake.check(fd, now, full=True)
        assert problem == "digest mismatch (first bad chunk 0)" and renewed is None
        # and an identity that moved is read without asking: changed bytes refused
        problem, renewed = seal.check(fd, now)
        assert problem == "digest mismatch (first bad chunk 0)" and renewed is None
    finally:
        os.close(fd)


def test_renewed_on_relink_only_while_just_the_ctime_moved(tmp_path: Path) -> None:
    p = tmp_path / "f"
    seal = _sealed(p, b"r" * 50)
    os.link(p, tmp_path / "g")  # our own hard link: the ctime alone moves
    st = os.stat(p)
    assert seal.renewed(st, relink=True) == dataclasses.replace(seal, identity=file_identity(st))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # a write's mtime too
    assert seal.renewed(os.stat(p), relink=True) is None
    assert seal.renewed(os.stat(p)) is not None  # without relink: taken as it is
