"""io's primitives that the cache and the engine cache used to copy (issue 41 item 1).

``clone_or_copy`` on real loop filesystems: XFS (reflink=1) shares the
blocks, ext4 copies, two filesystems copy by read/write, and a size past the
source's end is EIO as before; ``try_lock(shared=True)`` between real
processes: shared holders coexist, an exclusive lock is refused while one
holds (and the other way round); ``write_atomic(temp_dir=)`` makes its temp
file where its owner's recovery looks and leaves nothing when it fails.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from digests import digest, file_digest

from trtet_store.io import (
    UnsafeLockFileError,
    clone_or_copy,
    digest_fd,
    digest_file,
    release,
    try_lock,
    write_atomic,
)

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


def _source(directory: Path, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = directory / "src"
    path.write_bytes(data)
    os.sync()  # so the free-space reading below sees only what the clone/copy takes
    return path, data


def _take(src: Path, dst: Path, size: int, **kwargs) -> str:
    sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        return clone_or_copy(sfd, dfd, size, **kwargs)
    finally:
        os.close(dfd)
        os.close(sfd)


def _used(mnt: Path) -> int:
    os.sync()
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.parametrize("fstype, placement", [("xfs", "clone"), ("ext4", "copy")])
def test_clone_or_copy_clones_on_xfs_and_copies_on_ext4(make_fs, fstype, placement):
    mnt = make_fs(fstype, 400 if fstype == "xfs" else 128)
    size = 16 * MiB + 5  # not block-aligned: a clone to the source's end takes the tail too
    src, data = _source(mnt, size)
    before = _used(mnt)
    assert _take(src, mnt / "dst", size) == placement
    assert (mnt / "dst").read_bytes() == data
    assert file_digest(src) == digest(data)  # the source is intact
    grew = _used(mnt) - before
    if placement == "clone":
        # shared, not copied: a copy takes the 16 MiB; the bound leaves XFS room for the
        # metadata a reflink adds (the refcount btree, log) however busy the machine is
        assert grew < size // 2, f"a clone took {grew} bytes of disk"
    else:
        assert grew >= size - MiB, f"a copy took only {grew} bytes"


def test_clone_or_copy_between_two_filesystems_copies_by_read_and_write(make_fs):
    """ext4 -> tmpfs: FICLONERANGE and copy_file_range both refuse (EXDEV); read/write copies."""
    a, b = make_fs("ext4", 64), make_fs("tmpfs", 64)
    size = 9 * MiB + 123  # more than one read of the fallback (8 MiB)
    src, data = _source(a, size)
    assert _take(src, b / "dst", size) == "copy"
    assert (b / "dst").read_bytes() == data


@pytest.mark.parametrize("fstype", ["xfs", "ext4"])
@pytest.mark.parametrize("what", [None, "the cached engine"])
def test_a_size_past_the_end_of_the_source_is_eio_as_before(make_fs, fstype, what):
    """The two copies this replaces said "source ended at N of M bytes" (the cache) and "the
    cached engine ended at ..." (the engine cache): a clone of another length is not taken,
    and the copy stops at the source's end."""
    mnt = make_fs(fstype, 400 if fstype == "xfs" else 64)
    size = 3 * MiB
    src, data = _source(mnt, size)
    kwargs = {} if what is None else {"what": what}
    with pytest.raises(OSError) as info:
        _take(src, mnt / "dst", size + 4096, **kwargs)
    assert info.value.errno == errno.EIO
    assert str(info.value) == (f"[Errno 5] {what or 'source'} ended at {size} of "
                               f"{size + 4096} bytes")
    assert (mnt / "dst").read_bytes() == data  # what was there, nothing invented


def test_clone_or_copy_of_nothing_is_a_copy_of_nothing(make_fs):
    mnt = make_fs("xfs", 400)
    src, _ = _source(mnt, 0)
    assert _take(src, mnt / "dst", 0) == "copy"
    assert (mnt / "dst").read_bytes() == b""


def test_digest_fd_is_digest_file(here_fs):
    path = here_fs / "f"
    path.write_bytes(os.urandom(3 * MiB + 7))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert digest_fd(fd, MiB) == digest_file(path, MiB, drop_cached=False)
    finally:
        os.close(fd)
    assert digest_file(path, MiB, drop_cached=False)[0] == file_digest(path)


# -- try_lock(shared=True), between processes ----------------------------------------------

_HOLDER = """
import fcntl, os, sys
from trtet_store.io import try_lock
path, mode = sys.argv[1], sys.argv[2]
if mode == "directory":  # as a pruning save asks for a version: exclusive, never waiting
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fd = None
else:
    fd = try_lock(path, create=False, readonly=True, shared=mode == "shared")
print("held" if fd is not None else "refused", flush=True)
sys.stdin.read()  # hold until the test closes our stdin
"""


