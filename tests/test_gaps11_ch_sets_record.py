"""sets/record.py ``remove_unlisted``: only a regular file is the previous member's to remove.

The clean-up after the next member removes a file the previous member's record lists
only while it is a regular file of ours, byte for byte what was placed. A symbolic link
the user put at that name (to their own copy elsewhere, of the very bytes recorded, and,
so that no size check tells it apart, a target path as long as the file) is not the
member's file: the link stays, and so does what it points to. Real files on a real
filesystem; no server.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from trtet_store.io import digest_file
from trtet_store.sets.record import remove_unlisted

CHUNK = 4096


def test_remove_unlisted_keeps_a_link_at_a_previous_member_s_name(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "new.pte").write_bytes(b"the new member")
    elsewhere = tmp_path / "user-copies"
    elsewhere.mkdir()
    # The link's own size (lstat) is its target's length: make the file that long, so
    # the size recorded does not tell the link from the file.
    stem = os.fspath(elsewhere / "lora")
    target = Path(stem + "x" * (200 - len(stem)) + ".ptd")
    length = len(os.fspath(target))
    data = bytes(range(256))[:length] if length <= 256 else os.urandom(length)
    target.write_bytes(data)
    digest, chunks, size = digest_file(target, CHUNK, False)
    assert size == length
    os.symlink(target, d / "lora.ptd")
    old = {"format": "trtet-store-set-member", "chunk_size": CHUNK,
           "files": [{"name": "old.pte", "size": 3, "xxh3": "0" * 32, "chunks": [0]},
                     {"name": "lora.ptd", "size": size, "xxh3": digest,
                      "chunks": list(chunks)}]}
    assert os.lstat(d / "lora.ptd").st_size == size  # only its kind tells it apart
    before = hashlib.sha256(target.read_bytes()).hexdigest()

    removed = remove_unlisted(d, old, {"new.pte"})

    assert removed == [], f"remove_unlisted removed a link the user put there: {removed}"
    assert os.path.islink(d / "lora.ptd") and os.readlink(d / "lora.ptd") == os.fspath(target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    assert sorted(os.listdir(d)) == ["lora.ptd", "new.pte"]


def _io_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split(":")[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_read_record_and_verify_member_refuse_a_record_over_its_cap_unread(
        tmp_path: Path) -> None:
    """A record of ours one byte over RECORD_MAX_BYTES (valid JSON, padded with spaces, so
    that only the cap refuses it): read_record says so in one line (left_alone) and
    returns None (the clean-up it drives removes nothing), verify_member raises
    NotOursError; neither reads the record's bytes (this process's rchar)."""
    from trtet_store.io import NotOursError
    from trtet_store.sets.record import RECORD, RECORD_MAX_BYTES, read_record, verify_member

    d = tmp_path / "m"
    d.mkdir()
    (d / "old.pte").write_bytes(b"placed by the previous member")
    digest, chunks, size = digest_file(d / "old.pte", CHUNK, False)
    doc = (b'{"chunk_size":%d,"files":[{"chunks":%s,"name":"old.pte","size":%d,"xxh3":"%s"}],'
           b'"format":"trtet-store-set-member","member":"a","set":"s3://b/p/",'
           b'"set_version":"e","version":1}' % (CHUNK, str(list(chunks)).encode(), size,
                                                 digest.encode()))
    with open(d / RECORD, "wb") as f:
        f.write(doc)
        f.write(b" " * (RECORD_MAX_BYTES + 1 - len(doc)))
    assert os.stat(d / RECORD).st_size == RECORD_MAX_BYTES + 1
    left: list[str] = []
    before = _io_read()
    got = read_record(d, left)
    read = _io_read() - before
    assert got is None
    assert len(left) == 1 and "over the" in left[0] and str(RECORD_MAX_BYTES) in left[0], left
    assert read < 1 << 20, f"read_record read {read} bytes of a record over its cap"
    assert remove_unlisted(d, got, {"new.pte"}) == []
    assert (d / "old.pte").exists()
    before = _io_read()
    try:
        verify_member(d)
    except NotOursError as exc:
        assert str(RECORD_MAX_BYTES) in str(exc)
    else:
        raise AssertionError("verify_member read a record over its cap")
    assert _io_read() - before < 1 << 20
