"""The engine cache's blobs/ as an io.SealedDir: what its seal discipline must never do.

A renewal never makes a seal for a file whose seal is gone (an eviction
between a hit's read and its reseal); a read-only cache re-reads a changed
blob but writes nothing; a blob (or store file) that became a link to the
very file its seal names is not trusted, in either store's form.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash
from attacker import tree

from trtet_store.cache import BlobCache
from trtet_store.io import MiB, Seal, SealedDir, bytes_digested

CHUNK = 4096


def _sealed(tmp_path: Path, beside: bool, data: bytes) -> tuple[SealedDir, str]:
    root = tmp_path / "blobs"
    root.mkdir(mode=0o700)
    if beside:
        d = SealedDir(root, beside=True, temp_dir=tmp_path)
        name = f"{xxhash.xxh3_128(data).hexdigest()}-{len(data)}"
    else:
        d = SealedDir(root, todo="remove it")
        name = xxhash.xxh3_128(data).hexdigest()
    d.path(name).write_bytes(data)
    if beside:
        fd = os.open(d.path(name), os.O_RDONLY)
        try:
            d.write(name, Seal.read(fd, CHUNK))
        finally:
            os.close(fd)
    else:
        d.seal(name)
    assert d.sealed(name)
    return d, name


@pytest.mark.parametrize("beside", [False, True], ids=["store-form", "cache-form"])
def test_a_renewal_makes_no_seal_for_a_file_whose_seal_is_gone(tmp_path: Path,
                                                               beside: bool) -> None:
    d, name = _sealed(tmp_path, beside, b"E" * (CHUNK + 1))
    seal = d.read(name)
    os.unlink(d.seal_path(name))  # evicted (or dropped) between the read and the reseal
    assert d.renew(name, seal) is False
    assert not d.seal_path(name).exists(), "a seal was made for a blob whose seal was gone"
    assert d.read(name) is None and not d.sealed(name)


@pytest.mark.parametrize("beside", [False, True], ids=["store-form", "cache-form"])
def test_a_file_that_became_a_link_to_the_sealed_file_is_not_trusted(tmp_path: Path,
                                                                    beside: bool) -> None:
    d, name = _sealed(tmp_path, beside, b"L" * (CHUNK + 7))
    target = tmp_path / "elsewhere"
    os.link(d.path(name), target)  # the very inode the seal names ...
    os.unlink(d.path(name))
    os.symlink(target, d.path(name))  # ... behind a link at the blob's name
    d.renew(name, d.read(name).renewed(os.stat(target)))  # the seal names it exactly
    assert not d.sealed(name), "a link was trusted as the sealed file"


def test_a_read_only_cache_re_reads_a_changed_blob_and_writes_nothing(tmp_path: Path) -> None:
    data = os.urandom(MiB + 3)
    (tmp_path / "src").write_bytes(data)
    assert BlobCache(tmp_path / "c", max_bytes=64 * MiB).put("k", tmp_path / "src").stored
    (blob,) = (tmp_path / "c" / "blobs").glob("*[!n]")
    st = blob.stat()
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # identity moved, same bytes
    before = tree(tmp_path / "c" / "blobs")
    digested = bytes_digested()
    cache = BlobCache(tmp_path / "c", max_bytes=64 * MiB, read_only=True)
    with cache.get("k") as hit:
        assert hit.verified and hit.path.read_bytes() == data
    assert bytes_digested() == digested + len(data)  # re-read: its seal no longer holds
    assert tree(tmp_path / "c" / "blobs") == before, "a read-only cache rewrote a seal"
