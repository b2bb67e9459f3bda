"""The local store's seals and the hard-link placement, each given the state its check is for.

A seal is trusted only while it is a small JSON object naming the blob and
its full five-part identity: one byte over the cap, an identity of four
parts, another blob's name, a seal whose blob is now a link, are not seals.
A signed set's sha256 is taken from a seal only under its own (smaller)
cap. A blob rewritten in place with its mtime put back (``os.utime``) is
read again and refused. ``link=True`` across filesystems says what to do,
and the link it made for the first file before the second failed is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from attacker import listing

from trtet_store.io import VerificationError, digest_file
from trtet_store.sets.place import place_files
from trtet_store.sets.store import ContentStore

CHUNK = 4096
#: The store's seal cap, as documented (not imported: a changed constant must fail here).
SEAL_MAX_BYTES = 64 * 1024


def _store(tmp_path: Path, data: bytes = b"B" * (2 * CHUNK + 3)) -> tuple[ContentStore, str]:
    cas = ContentStore(tmp_path / "store")
    digest = xxhash.xxh3_128(data).hexdigest()
    cas.path(digest).write_bytes(data)
    os.chmod(cas.path(digest), 0o444)
    cas.seal(digest)
    return cas, digest


def _rewrite_seal(cas: ContentStore, digest: str, doc: Any, pad: int = 0) -> None:
    path = cas.seal_path(digest)
    body = json.dumps(doc).encode()
    os.chmod(path, 0o644)
    path.write_bytes(body + b" " * pad)
    os.chmod(path, 0o444)


def test_a_seal_of_exactly_the_cap_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    cas, digest = _store(tmp_path)
    assert cas.sealed(digest)
    doc = json.loads(cas.seal_path(digest).read_bytes())
    body = len(json.dumps(doc).encode())
    _rewrite_seal(cas, digest, doc, SEAL_MAX_BYTES - body)
    assert cas.seal_path(digest).stat().st_size == SEAL_MAX_BYTES
    assert cas.sealed(digest)
    _rewrite_seal(cas, digest, doc, SEAL_MAX_BYTES - body + 1)
    assert not cas.sealed(digest)


@pytest.mark.parametrize("change", ["four parts", "six parts", "another blob", "no identity"])
def test_a_seal_that_does_not_name_this_blob_s_whole_identity_is_no_seal(tmp_path: Path,
                                                                        change: str) -> None:
    cas, digest = _store(tmp_path)
    doc = json.loads(cas.seal_path(digest).read_bytes())
    ident = doc["identity"]
    bad = {"four parts": {**doc, "identity": ident[:4]},
           "six parts": {**doc, "identity": [*ident, 0]},
           "another blob": {**doc, "xxh3": "0" * 32},
           "no identity": {k: v for k, v in doc.items() if k != "identity"}}[change]
    _rewrite_seal(cas, digest, bad)
    assert not cas.sealed(digest)


def test_a_blob_that_became_a_link_to_its_very_bytes_is_not_sealed(tmp_path: Path) -> None:
    cas, digest = _store(tmp_path)
    other = tmp_path / "other"
    os.rename(cas.path(digest), other)
    os.symlink(other, cas.path(digest))
    doc = json.loads(cas.seal_path(digest).read_bytes())
    st = os.lstat(cas.path(digest))
    doc["identity"] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    _rewrite_seal(cas, digest, doc)  # the seal even names the link's own identity
    assert not cas.sealed(digest)


def test_a_blob_rewritten_with_its_mtime_put_back_is_read_and_refused(tmp_path: Path) -> None:
    data = b"B" * (2 * CHUNK + 3)
    cas, digest = _store(tmp_path, data)
    path = cas.path(digest)
    st = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(CHUNK + 1)
        f.write(b"Z")
    os.chmod(path, 0o444)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    assert not cas.sealed(digest)
    (tmp_path / "orig").write_bytes(data)  # the set's chunk digests: the original bytes'
    chunks = tuple(digest_file(tmp_path / "orig", CHUNK, False)[1])
    with pytest.raises(VerificationError):
        cas.check(digest, len(data), CHUNK, chunks)


def test_a_signed_set_s_sha256_is_taken_from_a_seal_only_under_its_cap(tmp_path: Path) -> None:
    """A seal that keeps a wrong sha256 and is over the signed check's cap (4096 bytes) is
    not believed for it: the blob is read once, and its real sha256 is the signed one."""
    from trtet_store.sets.signed import SetSignatureError, check_blobs

    data = b"B" * (2 * CHUNK + 3)
    cas, digest = _store(tmp_path, data)
    real = hashlib.sha256(data).hexdigest()
    doc = {**json.loads(cas.seal_path(digest).read_bytes()), "sha256": "f" * 64}
    _rewrite_seal(cas, digest, doc, 4097 - len(json.dumps(doc).encode()))
    assert cas.sealed(digest)  # the store's own cap (64 KiB) still reads it
    check_blobs(cas, [digest], {digest: real}, "s3://b/set/")
    assert cas.path(digest).exists()
    _rewrite_seal(cas, digest, doc)  # under the cap: its (wrong) sha256 is the one taken
    with pytest.raises(SetSignatureError):
        check_blobs(cas, [digest], {digest: real}, "s3://b/set/")


def test_link_placement_across_filesystems_says_what_to_do_and_leaves_no_link(
        tmp_path: Path, make_fs: Any) -> None:
    """The program's blob is on the destination's filesystem, the .ptd's is not: the link
    made for the first is gone after the second fails; nothing else changed."""
    mnt = make_fs("ext4", 64)
    here = mnt / "store"
    here.mkdir()
    (here / "p").write_bytes(b"pte")
    (tmp_path / "d").write_bytes(b"ptd")
    dest = mnt / "m"
    dest.mkdir()
    (dest / "model.pte").write_bytes(b"old")
    before = listing(dest)
    with pytest.raises(OSError) as caught:
        place_files(dest, [("model.pte", here / "p", 3, None), ("w.ptd", tmp_path / "d", 3, None)],
                    CHUNK, link=True, record=(".trtet-set.json", b"{}"))
    assert caught.value.errno == 18  # EXDEV
    assert f"link=True needs the store ({tmp_path}) on the destination's filesystem ({dest})" \
        in str(caught.value)
    assert listing(dest) == before
    # On one filesystem: every name a link to its blob, the record 0644.
    (here / "d").write_bytes(b"ptd")
    place_files(dest, [("model.pte", here / "p", 3, None), ("w.ptd", here / "d", 3, None)],
                CHUNK, link=True, record=(".trtet-set.json", b"{}"))
    assert sorted(os.listdir(dest)) == [".trtet-set.json", "model.pte", "w.ptd"]
    assert os.stat(dest / "w.ptd").st_ino == os.stat(here / "d").st_ino
    assert os.stat(dest / "model.pte").st_ino == os.stat(here / "p").st_ino
    assert os.stat(dest / ".trtet-set.json").st_mode & 0o777 == 0o644
