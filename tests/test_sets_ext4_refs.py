"""``fetch_set`` on ext4 without links: a new blob is moved into place, the store keeps a reference.

Real SeaweedFS, a real ext4 loop mount. Where the store cannot reflink into
the destination (ext4) and ``link=False``, a blob the store lacks is
downloaded into it, then renamed into the member's transaction (no byte
copied or read back), and the store records "blob X is the file at P with
identity I". A later member copies from P while its identity holds (one
``stat`` before, one after the copy); a reference whose file is gone or
was written is dropped and the blob downloaded again. Bytes read and
written are this process's ``rchar``/``wchar`` (``/proc/self/io``), bytes
downloaded the proxy's count, never a clock.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import xxhash
from sets_helpers import write

import trtet_store.sets.fetch as fetch_mod
import trtet_store.sets.store as store_mod
from trtet_store.io.units import MiB
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.testing.proxy import CountingProxy

FOUNDATION = 4 * MiB  # foundation.ptd, in every member
OWN = 256 * 1024 + 7  # each member's lora.pte
MEMBERS = "abcd"


def io_counts() -> dict[str, int]:
    """This process's ``rchar`` and ``wchar`` (all threads)."""
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            out[key] = int(value)
    return out


def disk_bytes(root: Path) -> int:
    """Bytes allocated to the regular files under ``root``, each inode once (du)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def blobs_in_store(store: Path) -> list[str]:
    return [p.name for p in store.iterdir() if p.is_file() and len(p.name) == 32]


@pytest.fixture
def lora(s3env, here_fs):
    """Four members (a lora.pte each) sharing one foundation.ptd, published as one set."""
    shared = write(here_fs / "src" / "foundation.ptd", FOUNDATION, 4700)
    members = {n: [write(here_fs / "src" / n / "lora.pte", OWN, 4710 + i), shared]
               for i, n in enumerate(MEMBERS)}
    url = f"s3://{s3env.bucket}/lora/v1/"
    publish_set(members, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    return url, shared.read_bytes(), members


def test_four_members_sharing_a_foundation_hold_four_copies_and_the_store_none(
        s3env, lora, make_fs):
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    downloaded = {}
    for n in MEMBERS:
        rep = fetch_set(url, mnt / n, n, endpoint_url=s3env.endpoint.url)
        downloaded[n] = rep.bytes_downloaded
        assert rep.placed == {"move": FOUNDATION + OWN}, rep.placed
        assert verify_member(mnt / n).ok
    # The foundation came over the network once; the others copied it from a member's file.
    assert downloaded == {"a": FOUNDATION + OWN, "b": OWN, "c": OWN, "d": OWN}
    store = mnt / ".trtet-blobs"
    assert blobs_in_store(store) == []
    used = disk_bytes(mnt)
    assert 4 * (FOUNDATION + OWN) <= used <= 4 * (FOUNDATION + OWN) + 512 * 1024, used
    inodes = {os.stat(mnt / n / "foundation.ptd").st_ino for n in MEMBERS}
    assert len(inodes) == 4
    for n in MEMBERS:
        st = os.stat(mnt / n / "foundation.ptd")
        assert st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o644
        assert (mnt / n / "foundation.ptd").read_bytes() == foundation
        assert (mnt / n / "lora.pte").read_bytes() == members[n][0].read_bytes()
    # A member's file written in place is its own: no other member's file changes.
    with open(mnt / "d" / "foundation.ptd", "r+b") as f:
        f.write(b"\xff" * 4096)
    for n in "abc":
        assert (mnt / n / "foundation.ptd").read_bytes() == foundation


def test_the_first_fetch_reads_nothing_back_and_writes_one_copy(s3env, lora, make_fs,
                                                                monkeypatch):
    url, foundation, _ = lora
    mnt = make_fs("ext4", 64)
    place = fetch_mod.place_files
    placing: dict[str, int] = {}

    def counted(*args, **kwargs):
        before = io_counts()
        try:
            return place(*args, **kwargs)
        finally:
            after = io_counts()
            placing.update({k: after[k] - before[k] for k in after})

    monkeypatch.setattr(fetch_mod, "place_files", counted)
    before = io_counts()
    rep = fetch_set(url, mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    after = io_counts()
    size = FOUNDATION + OWN
    assert rep.bytes_downloaded == size and rep.placed == {"move": size}
    # The placement after the download reads and writes no payload byte (the record only).
    assert placing["rchar"] <= 64 * 1024 and placing["wchar"] <= 64 * 1024, placing
    written = after["wchar"] - before["wchar"]
    assert written <= size + MiB, f"the first fetch wrote {written} bytes for {size}"
    assert disk_bytes(mnt) <= size + 256 * 1024
    assert (mnt / "a" / "foundation.ptd").read_bytes() == foundation


def truncate_and_rewrite(path: Path) -> None:
    """What ExecuTorch's ``save`` does to a file it rewrites: truncate, write anew."""
    data = bytearray(path.read_bytes())
    data[:4096] = b"\x00" * 4096
    with open(path, "wb") as f:
        f.write(data)


