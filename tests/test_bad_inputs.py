"""Bad inputs and bad conditions: each gets a clear error, and nothing is lost.

"Nothing lost" is checked the same way everywhere: every file in the
staging, output and user directories (hidden ones included) has the same
content before and after, and no temp, journal or lock file is left.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from crash_dying import in_child
from crash_scenario import content
from digests import file_digest

from trtet_store import (
    BlobStore,
    ConcurrentWriteError,
    ExternalFile,
    VerificationError,
    recover,
    write_file,
    write_files,
)
from trtet_store.io import fs
from trtet_store.io.units import KiB, MiB


def snapshot(*dirs: Path) -> dict[str, str]:
    """Every file under ``dirs`` with a digest of its content (symlinks by their target)."""
    found = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_symlink():
                found[os.fspath(p)] = "-> " + os.readlink(p)
            elif p.is_file():
                found[os.fspath(p)] = file_digest(p)
    return found


class Scene:
    """A store with two blobs, a user file, an output directory with an old output."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = BlobStore(root / "staging", chunk_size=16 * KiB)
        self.a = self.store.put(content(1, 300_001))
        self.b = self.store.put(content(2, 100_000))
        (root / "user").mkdir()
        self.user_file = root / "user" / "u.bin"
        self.user_file.write_bytes(content(3, 40_000))
        self.out = root / "out"
        self.out.mkdir()
        self.dest = self.out / "m.pte"
        self.dest.write_bytes(b"old content")
        self.before = self.snapshot()

    def pieces(self):
        return [b"header", self.a, b"\0" * 10, ExternalFile.of(self.user_file), self.b]

    def snapshot(self) -> dict[str, str]:
        return snapshot(self.root)

    def assert_nothing_lost(self) -> None:
        assert self.snapshot() == self.before
        for blob in (self.a, self.b):
            assert file_digest(blob.path) == blob.digest


@pytest.fixture
def scene(here_fs):
    s = Scene(here_fs)
    yield s
    s.store.close()


@pytest.mark.parametrize("consume", [True, False])
def test_destination_that_is_a_directory_is_refused(scene, consume):
    with pytest.raises(IsADirectoryError, match="it is a directory; give a file name"):
        write_file(scene.out, scene.pieces(), consume=consume)
    scene.assert_nothing_lost()


@pytest.mark.parametrize("consume", [True, False])
def test_destination_whose_directory_is_missing_is_refused(scene, consume):
    with pytest.raises(FileNotFoundError, match="its directory does not exist"):
        write_file(scene.out / "missing" / "m.pte", scene.pieces(), consume=consume)
    assert not (scene.out / "missing").exists()
    scene.assert_nothing_lost()


def test_destination_on_a_read_only_filesystem_is_refused(scene, make_fs):
    mnt = make_fs("tmpfs", 8)
    (mnt / "models").mkdir()
    (mnt / "models" / "m.pte").write_bytes(b"old")
    subprocess.run(["mount", "-o", "remount,ro", os.fspath(mnt)], check=True)
    with pytest.raises(OSError, match="mounted read-only") as err:  # issue 12 item 12
        write_file(mnt / "models" / "m.pte", scene.pieces(), consume=True)
    assert err.value.errno == errno.EROFS
    assert (mnt / "models" / "m.pte").read_bytes() == b"old"
    assert sorted(p.name for p in (mnt / "models").iterdir()) == ["m.pte"]
    scene.assert_nothing_lost()


