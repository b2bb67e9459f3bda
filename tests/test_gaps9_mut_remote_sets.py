"""sets.store.ContentStore.refer's answer, sets.manifest.check_member_files' twice-named file,
and sets.signed.check_blobs on a link planted at a blob's name in the store.

- ``ContentStore.refer`` says whether the reference was recorded: True only for the very
  inode moved there (then :meth:`ContentStore.reference` gives the file), False for any
  other file at that name (a directory on its path swapped: the seal is dropped).
- ``check_member_files`` names the file a member names twice (``FileNameError.name``), not
  the first name of the list.
- ``check_blobs`` never follows a link at a blob's name in the store: a link to a file of
  the blob's very bytes is not taken for the blob (refused), and its target is untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
import xxhash

from trtet_store.remote.errors import FileNameError
from trtet_store.sets.manifest import check_member_files
from trtet_store.sets.signed import SetSignatureError, check_blobs
from trtet_store.sets.store import ContentStore


def _placed(tmp_path: Path, data: bytes) -> tuple[ContentStore, Path, str]:
    cas = ContentStore(tmp_path / "store")
    placed = tmp_path / "m" / "w.ptd"
    placed.parent.mkdir()
    placed.write_bytes(data)
    return cas, placed, xxhash.xxh3_128(data).hexdigest()


def test_refer_says_true_for_the_inode_moved_there_and_keeps_the_reference(
        tmp_path: Path) -> None:
    cas, placed, digest = _placed(tmp_path, b"w" * 3000)
    st = os.lstat(placed)
    assert cas.refer(digest, placed, (st.st_dev, st.st_ino)) is True
    assert cas.reference(digest, 3000) == placed


def test_a_reference_rewritten_in_place_with_its_mtime_put_back_is_dropped(
        tmp_path: Path) -> None:
    """ContentStore._reference: a placed file written in place with other bytes of the same
    size and its mtime put back (os.utime) is no longer the blob: its ctime moved, so the
    reference is dropped (the blob downloaded again), never handed to a later member."""
    cas, placed, digest = _placed(tmp_path, b"w" * 3000)
    st = os.lstat(placed)
    assert cas.refer(digest, placed, (st.st_dev, st.st_ino)) is True
    with open(placed, "r+b") as f:  # the same inode, the same size, other bytes
        f.write(b"X" * 3000)
    os.utime(placed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.lstat(placed).st_mtime_ns == st.st_mtime_ns
    assert cas.reference(digest, 3000) is None
    assert not os.path.lexists(cas.seal_path(digest))  # the reference is forgotten
    assert cas.take_reference(digest, 3000, 1 << 20) is False


def test_refer_says_false_for_another_file_at_the_name_and_records_nothing(
        tmp_path: Path) -> None:
    cas, placed, digest = _placed(tmp_path, b"w" * 3000)
    other = tmp_path / "m" / "other.ptd"
    other.write_bytes(b"w" * 3000)
    st = os.lstat(other)  # the inode moved was another one than the file now at `placed`
    before = placed.read_bytes()
    assert cas.refer(digest, placed, (st.st_dev, st.st_ino)) is False
    assert cas.reference(digest, 3000) is None
    assert not cas.seal_path(digest).exists()
    assert placed.read_bytes() == before and other.read_bytes() == before


def test_refer_says_false_for_a_link_at_the_name(tmp_path: Path) -> None:
    cas, placed, digest = _placed(tmp_path, b"w" * 3000)
    link = tmp_path / "m" / "l.ptd"
    link.symlink_to(placed)
    st = os.lstat(placed)  # the link leads to the very inode: still not recorded
    assert cas.refer(digest, link, (st.st_dev, st.st_ino)) is False
    assert cas.reference(digest, 3000) is None


@pytest.mark.parametrize("names, twice", [
    (["m.pte", "a.ptd", "b.ptd", "b.ptd"], "b.ptd"),
    (["m.pte", "b.ptd", "a.ptd", "b.ptd"], "b.ptd"),
])
def test_check_member_files_names_the_file_named_twice(names: list[str], twice: str) -> None:
    with pytest.raises(FileNameError, match="names a file twice") as caught:
        check_member_files(names, "set member 'a'")
    assert caught.value.name == twice


def test_check_blobs_never_follows_a_link_at_a_blob_s_name(tmp_path: Path) -> None:
    """A link (ours: the store is 0700) at the blob's name to a file of its very bytes and
    sha256 is not the blob: refused, the target untouched, nothing vouched for."""
    data = os.urandom(5000)
    digest = xxhash.xxh3_128(data).hexdigest()
    sha = hashlib.sha256(data).hexdigest()
    cas = ContentStore(tmp_path / "store")
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(data)
    os.symlink(target, cas.path(digest))
    with pytest.raises((OSError, SetSignatureError)):
        check_blobs(cas, [digest], {digest: sha}, "s3://b/set/")
    assert target.read_bytes() == data
    assert not cas.seal_path(digest).exists()


@pytest.mark.parametrize("sealed", [True, False])
def test_check_blobs_removes_a_refused_blob_and_its_seal_from_the_store(
        tmp_path: Path, sealed: bool) -> None:
    """The store's blob is the bytes its xxh3-128 names, but not the signed sha256 (what an
    xxh3 second preimage would give): refused, and the store holds neither the blob nor its
    seal afterwards (no stray seal that a later look would take for the blob's)."""
    data = os.urandom(7000)
    digest = xxhash.xxh3_128(data).hexdigest()
    cas = ContentStore(tmp_path / "store")
    cas.path(digest).write_bytes(data)
    os.chmod(cas.path(digest), 0o444)
    if sealed:  # downloaded now: its seal keeps the sha256 taken as it arrived
        cas.seal(digest, sha256=hashlib.sha256(data).hexdigest())
    else:
        cas.seal(digest)  # in the store before: read once for its sha256
    assert cas.sealed(digest)
    signed = hashlib.sha256(b"the bytes the signer meant").hexdigest()
    with pytest.raises(SetSignatureError, match=f"blob {digest}: its sha256 is"):
        check_blobs(cas, [digest], {digest: signed}, "s3://b/set/")
    assert not os.path.lexists(cas.path(digest))
    assert not os.path.lexists(cas.seal_path(digest))
    assert [n for n in os.listdir(cas.root) if digest in n] == []  # no temp, no stray seal


@pytest.mark.parametrize("name, why", [
    ("../x.pte", "is a path, not a plain file name"),
    (".trtet-set.json", "is one of trtet_store's own names"),
    ("a\nb.ptd", "holds a control character"),
])
def test_a_program_name_is_refused_for_its_first_reason_not_a_later_one(name: str,
                                                                       why: str) -> None:
    """sets.manifest.member_file_problem: the plain-name rule's reason is the one the user
    reads (a path, our own name, a control character), not "starts with a dot" / "is not a
    .pte name" said over it."""
    from trtet_store.sets.manifest import member_file_problem

    assert member_file_problem(name, program=True) == why or \
        member_file_problem(name, program=True).startswith(why)
    with pytest.raises(FileNameError, match=re.escape(f"the program's name {name!r} {why}")):
        check_member_files([name, "w.ptd"], "set member 'a'")
