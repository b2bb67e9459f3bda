"""Issue 22, the storage engine's half: the bugs a mutation audit planted and the suite missed.

Each test here failed with its bug planted (the commit that added it says which):
a blob changed with its mtime put back, a journal removed before its writer
locked it, a recovery of one destination that removes another's journal, and
the cleanup after publish that forgets a consumed clone's source.
"""

from __future__ import annotations

import errno
import os

import pytest
from digests import digest

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import fs, names
from trtet_store.io.errors import BlobChangedError
from trtet_store.io.journal import Journal, Plan, read
from trtet_store.io.lock import try_lock
from trtet_store.io.units import MiB


def _flip_a_byte_keeping_mtime(path: os.PathLike | str, offset: int) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def test_a_blob_changed_with_its_mtime_put_back_is_refused(make_fs):
    # Every tamper the other tests make also moves the mtime; a tool that puts it
    # back (rsync -t, touch -r) leaves only the change time to tell.
    mnt = make_fs("ext4", 64, mkfs_options=["-b", "4096"])  # blocks an insert can use
    store = BlobStore(mnt / "s")
    data = os.urandom(MiB)
    blob = store.put(data)
    _flip_a_byte_keeping_mtime(blob.path, 5000)
    with pytest.raises(BlobChangedError, match="ctime"):
        blob.check_identity()
    assert not blob.identity_matches()
    # An insert reads no byte: the identity is all it has. Refused before anything.
    dest = mnt / "m.pte"
    with pytest.raises(BlobChangedError):
        write_file(dest, [b"h" * 4096, blob], consume=True, placements={"move", "insert"})
    assert not dest.exists()
    assert blob.path.exists() and not blob.consumed
    assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "s"]
    store.close()


def test_a_journal_removed_before_its_writer_locked_it_is_created_again(here_fs, monkeypatch):
    dest = here_fs / "m.pte"
    path = names.journal_path(dest, "0123456789abcdef")
    real_open = fs.calls.open
    removed = []

    def open_then_remove(p, flags, *mode):
        fd = real_open(p, flags, *mode)
        if os.fspath(p) == os.fspath(path) and not removed:
            # What a recovery holding the destination's lock does to an empty
            # journal: takes it for a dead writer's and removes it.
            os.unlink(p)
            removed.append(p)
        return fd

    monkeypatch.setattr(fs.calls, "open", open_then_remove)
    journal = Journal.create(path, Plan(token="0123456789abcdef", outputs=[]))
    monkeypatch.undo()
    try:
        assert removed
        assert os.stat(path).st_ino == os.fstat(journal.fd).st_ino
        assert read(path)[0].token == "0123456789abcdef"
        assert try_lock(path, create=False) is None  # it is held, at its path
    finally:
        journal.remove()
    assert list(here_fs.iterdir()) == []


def test_a_write_leaves_alone_the_empty_journal_of_another_destination(here_fs, monkeypatch):
    # A writer of a.pte has created its journal and not locked it yet; a write of
    # b.pte in the same directory recovers b.pte's abandoned writes first. The
    # journal is a.pte's: only a.pte's lock (which its writer holds) says
    # whether it is abandoned, so it must stay, and both writes succeed.
    out = here_fs / "out"
    out.mkdir()
    store = BlobStore(here_fs / "s")
    a_data, b_data = os.urandom(300_000), os.urandom(200_000)
    a_blob, b_blob = store.put(a_data), store.put(b_data)
    a_journal_prefix = f".{names.internal_stem('a.pte')}.trtet-"
    real_open = fs.calls.open
    seen = []

    def open_then_write_b(p, flags, *mode):
        fd = real_open(p, flags, *mode)
        name = os.path.basename(p)
        if (flags & os.O_CREAT and name.startswith(a_journal_prefix)
                and name.endswith(names.JOURNAL_SUFFIX) and not seen):
            seen.append("b")
            write_file(out / "b.pte", [b"b", b_blob], consume=True)
            try:
                seen.append(os.stat(p).st_ino == os.fstat(fd).st_ino)
            except FileNotFoundError:
                seen.append("a's journal was removed")
        return fd

    monkeypatch.setattr(fs.calls, "open", open_then_write_b)
    write_file(out / "a.pte", [b"a", a_blob], consume=True)
    monkeypatch.undo()
    assert seen == ["b", True]
    assert digest((out / "a.pte").read_bytes()) == digest(b"a" + a_data)
    assert digest((out / "b.pte").read_bytes()) == digest(b"b" + b_data)
    assert sorted(p.name for p in out.iterdir()) == ["a.pte", "b.pte"]
    store.close()


def test_recover_removes_a_consumed_clone_source_when_the_cleanup_after_publish_failed(
        make_fs, monkeypatch):
    mnt = make_fs("xfs", 400)
    fs.capabilities.clear()
    out = mnt / "out"
    out.mkdir()
    store = BlobStore(mnt / "s")
    data = os.urandom(4 * MiB + 100)
    blob = store.put(data)
    source, sidecar = os.fspath(blob.path), names.meta_path_of(blob.path)
    real_unlink = fs.calls.unlink

    def unlink_fails_for_the_source(p, *args):
        if os.fspath(p) == source:
            raise OSError(errno.EIO, "injected EIO", p)
        return real_unlink(p, *args)

    monkeypatch.setattr(fs.calls, "unlink", unlink_fails_for_the_source)
    with pytest.raises(OSError) as raised:
        write_file(out / "m.pte", [b"h" * 4096, blob], consume=True, placements={"clone"})
    monkeypatch.undo()
    assert raised.value.errno == errno.EIO
    # Published (the commit point was passed); the cleanup is left to recover.
    assert digest((out / "m.pte").read_bytes()) == digest(b"h" * 4096 + data)
    assert os.path.exists(source)
    outcomes = recover(out)
    assert [o.action for o in outcomes if o.action not in ("orphan", "removed stray")] == [
        "rolled forward"]
    # The clone's source belongs to the output now: recover finishes what the
    # writer's cleanup did not, the source and its sidecar go.
    assert not os.path.exists(source)
    assert not os.path.exists(sidecar)
    assert digest((out / "m.pte").read_bytes()) == digest(b"h" * 4096 + data)
    assert sorted(p.name for p in out.iterdir()) == ["m.pte"]
    store.close()
