"""The member record (``.trtet-set.json``): verify's reading of it and the clean-up it drives.

Each check given the state it exists for, on a real directory: a record
whose chunk size is 0 or whose file names lead out of the directory; a link
at a member's name; a file changed in its third chunk (verify names where);
a record of another format; and the clean-up after the next member, which
removes only what the previous member placed and nobody changed since: not
a name the new member keeps, not a name outside the closed set
(``.bashrc``, ``../victim.ptd``) even when the record's digests match it,
not another user's file (uid 65534, in a mode 1777 directory) of the very
bytes recorded, not a file changed in place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from attacker import NOBODY, as_nobody, listing, shared_dir

from trtet_store.io import digest_file
from trtet_store.sets.manifest import FileEntry, MemberEntry
from trtet_store.sets.record import (
    RECORD,
    read_record,
    record_bytes,
    remove_unlisted,
    verify_member,
)

CHUNK = 4096


def _entry(directory: Path, names: list[str]) -> MemberEntry:
    files = []
    for name in names:
        digest, chunks, size = digest_file(directory / name, CHUNK, False)
        files.append(FileEntry(name, digest, size, "c", tuple(chunks)))
    return MemberEntry(tuple(files))


def _member(directory: Path, names: list[str] | None = None, size: int = 3 * CHUNK + 7) -> dict:
    """The files and the record a fetch leaves: model.pte and w.ptd by default."""
    names = names or ["model.pte", "w.ptd"]
    directory.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (directory / name).write_bytes(bytes([65 + i]) * size)
    (directory / RECORD).write_bytes(record_bytes("s3://b/set/", "a", '"v1"',
                                                  _entry(directory, names), CHUNK))
    return json.loads((directory / RECORD).read_bytes())


def _rewrite_record(directory: Path, doc: dict) -> None:
    (directory / RECORD).write_bytes(json.dumps(doc).encode())


# --- verify_member ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [0, -4096])
def test_a_record_whose_chunk_size_is_not_positive_is_refused(tmp_path: Path,
                                                             chunk_size: int) -> None:
    doc = _member(tmp_path / "m")
    _rewrite_record(tmp_path / "m", {**doc, "chunk_size": chunk_size})
    with pytest.raises(ValueError) as caught:
        verify_member(tmp_path / "m")
    assert str(caught.value) == f"{tmp_path / 'm' / RECORD}: chunk_size {chunk_size!r}"


@pytest.mark.parametrize("name", ["../victim.ptd", "sub/w.ptd", "..", ".", ""])
def test_a_record_naming_a_path_is_refused_and_nothing_outside_is_read(tmp_path: Path,
                                                                       name: str) -> None:
    """A record naming ``../victim.ptd`` (its digests the victim's) would have verify say
    a file outside the member is the released one."""
    doc = _member(tmp_path / "m")
    victim = tmp_path / "victim.ptd"
    victim.write_bytes((tmp_path / "m" / "w.ptd").read_bytes())
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "sub" / "w.ptd").write_bytes(victim.read_bytes())
    doc["files"][1]["name"] = name
    _rewrite_record(tmp_path / "m", doc)
    with pytest.raises(ValueError) as caught:
        verify_member(tmp_path / "m")
    assert str(caught.value) == f"{tmp_path / 'm' / RECORD}: a file name {name!r}"


def test_a_link_at_a_member_name_is_named_even_to_the_very_bytes(tmp_path: Path) -> None:
    _member(tmp_path / "m")
    real = tmp_path / "elsewhere.ptd"
    os.rename(tmp_path / "m" / "w.ptd", real)
    os.symlink(real, tmp_path / "m" / "w.ptd")
    check = verify_member(tmp_path / "m")
    assert check.problems == ["w.ptd: not a regular file (a link or other)"]
    os.unlink(tmp_path / "m" / "w.ptd")
    os.mkfifo(tmp_path / "m" / "w.ptd")  # never opened: no hang
    assert verify_member(tmp_path / "m").problems == [
        "w.ptd: not a regular file (a link or other)"]


def test_a_change_in_the_third_chunk_is_named_from_its_first_byte(tmp_path: Path) -> None:
    _member(tmp_path / "m")
    path = tmp_path / "m" / "w.ptd"
    with open(path, "r+b") as f:
        f.seek(2 * CHUNK + 100)
        f.write(b"Z")
    check = verify_member(tmp_path / "m")
    assert len(check.problems) == 1 and check.problems[0].endswith(
        f"(from byte {2 * CHUNK})"), check.problems
    assert check.problems[0].startswith("w.ptd: not the file member 'a' was released with: ")
    path.write_bytes(b"B" * (3 * CHUNK + 6))
    assert verify_member(tmp_path / "m").problems == [
        f"w.ptd: {3 * CHUNK + 6} bytes, released with {3 * CHUNK + 7}"]


def test_a_record_of_another_format_is_no_record(tmp_path: Path) -> None:
    doc = _member(tmp_path / "m")
    for bad in ({**doc, "format": "trtet-store-manifest"}, {**doc, "files": {}},
                [doc]):
        _rewrite_record(tmp_path / "m", bad)
        with pytest.raises(ValueError, match="is not a trtet-store member record"):
            verify_member(tmp_path / "m")
    for bad in ({**doc, "format": "other"}, {**doc, "files": {}},
                {**doc, "chunk_size": "4096"}, {**doc, "chunk_size": None}):
        _rewrite_record(tmp_path / "m", bad)
        assert read_record(tmp_path / "m") is None, bad
    _rewrite_record(tmp_path / "m", doc)
    assert read_record(tmp_path / "m") == doc


# --- the clean-up the record drives -----------------------------------------------------------


def test_a_file_the_new_member_keeps_is_not_removed_though_unchanged(tmp_path: Path) -> None:
    old = _member(tmp_path / "m")
    before = listing(tmp_path / "m")
    assert remove_unlisted(tmp_path / "m", old, {"model.pte", "w.ptd"}) == []
    assert listing(tmp_path / "m") == before


def test_only_the_previous_member_s_unchanged_files_go(tmp_path: Path) -> None:
    """The positive case the refusals below stand beside: both names removed."""
    old = _member(tmp_path / "m", ["model.pte", "w.ptd", "x.ptd"])
    got = remove_unlisted(tmp_path / "m", old, {"model.pte"})
    assert sorted(got) == [os.fspath(tmp_path / "m" / "w.ptd"), os.fspath(tmp_path / "m" / "x.ptd")]
    assert sorted(os.listdir(tmp_path / "m")) == [RECORD, "model.pte"]
    # the previous program too, when the new member's program has another name
    old = _member(tmp_path / "n", ["old.pte", "w.ptd"])
    assert remove_unlisted(tmp_path / "n", old, {"new.pte", "w.ptd"}) == [
        os.fspath(tmp_path / "n" / "old.pte")]


@pytest.mark.parametrize("name", [".bashrc", "../victim.ptd", "sub/w.ptd", "notes.txt",
                                  ".w.ptd.trtet-lock", "model"])
def test_a_name_outside_the_closed_set_is_never_removed_even_if_its_digest_matches(
        tmp_path: Path, name: str) -> None:
    old = _member(tmp_path / "m")
    d = tmp_path / "m"
    (d / "sub").mkdir()
    target = d / name
    target.write_bytes((d / "w.ptd").read_bytes())  # the very bytes the record names
    old["files"][1]["name"] = name
    before = listing(tmp_path), listing(d), listing(d / "sub")
    assert remove_unlisted(d, old, {"model.pte"}) == []
    assert (listing(tmp_path), listing(d), listing(d / "sub")) == before


def test_another_user_s_file_of_the_recorded_bytes_is_not_removed(make_fs: Any) -> None:
    """The member's directory is a mode 1777 one; uid 65534 puts its own w.ptd there with
    the recorded bytes (after the victim's was removed). Root could unlink it; it must not."""
    d = shared_dir(make_fs("ext4", 64), "m")
    old = _member(d)
    data = (d / "w.ptd").read_bytes()
    os.unlink(d / "w.ptd")
    as_nobody(lambda: (d / "w.ptd").write_bytes(data))
    assert (d / "w.ptd").stat().st_uid == NOBODY
    before = listing(d)
    assert remove_unlisted(d, old, {"model.pte"}) == []
    assert listing(d) == before and (d / "w.ptd").stat().st_uid == NOBODY


def test_a_file_changed_in_place_at_the_same_size_is_kept(tmp_path: Path) -> None:
    old = _member(tmp_path / "m")
    path = tmp_path / "m" / "w.ptd"
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(5)
        f.write(b"Z")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = listing(tmp_path / "m")
    assert remove_unlisted(tmp_path / "m", old, {"model.pte"}) == []
    assert listing(tmp_path / "m") == before
