"""io.seal.Seal.recheck and check: what a re-read says when the bytes are not the sealed ones
(a size read other than the sealed one; the first chunk that differs), and ``renewed``."""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.io.seal import Seal, same_identity

CHUNK = 4096


def _sealed(tmp_path: Path, data: bytes) -> tuple[Path, Seal]:
    p = tmp_path / "blob"
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        return p, Seal.read(fd, CHUNK)
    finally:
        os.close(fd)


def test_recheck_names_the_size_read_and_the_first_bad_chunk(tmp_path: Path) -> None:
    data = b"R" * (3 * CHUNK + 5)
    p, seal = _sealed(tmp_path, data)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert seal.recheck(fd) is None
        with open(p, "ab") as f:  # grown since the identity was looked at
            f.write(b"more")
        assert seal.recheck(fd) == f"read {len(data) + 4} bytes, sealed {len(data)}"
        os.truncate(p, len(data))
        with open(p, "r+b") as f:
            f.seek(2 * CHUNK + 1)
            f.write(b"X")
        assert seal.recheck(fd) == "digest mismatch (first bad chunk 2)"
        st = os.fstat(fd)
        assert seal.check(fd, st) == ("digest mismatch (first bad chunk 2)", None)
    finally:
        os.close(fd)
    assert not same_identity(seal.identity, os.lstat(p))