class _Holder:
    """Another process that asks for ``path``'s lock (shared or exclusive, never waiting)
    and holds what it got until :meth:`stop`."""

    def __init__(self, path: Path, mode: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.fspath(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, os.fspath(path), mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        self.answer = self.proc.stdout.readline().strip()

    def stop(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0


def answer_of(path: Path, mode: str) -> str:
    """What another process is answered when it asks for ``path``'s lock now (then it lets go)."""
    holder = _Holder(path, mode)
    try:
        return holder.answer
    finally:
        holder.stop()


def test_shared_holders_coexist_and_an_exclusive_one_is_refused(here_fs):
    path = here_fs / "pin"
    path.write_bytes(b"")
    fd = try_lock(path, create=False, readonly=True, shared=True)
    assert fd is not None
    try:
        other = _Holder(path, "shared")
        assert other.answer == "held"  # a second reader, in another process, pins it too
        try:
            assert answer_of(path, "exclusive") == "refused"
        finally:
            other.stop()
        # Our own pin still holds after the other reader left.
        assert answer_of(path, "exclusive") == "refused"
    finally:
        release(fd)
    writer = _Holder(path, "exclusive")
    assert writer.answer == "held"  # the last pin gone, an exclusive lock is had
    try:
        assert try_lock(path, create=False, readonly=True, shared=True) is None
    finally:
        writer.stop()


def test_a_directory_is_pinned_shared_as_a_version_is(here_fs):
    """A reader's pin of a version directory keeps a pruning save's exclusive lock off, and a
    save that holds it keeps the pin off."""
    version = here_fs / "version-1"
    version.mkdir()
    fd = try_lock(version, create=False, readonly=True, shared=True)
    assert fd is not None
    try:
        assert answer_of(version, "shared") == "held"
        assert answer_of(version, "directory") == "refused"
    finally:
        release(fd)
    pruner = _Holder(version, "directory")
    try:
        assert pruner.answer == "held"
        assert try_lock(version, create=False, readonly=True, shared=True) is None
    finally:
        pruner.stop()


def test_a_shared_pin_is_refused_on_a_link_and_a_fifo_and_an_exclusive_lock_on_a_directory(
        here_fs):
    target = here_fs / "target"
    target.write_bytes(b"x")
    os.symlink(target, here_fs / "link")
    os.mkfifo(here_fs / "fifo")
    (here_fs / "dir").mkdir()
    for name in ("link", "fifo"):
        with pytest.raises(UnsafeLockFileError, match=f"refusing the lock file .*/{name}: "):
            try_lock(here_fs / name, create=False, readonly=True, shared=True)
    with pytest.raises(UnsafeLockFileError, match="it is not a regular file"):
        try_lock(here_fs / "dir", create=False, readonly=True)
    assert target.read_bytes() == b"x"


def test_a_pin_waits_for_the_exclusive_holder_and_refuses_a_file_replaced_meanwhile(here_fs):
    """``wait=True``: the pin waits for an exclusive holder; when the file at the path was
    replaced meanwhile (a put repairing a blob), the inode it waited on is not pinned:
    FileNotFoundError, as ``create=False`` reports a file that is no longer the one locked."""
    import threading

    path = here_fs / "blob"
    path.write_bytes(b"old")
    holder = _Holder(path, "exclusive")
    assert holder.answer == "held"
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(_pin_or_error(path)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and got == []  # it waits
    (here_fs / "new").write_bytes(b"new")
    os.rename(here_fs / "new", path)
    holder.stop()
    waiter.join(30)
    assert len(got) == 1 and isinstance(got[0], FileNotFoundError), got
    fd = try_lock(path, create=False, readonly=True, shared=True, wait=True)
    assert fd is not None and os.pread(fd, 3, 0) == b"new"
    release(fd)


def _pin_or_error(path: Path) -> object:
    try:
        return try_lock(path, create=False, readonly=True, shared=True, wait=True)
    except OSError as exc:
        return exc


# -- write_atomic(temp_dir=) -----------------------------------------------------------------

def test_write_atomic_makes_its_temp_file_in_temp_dir(make_fs, here_fs):
    """The cache writes seals and records with their temp file in its tmp/, where recovery
    looks. A temp_dir on another filesystem proves where the temp file was made (the rename
    fails, EXDEV), and that a failure leaves the target as it was and no file anywhere."""
    out, tmp = here_fs / "keys", here_fs / "tmp"
    out.mkdir(mode=0o700)
    tmp.mkdir(mode=0o700)
    write_atomic(out / "k.json", b"one", temp_dir=tmp)
    assert (out / "k.json").read_bytes() == b"one"
    assert sorted(os.listdir(out)) == ["k.json"] and os.listdir(tmp) == []
    elsewhere = make_fs("tmpfs", 16)
    os.chmod(elsewhere, 0o700)
    with pytest.raises(OSError) as info:
        write_atomic(out / "k.json", b"two", temp_dir=elsewhere)
    assert info.value.errno == errno.EXDEV
    assert (out / "k.json").read_bytes() == b"one"
    assert sorted(os.listdir(out)) == ["k.json"] and os.listdir(elsewhere) == []
    with pytest.raises(FileExistsError):
        write_atomic(out / "k.json", b"three", replace=False, temp_dir=tmp)
    assert (out / "k.json").read_bytes() == b"one" and os.listdir(tmp) == []


# -- the cache's pin, on try_lock(shared=True) ----------------------------------------------

def test_a_cache_blob_replaced_by_a_link_is_dropped_never_followed(here_fs):
    """The pin opens the blob with O_NOFOLLOW (try_lock): a link put in blobs/ (here to a
    file with the very bytes sealed) is dropped as not a regular file, never served, and its
    target is left as it was."""
    from trtet_store.cache import BlobCache

    cache = BlobCache(here_fs / "c", max_bytes=16 * MiB)
    data = os.urandom(MiB + 1)
    (here_fs / "src").write_bytes(data)
    put = cache.put("k", here_fs / "src")
    assert put.stored
    blob = cache.directory / "blobs" / f"{put.digest}-{put.size}"
    target = here_fs / "elsewhere"
    target.write_bytes(data)
    os.unlink(blob)
    os.symlink(target, blob)
    assert cache.get("k") is None
    assert cache.dropped["k"] == "the blob is not a regular file"
    assert not os.path.lexists(blob) and cache.entries() == []
    assert file_digest(target) == digest(data)