def test_destination_in_a_directory_the_user_cannot_write_is_refused():
    # As root, a 0555 directory is writable; an unprivileged writer (uid
    # 65534, in a forked child) in a root-owned 0755 directory is not.
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    top = Path(tempfile.mkdtemp(prefix="trtet-unpriv-"))
    try:
        top.chmod(0o755)
        locked = top / "locked"
        locked.mkdir(mode=0o755)
        (locked / "m.pte").write_bytes(b"old")
        staging = top / "staging"
        staging.mkdir()
        staging.chmod(0o777)

        def child():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            store = BlobStore(staging)
            blob = store.put(b"b" * 100_000)
            try:
                write_file(locked / "m.pte", [b"h", blob], consume=True)
                outcome = "written"
            except PermissionError as exc:
                outcome = str(exc)
            ok = file_digest(blob.path) == blob.digest
            Path(staging / "result.txt").write_text(f"{ok}\n{outcome}")
            store.close()

        assert in_child(child) == 0
        ok, outcome = (staging / "result.txt").read_text().split("\n", 1)
        assert ok == "True"
        assert "its directory is not writable" in outcome, outcome
        assert (locked / "m.pte").read_bytes() == b"old"
        assert sorted(p.name for p in locked.iterdir()) == ["m.pte"]
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("consume", [True, False])
@pytest.mark.parametrize("alias", ["blob itself", "hard link", "symlink", "symlink to a hard link"])
def test_destination_that_is_a_source_is_refused(scene, alias, consume):
    if alias == "blob itself":
        dest = Path(scene.a.path)
    elif alias == "hard link":
        dest = scene.out / "link.pte"
        os.link(scene.b.path, dest)
    elif alias == "symlink":
        dest = scene.out / "sym.pte"
        dest.symlink_to(scene.a.path)
    elif alias == "symlink to a hard link":
        os.link(scene.a.path, scene.out / "hard.bin")
        dest = scene.out / "sym.pte"
        dest.symlink_to(scene.out / "hard.bin")
    before = scene.snapshot()
    with pytest.raises(ValueError, match=r"it is \(or links to\) the source of piece"):
        write_file(dest, scene.pieces(), consume=consume)
    assert scene.snapshot() == before
    for blob in (scene.a, scene.b):
        assert file_digest(blob.path) == blob.digest


@pytest.mark.parametrize("consume", [True, False])
@pytest.mark.parametrize("alias", ["user file", "hard link to the user file"])
def test_destination_that_is_a_user_file_among_the_sources_is_rewritten_from_it(scene, alias,
                                                                                 consume):
    # A user's file is only read, and before any rename, so a file may be
    # rewritten from its own bytes (the old one stays whole under its name
    # until the new one is complete); a blob's file may not (it could be moved).
    user = scene.user_file.read_bytes()
    a, b = Path(scene.a.path).read_bytes(), Path(scene.b.path).read_bytes()
    if alias == "user file":
        dest = scene.user_file
    else:
        dest = scene.out / "u-link.pte"
        os.link(scene.user_file, dest)
    write_file(dest, scene.pieces(), consume=consume)
    assert dest.read_bytes() == b"header" + a + b"\0" * 10 + user + b
    if alias != "user file":
        assert scene.user_file.read_bytes() == user  # its own name still holds the old bytes


def test_destination_that_is_a_source_of_another_output_is_refused(scene):
    with pytest.raises(ValueError, match="the source of piece"):
        write_files([(scene.dest, [b"x", scene.a]), (Path(scene.b.path), [b"y", scene.b])],
                    consume=True)
    scene.assert_nothing_lost()


@pytest.mark.parametrize("consume", [True, False])
@pytest.mark.parametrize("change", ["grown", "shrunk", "emptied"])
def test_source_resized_after_staging_is_refused(scene, change, consume):
    with open(scene.a.path, "r+b") as f:
        if change == "grown":
            f.seek(0, os.SEEK_END)
            f.write(b"more")
        else:
            f.truncate(1000 if change == "shrunk" else 0)
    scene.before = scene.snapshot()
    with pytest.raises(ValueError, match="changed after it was staged"):
        write_file(scene.dest, scene.pieces(), consume=consume)
    assert scene.snapshot() == scene.before


