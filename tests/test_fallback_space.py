"""Invariant 4 for the placements' fallbacks: a save that cannot fit fails before changing a thing.

The preflight budgets each payload by its planned placement. Two plans can
change on the way: a clone the filesystem refuses after all (EOPNOTSUPP,
EXDEV, ...) is copied, and an insert that fails is moved; and recovery
copies again what a dead writer cloned. Each test here gives the disk room
for the cheap placement and not for its fallback, on a real filesystem, and
checks that the write (or the recovery) says so with
:class:`InsufficientSpaceError` before writing a payload byte, leaving the
sources byte-identical, the destination as it was and no temp file.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from digests import digest, file_digest
from faults import WrappedCalls

from trtet_store import BlobStore, recover, write_file
from trtet_store.io import fs, names
from trtet_store.io.errors import InsufficientSpaceError

MiB = 1 << 20
PAYLOAD = 64 * MiB
HEADER = b"H" * 4096


class Refuse(WrappedCalls):
    """Each call named in ``refuse`` fails with its errno (a fallocate only with ``mode``), as
    where the capability cache said it works. Every write (``pwrite``, ``copy_file_range``)
    is recorded by the name of the file it went to, and whether it came after a refusal."""

    WRITES = {"pwrite": 0, "copy_file_range": 1}  # which argument is the written fd

    def __init__(self, refuse: dict[str, int] | None = None, mode: int | None = None) -> None:
        self.refuse, self.mode = refuse or {}, mode
        self.refused: list[str] = []
        self.writes: list[tuple[bool, str]] = []

    def _wrap(self, name, real):
        def call(*args):
            if name in self.WRITES:
                target = os.readlink(f"/proc/self/fd/{args[self.WRITES[name]]}")
                self.writes.append((bool(self.refused), os.path.basename(target)))
            if name in self.refuse and (self.mode is None or args[1] == self.mode):
                self.refused.append(name)
                raise OSError(self.refuse[name], os.strerror(self.refuse[name]))
            return real(*args)
        return call

    def temp_writes(self, *, after_refusal: bool = True) -> list[str]:
        """Temp (and backup) files written to, after the first refusal or at all."""
        return [n for refused, n in self.writes
                if (refused or not after_refusal) and names.temp_token(n) is not None]


def no_sharing(clone_errno: int) -> Refuse:
    """A filesystem that shares no blocks after all: FICLONERANGE refused, and
    copy_file_range copying no more than pread/pwrite would (on XFS or btrfs it would
    share the blocks, so it is refused too, and the copy is written byte by byte)."""
    return Refuse({"clone_range": clone_errno, "copy_file_range": errno.EOPNOTSUPP})


def fill(mnt: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of free space (allocated, so nothing is written)."""
    os.sync()
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, fs.free_bytes(mnt) - leave)
    os.sync()
    assert fs.free_bytes(mnt) <= leave + MiB


def temps(*directories: Path) -> list[str]:
    return sorted(p.name for d in directories for p in d.iterdir() if ".trtet-" in p.name)


def listing(*directories: Path) -> dict[str, str]:
    """Every file's name and digest: what a test compares before and after."""
    return {f"{p.parent.name}/{p.name}": file_digest(p) if p.is_file() else "dir"
            for d in directories for p in sorted(d.iterdir()) if p.name != "filler"}


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EXDEV])
@pytest.mark.parametrize("consume", [False, True])
def test_a_clone_falling_back_to_a_copy_that_cannot_fit_refuses_before_writing(
        make_fs, code, consume):
    """Room for the clone, not for the copy it falls back to: refused, nothing lost."""
    mnt = make_fs("xfs", 400)
    fs.capabilities.clear()
    dest = mnt / "m.pte"
    dest.write_bytes(b"the old model")
    with BlobStore(mnt / "s") as store:
        data = os.urandom(PAYLOAD)
        blob = store.put(data)
        fs.probe_clone(Path(blob.path), mnt)  # the cache says: clone works here
        fill(mnt, 16 * MiB)  # a clone needs ~1 MiB, its copy 64
        before = listing(mnt, mnt / "s")
        with no_sharing(code) as refused, pytest.raises(InsufficientSpaceError) as info:
            write_file(dest, [HEADER, blob], consume=consume)
        err = info.value
        assert err.needed > err.available
        assert err.needed >= PAYLOAD and err.path == os.fspath(dest)
        assert "clone failed" in str(err) and "copied" in str(err)
        assert any("rolled back" in n for n in getattr(err, "__notes__", []))
        # Refused before the copy's first byte: nothing was written to the temp file after
        # the clone was refused (its rollback writes only the journal).
        assert refused.refused == ["clone_range"], refused.refused
        assert refused.temp_writes() == [], refused.writes
        assert file_digest(blob.path) == digest(data)
        assert not blob.consumed
        assert listing(mnt, mnt / "s") == before
        assert temps(mnt, mnt / "s") == []
        assert dest.read_bytes() == b"the old model"