def overwrite_in_place(path: Path) -> None:
    """A write of the same size at the same place: only mtime and ctime say so."""
    with open(path, "r+b") as f:
        f.seek(FOUNDATION // 2)
        f.write(b"\x5a" * 4096)


@pytest.mark.parametrize("change", [truncate_and_rewrite, overwrite_in_place, os.unlink],
                         ids=["truncate-rewrite", "same-size-overwrite", "deleted"])
def test_a_changed_or_gone_reference_is_dropped_and_the_blob_downloaded(s3env, lora,
                                                                         make_fs, change):
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    fetch_set(url, mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    a_file = mnt / "a" / "foundation.ptd"
    change(a_file)
    a_bytes = a_file.read_bytes() if a_file.exists() else None
    with CountingProxy.for_url(s3env.endpoint.url) as px:
        rep = fetch_set(url, mnt / "b", "b", endpoint_url=px.endpoint_url)
    assert rep.bytes_downloaded == FOUNDATION + OWN
    assert px.downstream >= FOUNDATION + OWN
    assert (mnt / "b" / "foundation.ptd").read_bytes() == foundation
    assert (mnt / "b" / "lora.pte").read_bytes() == members["b"][0].read_bytes()
    assert verify_member(mnt / "b").ok
    if a_bytes is None:
        assert not a_file.exists()
    else:
        assert a_file.read_bytes() == a_bytes != foundation  # a's change is a's, untouched


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_write_during_the_copy_from_a_reference_is_never_placed(s3env, lora, make_fs,
                                                                  monkeypatch, when):
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    fetch_set(url, mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    a_file = mnt / "a" / "foundation.ptd"
    copy = store_mod._copy_reference
    calls = []

    def write_to_source(src: Path) -> None:
        with open(src, "r+b") as f:
            f.write(b"\x11" * 4096)  # same size: only mtime and ctime change

    def racing(fd, src, dest, size):
        calls.append(src)
        if when == "before":  # after the identity check, before a byte is copied
            write_to_source(src)
        copy(fd, src, dest, size)
        if when == "after":  # after every byte was copied, before the second look
            write_to_source(src)

    monkeypatch.setattr(store_mod, "_copy_reference", racing)
    with CountingProxy.for_url(s3env.endpoint.url) as px:
        rep = fetch_set(url, mnt / "b", "b", endpoint_url=px.endpoint_url)
    assert calls == [a_file]
    assert rep.bytes_downloaded == FOUNDATION + OWN and px.downstream >= FOUNDATION
    assert (mnt / "b" / "foundation.ptd").read_bytes() == foundation
    assert verify_member(mnt / "b").ok
    assert a_file.read_bytes()[:4096] == b"\x11" * 4096  # a's own change, kept
    assert blobs_in_store(mnt / ".trtet-blobs") == []


def test_a_store_on_another_filesystem_keeps_the_copy(s3env, lora, make_fs):
    url, foundation, _ = lora
    mnt, other = make_fs("ext4", 64), make_fs("ext4", 64)
    rep = fetch_set(url, mnt / "a", "a", store=other / "blobs",
                    endpoint_url=s3env.endpoint.url)
    assert rep.placed == {"copy": FOUNDATION + OWN}
    assert len(blobs_in_store(other / "blobs")) == 2
    assert (mnt / "a" / "foundation.ptd").read_bytes() == foundation


def test_a_placement_that_fails_gives_the_blobs_back_to_the_store(s3env, lora, make_fs):
    url, foundation, members = lora
    mnt = make_fs("ext4", 64)
    (mnt / "a" / "lora.pte").mkdir(parents=True)  # a directory where the program goes
    (mnt / "a" / "lora.pte" / "x").write_bytes(b"x")
    with pytest.raises(OSError):
        fetch_set(url, mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    store = mnt / ".trtet-blobs"
    assert sorted(blobs_in_store(store)) == sorted(
        xxhash.xxh3_128(p.read_bytes()).hexdigest() for p in members["a"])
    for b in blobs_in_store(store):
        assert stat.S_IMODE(os.stat(store / b).st_mode) == 0o444
    assert os.listdir(store / ".trtet-moving") == []
    assert sorted(os.listdir(mnt / "a")) == ["lora.pte"]
    # Nothing lost: the next fetch downloads nothing.
    (mnt / "a" / "lora.pte" / "x").unlink()
    (mnt / "a" / "lora.pte").rmdir()
    rep = fetch_set(url, mnt / "a", "a", endpoint_url=s3env.endpoint.url)
    assert rep.bytes_downloaded == 0
    assert (mnt / "a" / "foundation.ptd").read_bytes() == foundation
    assert verify_member(mnt / "a").ok