@pytest.mark.parametrize("consume", [True, False])
@pytest.mark.parametrize("where", ["first chunk", "middle chunk", "last byte"])
def test_source_whose_bytes_changed_after_staging_rolls_back(scene, where, consume):
    # Same size, other bytes: found by the chunk digests while (move) or
    # after (copy) placing; everything placed so far goes back.
    offset = {"first chunk": 0, "middle chunk": 150_000, "last byte": scene.a.size - 1}[where]
    with open(scene.a.path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))
    scene.before = scene.snapshot()
    with pytest.raises(VerificationError, match="does not match the digest recorded") as info:
        write_file(scene.dest, scene.pieces(), consume=consume, chunk_size=32 * KiB)
    assert info.value.errno == errno.EIO
    assert scene.snapshot() == scene.before  # the changed source is back as it was found
    assert file_digest(scene.b.path) == scene.b.digest


def test_user_file_that_vanished_is_refused(scene):
    pieces = scene.pieces()
    scene.user_file.unlink()
    scene.before = scene.snapshot()
    with pytest.raises(FileNotFoundError, match="source file is gone"):
        write_file(scene.dest, pieces, consume=True)
    assert scene.snapshot() == scene.before


def test_source_that_is_a_directory_is_refused(scene):
    with pytest.raises(ValueError, match="not a regular file"):
        write_file(scene.dest, [b"h", ExternalFile(scene.out, 4096)], consume=True)
    scene.assert_nothing_lost()


@pytest.mark.parametrize("case", ["not a piece", "released blob", "chunk size 0",
                                  "no outputs", "output named twice"])
def test_malformed_requests_are_refused_before_anything_happens(scene, case):
    if case == "not a piece":
        with pytest.raises(TypeError, match="expected bytes, Blob or ExternalFile"):
            write_file(scene.dest, [scene.a, 42], consume=True)
    elif case == "released blob":
        extra = scene.store.put(b"released")
        extra.close()
        scene.before = scene.snapshot()
        with pytest.raises(ValueError, match="was released"):
            write_file(scene.dest, [scene.a, extra], consume=True)
    elif case == "chunk size 0":
        with pytest.raises(ValueError, match="chunk_size must be positive"):
            write_file(scene.dest, scene.pieces(), consume=True, chunk_size=0)
    elif case == "no outputs":
        with pytest.raises(ValueError, match="no outputs"):
            write_files([], consume=True)
    else:
        with pytest.raises(ValueError, match="named twice"):
            write_files([(scene.dest, [scene.a]), (scene.out / "." / "m.pte", [scene.b])],
                        consume=True)
    scene.assert_nothing_lost()


def test_a_blob_used_twice_is_copied_not_consumed(scene):
    report = write_file(scene.dest, [scene.a, b"|", scene.a], consume=True)
    assert [p.placement for p in report.placements] == ["copy", "copy"]
    assert "used more than once" in report.placements[0].reason
    data = content(1, 300_001)
    assert scene.dest.read_bytes() == data + b"|" + data
    assert file_digest(scene.a.path) == scene.a.digest


# -- two writers racing for one destination ----------------------------------------------


