"""io.SealedDir's relink rule: after our own hard link only the ctime may have moved.

``seal(name, relink=True)`` renews a seal unread only while the rest of the
file's identity is the sealed one; a file written since (its mtime moved,
here set back a second, its size kept) keeps its old seal, so its next use
reads it and refuses other bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import xxhash

from trtet_store.io import SealedDir, VerificationError, bytes_digested

CHUNK = 4096


def _sealed(tmp_path: Path, data: bytes) -> tuple[SealedDir, str, tuple[int, ...]]:
    d = SealedDir(tmp_path / "store", todo="remove it")
    name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    d.seal(name)
    chunks = tuple(xxhash.xxh3_64_intdigest(data[i:i + CHUNK])
                   for i in range(0, len(data), CHUNK))
    return d, name, chunks


def test_our_own_link_renews_the_seal_unread(tmp_path: Path) -> None:
    data = b"L" * (2 * CHUNK + 9)
    d, name, chunks = _sealed(tmp_path, data)
    os.link(d.path(name), tmp_path / "member")  # the ctime moves, nothing else
    assert not d.sealed(name)
    d.seal(name, relink=True)
    digested = bytes_digested()
    assert d.sealed(name) and d.check(name, len(data), CHUNK, chunks) is True
    assert bytes_digested() == digested


def test_a_write_before_the_link_keeps_the_old_seal_and_is_refused(tmp_path: Path) -> None:
    data = b"W" * (2 * CHUNK + 9)
    d, name, chunks = _sealed(tmp_path, data)
    st = os.stat(d.path(name))
    with open(d.path(name), "r+b") as f:  # same size, other bytes, the mtime moved
        f.write(b"X")
    os.utime(d.path(name), ns=(st.st_atime_ns, st.st_mtime_ns - 1_000_000_000))
    os.link(d.path(name), tmp_path / "member")
    d.seal(name, relink=True)
    assert not d.sealed(name)
    with pytest.raises(VerificationError, match="changed since it was checked"):
        d.check(name, len(data), CHUNK, chunks)
    assert d.path(name).read_bytes()[:1] == b"X"  # refused, left as it is


# -- the relink rule, once, over both stores' seal forms ---------------------------------------


def _in_form(tmp_path: Path, beside: bool, data: bytes, **kw: Any) -> tuple[SealedDir, str]:
    """A sealed file in the content store's form, or in the engine cache's (``blobs/``,
    made with ``kw``, e.g. ``refuse=True``)."""
    from trtet_store.io import Seal

    if not beside:
        d, name, _ = _sealed(tmp_path, data)
        return d, name
    (tmp_path / "blobs").mkdir(mode=0o700)
    d = SealedDir(tmp_path / "blobs", beside=True, temp_dir=tmp_path, **kw)
    name = f"{xxhash.xxh3_128(data).hexdigest()}-{len(data)}"
    d.path(name).write_bytes(data)
    fd = os.open(d.path(name), os.O_RDONLY)
    try:
        d.write(name, Seal.read(fd, CHUNK))
    finally:
        os.close(fd)
    return d, name


@pytest.mark.parametrize("beside", [False, True], ids=["store-form", "cache-form"])
def test_relinked_renews_only_a_seal_whose_file_kept_all_but_its_ctime(
        tmp_path: Path, beside: bool) -> None:
    data = b"R" * (2 * CHUNK + 9)
    d, name = _in_form(tmp_path, beside, data)
    assert d.sealed(name) and d.seal_path(name).exists()
    os.link(d.path(name), tmp_path / "member")  # our own link: the ctime moves
    assert not d.sealed(name)
    digested = bytes_digested()
    d.relinked(name)
    assert d.sealed(name) and bytes_digested() == digested  # renewed unread
    kept = d.seal_path(name).read_bytes()
    st = os.stat(d.path(name))
    os.chmod(d.path(name), 0o644)
    with open(d.path(name), "r+b") as f:  # same size, other bytes, the mtime set back
        f.write(b"X")
    os.utime(d.path(name), ns=(st.st_atime_ns, st.st_mtime_ns - 1_000_000_000))
    os.link(d.path(name), tmp_path / "member2")
    d.relinked(name)
    assert not d.sealed(name), "a file written before our link was resealed unread"
    assert d.seal_path(name).read_bytes() == kept
