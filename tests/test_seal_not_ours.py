"""A seal we did not make is not ours: never followed, never read whole, never trusted.

Both forms of :class:`~trtet_store.io.SealedDir` read their seal under the one
rule (``io.owned.read_ours``): the engine cache's ``blobs/<name>.json``
(``beside=True``) and the set content store's ``.trtet-seals/<name>``. A link
planted at a seal's name is not followed (a FIFO behind it would hang a plain
``open``; a forged seal behind it would be believed), a huge sparse seal is not
read (the kernel's ``rchar`` counts the bytes asked for), and another user's
seal is refused and left alone by the cache (NotOursError) and ignored, its
blob read again, by the store. Real files, a real second uid, nothing mocked.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from attacker import as_nobody, shared_dir
from digests import file_digest
from test_gaps7_gh7_seal_sealdir import _store as sealed_store

from trtet_store.cache import BlobCache
from trtet_store.io import Digester, NotOursError, SealedDir

MiB = 1 << 20
GiB = 1 << 30
IO = Path("/proc/thread-self/io")
DATA = b"engine bytes " * 5000


def _check(d: SealedDir, name: str) -> bool:
    """The store's check of the blob against its digests (True: trusted by its seal)."""
    dig = Digester(4096)
    dig.update(DATA)
    return d.check(name, len(DATA), 4096, tuple(dig.finish()[1]))


def _rchar() -> int:
    for line in IO.read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def _counted(fn):
    """``fn()``'s result and the bytes this thread read meanwhile (the proc file's excepted)."""
    _rchar()
    before = _rchar()
    got = fn()
    return got, _rchar() - before - len(IO.read_bytes())


def _cache(tmp: Path) -> tuple[BlobCache, Path, Path]:
    """A cache holding ``DATA`` under key ``a``: (cache, its blob, its seal)."""
    cache = BlobCache(tmp / "c", max_bytes=64 * MiB, chunk_size=4096)
    src = tmp / "src"
    src.write_bytes(DATA)
    assert cache.put("a", src).stored
    name = json.loads((cache.directory / "keys" / "a.json").read_bytes())["blob"]
    blob = cache.directory / "blobs" / name
    return cache, blob, cache.directory / "blobs" / f"{name}.json"


def _store(tmp: Path) -> tuple[SealedDir, str]:
    """A content store's form holding ``DATA``, sealed: (the directory, its name)."""
    return sealed_store(tmp, DATA)


def _in_time(fn, fifo: Path):
    """``fn()`` in a thread; if it is still running after 10 s it is stuck opening ``fifo``
    (a link followed): a writer is opened and closed to free it, and the test fails."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # EOF for the stuck reader
        t.join(10)
        raise AssertionError(f"the seal's link was followed: the read waited on the FIFO {fifo}")
    return out[0]


@pytest.mark.parametrize("form", ["cache", "store"])
def test_a_link_at_a_seals_name_to_a_fifo_is_not_followed(tmp_path: Path, form: str) -> None:
    fifo = tmp_path / "victim.fifo"
    os.mkfifo(fifo, 0o600)
    before = os.lstat(fifo)
    if form == "cache":
        cache, blob, seal = _cache(tmp_path)
        os.unlink(seal)
        seal.symlink_to(fifo)
        # Not trusted: the entry is dropped as one with no valid seal, the link removed.
        assert _in_time(lambda: cache.get("a"), fifo) is None
        assert not seal.is_symlink() and not (cache.directory / "keys" / "a.json").exists()
        assert cache.put("a", tmp_path / "src").stored and cache.get("a") is not None
    else:
        d, name = _store(tmp_path)
        seal = d.seal_path(name)
        os.unlink(seal)
        seal.symlink_to(fifo)
        assert _in_time(lambda: d.read(name), fifo) is None and not d.sealed(name)
        # Its blob is read again (the same bytes), and sealed anew in the link's place.
        assert _in_time(lambda: _check(d, name), fifo) is False
        assert stat.S_ISREG(os.lstat(seal).st_mode) and d.sealed(name)
    after = os.lstat(fifo)
    assert stat.S_ISFIFO(after.st_mode) and (after.st_ino, after.st_mtime_ns) == \
        (before.st_ino, before.st_mtime_ns)


def test_a_link_at_a_cache_seal_to_a_forged_seal_is_not_believed(tmp_path: Path) -> None:
    """The forged seal keeps the blob's identity (one ``lstat`` would trust it) and names
    other digests: followed, a hit would hand them out as the blob's."""
    cache, blob, seal = _cache(tmp_path)
    doc = json.loads(seal.read_bytes())
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(dict(doc, digest="0" * 32,
                                      chunk_digests=[1] * len(doc["chunk_digests"]))))
    before = file_digest(forged)
    os.unlink(seal)
    seal.symlink_to(forged)
    hit = cache.get("a")
    assert hit is None, f"served with the forged seal's digest {hit.digest}"
    assert file_digest(forged) == before and not seal.is_symlink()


@pytest.mark.skipif(not IO.exists(), reason="no per-thread I/O accounting here")
@pytest.mark.parametrize("form", ["cache", "store"])
def test_a_huge_sparse_seal_is_not_read(tmp_path: Path, form: str) -> None:
    if form == "cache":
        cache, blob, seal = _cache(tmp_path)
        os.truncate(seal, GiB)  # sparse: costs no disk, a 1 GiB read
        got, read = _counted(lambda: cache.get("a"))
        assert got is None and not seal.exists()  # dropped as one with no valid seal
    else:
        d, name = _store(tmp_path)
        seal = d.seal_path(name)
        os.chmod(seal, 0o644)
        os.truncate(seal, GiB)
        got, read = _counted(lambda: (d.read(name), d.sealed(name)))
        assert got == (None, False)
        assert _check(d, name) is False and d.sealed(name)  # read again
    assert read < MiB, f"{read} bytes read for a seal"


def test_a_cache_seal_another_uid_wrote_is_refused_and_left_alone(make_fs) -> None:
    """A seal written by uid 65534 (the very JSON a seal of this blob holds, so believed
    it would serve) moved into the cache: NotOursError on the hit, nothing removed."""
    mnt = make_fs("ext4", 64)
    cache, blob, seal = _cache(mnt)
    shared = shared_dir(mnt)
    body = seal.read_bytes()
    planted = shared / "seal.json"
    as_nobody(lambda: planted.write_bytes(body))
    os.rename(planted, seal)
    before = (file_digest(seal), os.lstat(seal).st_uid, file_digest(blob))
    with pytest.raises(NotOursError, match=r"engine cache seal .* owned by uid 65534"):
        cache.get("a")
    assert (file_digest(seal), os.lstat(seal).st_uid, file_digest(blob)) == before
    assert (cache.directory / "keys" / "a.json").exists()


def test_a_store_seal_another_uid_wrote_is_not_trusted_and_its_blob_read_again(
        make_fs) -> None:
    mnt = make_fs("ext4", 64)
    d, name = _store(mnt)
    shared = shared_dir(mnt)
    seal = d.seal_path(name)
    body = seal.read_bytes()
    planted = shared / "seal"
    as_nobody(lambda: planted.write_bytes(body))
    os.rename(planted, seal)
    assert d.read(name) is None and not d.sealed(name)
    assert _check(d, name) is False  # read, the same bytes: sealed anew
    assert os.lstat(seal).st_uid == os.geteuid() and d.sealed(name)