@pytest.mark.parametrize("second", ["same path", "through a symlink"])
def test_second_writer_of_a_destination_is_refused(scene, second):
    blocked, go = threading.Event(), threading.Event()
    first = {}

    def progress(done, total):
        blocked.set()
        go.wait(30)

    def writer():
        try:
            write_file(scene.dest, [b"first", scene.a], consume=True, progress=progress)
            first["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - reported below
            first["error"] = exc

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert blocked.wait(30)
        other = scene.out / "alias.pte"
        if second == "through a symlink":
            other.symlink_to(scene.dest)
        target = other if second == "through a symlink" else scene.dest
        b_digest = file_digest(scene.b.path)
        with pytest.raises(ConcurrentWriteError, match="another write to .* is in progress") \
                as info:
            write_file(target, [b"second", scene.b], consume=True)
        assert info.value.errno == errno.EAGAIN
        assert file_digest(scene.b.path) == b_digest
    finally:
        go.set()
        thread.join(30)
    assert first.get("ok"), first.get("error")
    assert scene.dest.read_bytes() == b"first" + content(1, 300_001)


def test_writers_in_two_processes_racing_for_one_destination(scene):
    # The first writer is a forked child that stops in its progress callback
    # until the parent has tried (and failed) to write the same destination.
    r, w = os.pipe()
    r2, w2 = os.pipe()

    def child():
        os.close(r)
        os.close(w2)

        def progress(done, total):
            if done == 6:  # the inline bytes are in: journal, lock and temp exist
                os.write(w, b"locked")
                os.read(r2, 1)

        write_file(scene.dest, [b"child!", scene.a], consume=True, progress=progress)

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            child()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(r2)
    try:
        assert os.read(r, 16) == b"locked"
        with pytest.raises(ConcurrentWriteError):
            write_file(scene.dest, [b"parent", scene.b], consume=True)
        assert file_digest(scene.b.path) == scene.b.digest
    finally:
        os.write(w2, b"g")
        _, status = os.waitpid(pid, 0)
        os.close(r)
        os.close(w2)
    assert os.waitstatus_to_exitcode(status) == 0
    assert scene.dest.read_bytes() == b"child!" + content(1, 300_001)
    assert sorted(p.name for p in scene.out.iterdir()) == ["m.pte"]


# -- a disk that fills up during the write -------------------------------------------------


def fill(directory: Path) -> Path:
    """Take every free byte of ``directory``'s filesystem (as a process racing us would)."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    offset = 0
    try:
        for step in (fs.free_bytes(directory), 16 * MiB, MiB, 64 * KiB, 4 * KiB):
            while step:
                try:
                    os.posix_fallocate(fd, offset, step)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                offset += step
    finally:
        os.close(fd)
    return path


@pytest.mark.parametrize("consume", [True, False], ids=["move", "copy"])
@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_disk_filled_after_the_preflight_rolls_back(make_fs, fstype, consume):
    mnt = make_fs(fstype, 300 if fstype == "xfs" else 128)
    store = BlobStore(mnt / "staging", chunk_size=64 * KiB)
    blob = store.put(content(7, 24 * MiB))
    dest = mnt / "out" / "m.pte"
    dest.parent.mkdir()
    dest.write_bytes(b"old")
    before = snapshot(mnt / "staging", mnt / "out")
    fillers = []

    def progress(done, total):
        if not fillers:  # right after the preflight passed and the temp file was made
            fillers.append(fill(mnt))

    with pytest.raises(OSError) as info:
        write_file(dest, [b"h" * 100, blob], consume=consume, chunk_size=MiB, progress=progress)
    assert info.value.errno == errno.ENOSPC
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "filled up during the write" in notes and "rolled back" in notes, notes
    assert snapshot(mnt / "staging", mnt / "out") == before
    assert file_digest(blob.path) == blob.digest
    fillers[0].unlink()
    assert recover(dest.parent) == []
    store.close()


@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_disk_filled_in_the_middle_of_a_move_loses_nothing(make_fs, fstype):
    # Giving moved bytes back needs one step of free space. If another
    # process takes every byte while a move is half done, the rollback
    # cannot finish: the error says so and what to do, the journal keeps
    # track of every byte, and recover() finishes once space is freed.
    mnt = make_fs(fstype, 300 if fstype == "xfs" else 128)
    store = BlobStore(mnt / "staging", chunk_size=64 * KiB)
    blob = store.put(content(8, 24 * MiB))
    digest = blob.digest
    dest = mnt / "out" / "m.pte"
    dest.parent.mkdir()
    dest.write_bytes(b"old")
    fillers = []
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 12 and not fillers:  # ten steps of the move are done
            fillers.append(fill(mnt))

    with pytest.raises(OSError) as info:
        write_file(dest, [b"h" * 100, blob], consume=True, chunk_size=MiB, progress=progress)
    assert info.value.errno == errno.ENOSPC
    notes = "\n".join(getattr(info.value, "__notes__", []))
    if "rollback did not complete" in notes:
        assert f"trtet-store recover {dest.parent}" in notes and "needs" in notes, notes
        fillers[0].unlink()
        outcomes = recover(dest.parent)
        assert [o.action for o in outcomes] == ["rolled back"], outcomes
    else:  # the filesystem found room for the rollback after all
        fillers[0].unlink()
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m.pte"]
    assert file_digest(blob.path) == digest
    store.close()