def test_a_clone_falling_back_to_a_copy_that_fits_is_copied(make_fs):
    """The same refusal with room for the copy: the write succeeds by copying."""
    mnt = make_fs("xfs", 400)
    fs.capabilities.clear()
    with BlobStore(mnt / "s") as store:
        data = os.urandom(PAYLOAD)
        blob = store.put(data)
        fs.probe_clone(Path(blob.path), mnt)
        fill(mnt, PAYLOAD + 8 * MiB)
        with no_sharing(errno.EOPNOTSUPP) as refused:
            report = write_file(mnt / "m.pte", [HEADER, blob])
        assert refused.refused[0] == "clone_range"
        assert [p.placement for p in report.placements] == ["copy"]
        assert file_digest(blob.path) == digest(data)
    assert file_digest(mnt / "m.pte") == digest(HEADER + data)
    assert temps(mnt) == []


def test_a_clone_falling_back_keeps_the_room_the_rest_of_the_write_needs(make_fs):
    """Room for the clone's copy alone, not for it and the copy still to come: refused
    before the fallback's first byte, not by ENOSPC in the middle of the next payload."""
    mnt = make_fs("xfs", 400)
    fs.capabilities.clear()
    dest = mnt / "m.pte"
    dest.write_bytes(b"the old model")
    with BlobStore(mnt / "s") as store:
        cloned, copied = os.urandom(PAYLOAD), os.urandom(PAYLOAD // 2)
        a, b = store.put(cloned), store.put(copied)
        fs.probe_clone(Path(a.path), mnt)
        # b at an unaligned offset is planned as a copy (the preflight budgets it);
        # a, last in the file, is placed first, and its clone is refused.
        head = HEADER + b"y" * 100
        pad = b"\0" * (-(len(head) + len(copied)) % 4096)
        fill(mnt, PAYLOAD + PAYLOAD // 4)  # a's copy fits; a's and b's do not
        before = listing(mnt, mnt / "s")
        with no_sharing(errno.EOPNOTSUPP) as refused, \
                pytest.raises(InsufficientSpaceError) as info:
            write_file(dest, [head, b, pad, a])
        assert info.value.needed >= PAYLOAD + PAYLOAD // 2, info.value
        assert refused.refused == ["clone_range"], refused.refused
        assert refused.temp_writes() == [], refused.writes
        assert [file_digest(x.path) for x in (a, b)] == [digest(cloned), digest(copied)]
        assert listing(mnt, mnt / "s") == before
        assert temps(mnt, mnt / "s") == []
        assert dest.read_bytes() == b"the old model"


@pytest.mark.parametrize("insert_fails", [False, True])
def test_an_insert_is_budgeted_as_the_move_it_may_fall_back_to(make_fs, insert_fails):
    """Room for the insert (a header), not for a move's step: refused before anything exists.

    Where the insert would have worked this refuses a write that would have
    fitted; the price of never running out of room mid-write when it does
    not work (the probe tries a scratch file, and caches).
    """
    mnt = make_fs("ext4", 64)
    fs.capabilities.clear()
    with BlobStore(mnt / "s", chunk_size=MiB) as store:
        data = os.urandom(8 * MiB)
        blob = store.put(data)
        fill(mnt, 5 * MiB)  # a header and the 1 MiB slack fit; a move's two 4 MiB steps do not
        before = listing(mnt, mnt / "s")
        refused = (Refuse({"fallocate": errno.EOPNOTSUPP}, fs.FALLOC_FL_INSERT_RANGE)
                   if insert_fails else Refuse())
        with refused, pytest.raises(InsufficientSpaceError) as info:
            write_file(mnt / "m.pte", [HEADER, blob], consume=True, chunk_size=8 * MiB)
        assert info.value.needed > info.value.available
        assert refused.refused == []  # refused by the preflight: no insert was tried
        assert refused.temp_writes(after_refusal=False) == []  # nor any temp file made
        assert file_digest(blob.path) == digest(data)
        assert listing(mnt, mnt / "s") == before
        assert temps(mnt, mnt / "s") == []
        assert not (mnt / "m.pte").exists()


# -- recovery: a dead writer's clone, refused when recovery clones it again -----------------

CHILD = textwrap.dedent("""
    import os, sys
    from trtet_store import BlobStore, write_file
    from trtet_store.io import fs, names

    mnt = sys.argv[1]
    real_fsync, real_clone = fs.calls.fsync, fs.calls.clone_range
    cloned = []

    def clone_range(*args):
        cloned.append(1)
        return real_clone(*args)

    def fsync(fd):
        if cloned:  # the temp file's fsync before publish: the clone is done
            os._exit(3)
        return real_fsync(fd)

    fs.calls.clone_range, fs.calls.fsync = clone_range, fsync
    store = BlobStore(os.path.join(mnt, "s"))
    blob = store.put(open(os.path.join(mnt, "payload"), "rb").read())
    write_file(os.path.join(mnt, "m.pte"), [b"H" * 4096, blob])
    os._exit(4)  # not reached: the write dies before it publishes
""")


def dead_writers_clone(make_fs) -> tuple[Path, bytes, Path]:
    """XFS where a writer died after cloning a 64 MiB blob over ``m.pte``'s old bytes:
    the mount, the payload's bytes and the destination."""
    mnt = make_fs("xfs", 400)
    data = os.urandom(PAYLOAD)
    (mnt / "payload").write_bytes(data)
    dest = mnt / "m.pte"
    dest.write_bytes(b"the old model")
    child = subprocess.run([sys.executable, "-c", CHILD, os.fspath(mnt)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 3, child.stderr
    return mnt, data, dest


@pytest.mark.parametrize("shares", [True, False])
def test_recovery_of_a_dead_writers_clone_checks_for_room_before_copying(make_fs, shares):
    """A writer died after cloning; the disk filled since. Recovery clones it again (no
    room needed); where the clone is refused now, it must find that the copy cannot fit
    before copying, and roll back, rather than run into ENOSPC."""
    mnt, data, dest = dead_writers_clone(make_fs)
    os.unlink(mnt / "payload")
    assert temps(mnt), "the dead writer left its temp file and journal"
    (blob_path,) = (mnt / "s").glob("*.blob")
    assert file_digest(blob_path) == digest(data)
    fill(mnt, 16 * MiB)  # the clone cost nothing; a copy needs 64 MiB
    with (Refuse() if shares else no_sharing(errno.EOPNOTSUPP)) as seen:
        outcomes = recover(mnt)
    mine = [o for o in outcomes if o.outputs == [os.fspath(dest)]]
    if shares:
        assert [o.action for o in mine] == ["rolled forward"], outcomes
        assert file_digest(dest) == digest(b"H" * 4096 + data)
        assert temps(mnt) == []
        return
    assert [o.action for o in mine] == ["rolled back"], outcomes
    assert "not enough free space" in mine[0].detail, mine[0].detail
    assert "No space left" not in mine[0].detail
    assert seen.refused == ["clone_range"], seen.refused
    assert seen.temp_writes(after_refusal=False) == [], seen.writes  # no copy was begun
    assert file_digest(blob_path) == digest(data)
    assert dest.read_bytes() == b"the old model"
    assert temps(mnt) == []


def test_recovery_of_a_dead_writers_clone_checks_the_bytes_it_cloned_again(make_fs):
    """A writer died after cloning; its source changed before recovery. Recovery clones it
    again and must find, by the one digest of chunk digests the journal keeps for a clone,
    that the bytes are not the staged ones, and roll back rather than publish them."""
    mnt, data, dest = dead_writers_clone(make_fs)
    (blob_path,) = (mnt / "s").glob("*.blob")
    with open(blob_path, "r+b") as f:  # one byte in the middle of one chunk
        f.seek(PAYLOAD // 2 + 12345)
        f.write(bytes([data[PAYLOAD // 2 + 12345] ^ 0xFF]))
    outcomes = recover(mnt)
    mine = [o for o in outcomes if o.outputs == [os.fspath(dest)]]
    assert [o.action for o in mine] == ["rolled back"], outcomes
    assert "cloned bytes in temp" in mine[0].detail, mine[0].detail
    assert dest.read_bytes() == b"the old model"
    assert temps(mnt) == []
