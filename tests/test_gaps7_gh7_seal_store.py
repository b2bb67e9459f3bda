"""sets.store.ContentStore's references and sets.manifest.check_member_files' empty member.

A seal that records a *reference* (``"ref"``: the placed file that is the blob) vouches
only for the blob it names (``"xxh3"``): one at another blob's place (here B's seal
naming A, for A's very file) gives no reference for B, and is dropped. A member with no
files is refused by the closed-set rule itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import xxhash

from trtet_store.io.safedir import write_atomic
from trtet_store.remote.errors import FileNameError
from trtet_store.sets.manifest import check_member_files
from trtet_store.sets.store import ContentStore


def test_a_reference_seal_naming_another_blob_gives_no_reference(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "store")
    placed = tmp_path / "m" / "w.ptd"
    placed.parent.mkdir()
    data = b"A" * 5000
    placed.write_bytes(data)
    a = xxhash.xxh3_128(data).hexdigest()
    b = xxhash.xxh3_128(b"B" * 5000).hexdigest()
    cas.write_seal(a, os.lstat(placed), ref=os.fspath(placed))
    assert cas.reference(a, len(data)) == placed  # A's own seal: the reference holds
    doc = json.loads(cas.seal_path(a).read_bytes())
    write_atomic(cas.seal_path(b), json.dumps(doc).encode(), mode=0o444)  # names A, at B
    assert cas.reference(b, len(data)) is None
    assert not cas.seal_path(b).exists()  # dropped: B is downloaded when needed
    assert not cas.take_reference(b, len(data), 4096)
    assert not cas.path(b).exists() and placed.read_bytes() == data  # nothing copied
    assert cas.reference(a, len(data)) == placed


def test_a_member_with_no_files_is_refused() -> None:
    with pytest.raises(FileNameError, match="has no files"):
        check_member_files([], "set member 'a'")
    check_member_files(["model.pte", "cpu.ptd"], "set member 'a'")


def test_refer_refusing_the_file_at_the_placed_name_drops_the_blobs_seal(
        tmp_path: Path) -> None:
    """ContentStore.refer records only the very inode moved there; any other file at the
    placed name (here one swapped in, a link) records nothing and drops the old seal."""
    cas = ContentStore(tmp_path / "store")
    data = b"R" * 5000
    digest = xxhash.xxh3_128(data).hexdigest()
    cas.path(digest).write_bytes(data)
    cas.seal(digest)
    inode = cas.inode(digest)
    placed = tmp_path / "m" / "w.ptd"
    placed.parent.mkdir()
    placed.write_bytes(data)  # the same bytes, another inode: not the blob moved there
    assert not cas.refer(digest, placed, inode)
    assert not cas.seal_path(digest).exists()
    cas.seal(digest)
    link = tmp_path / "m" / "l.ptd"
    os.symlink(cas.path(digest), link)  # a link to the blob itself
    assert not cas.refer(digest, link, inode)
    assert not cas.seal_path(digest).exists()
    os.rename(cas.path(digest), tmp_path / "m" / "moved.ptd")  # the blob itself, moved
    assert cas.refer(digest, tmp_path / "m" / "moved.ptd", inode)
    assert cas.reference(digest, len(data)) == tmp_path / "m" / "moved.ptd"


def test_a_reference_cut_short_during_its_copy_is_not_taken(tmp_path: Path,
                                                            monkeypatch) -> None:
    """take_reference: the placed file truncated between its check and its copy (after the
    open): the short copy (EIO) is discarded, nothing is left in the store, the reference is
    dropped, and False says to download the blob."""
    from trtet_store.sets import store as store_mod

    cas = ContentStore(tmp_path / "store")
    placed = tmp_path / "m" / "w.ptd"
    placed.parent.mkdir()
    data = b"T" * 300_000
    placed.write_bytes(data)
    digest = xxhash.xxh3_128(data).hexdigest()
    cas.write_seal(digest, os.lstat(placed), ref=os.fspath(placed))

    def step(stage: str, ref: Path) -> None:
        if stage == "copy":
            os.truncate(ref, 1000)

    monkeypatch.setattr(store_mod, "_reference_step", step)
    assert cas.take_reference(digest, len(data), 4096) is False
    assert sorted(os.listdir(cas.root)) == [".trtet-seals"]  # no blob, no temp file
    assert os.listdir(cas.root / ".trtet-seals") == []
    assert placed.read_bytes() == data[:1000]  # the member's file: only our truncation


def test_a_store_too_small_for_a_references_copy_says_so(tmp_path: Path, make_fs) -> None:
    """take_reference: a copy that fails for want of space (ENOSPC) is not taken for a changed
    reference (which would download the blob into the same full disk): it is raised, and no
    temp file is left in the store; the member's file is untouched."""
    import errno

    small = make_fs("tmpfs", 2)
    cas = ContentStore(small / "store")
    placed = tmp_path / "m" / "w.ptd"
    placed.parent.mkdir()
    data = os.urandom(4 * 1024 * 1024)
    placed.write_bytes(data)
    digest = xxhash.xxh3_128(data).hexdigest()
    cas.write_seal(digest, os.lstat(placed), ref=os.fspath(placed))
    with pytest.raises(OSError) as caught:
        cas.take_reference(digest, len(data), 4096)
    assert caught.value.errno == errno.ENOSPC
    assert sorted(os.listdir(cas.root)) == [".trtet-seals"]  # no blob, no temp file
    assert placed.read_bytes() == data
