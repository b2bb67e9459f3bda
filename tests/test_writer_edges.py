"""Issue 12 hardening of the writer: tampering, modes, long names, journals, errors, capabilities.

Every failure-path test checks that nothing was lost: the sources are
byte-identical (by digest), the destination untouched, no temp file left.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_dying import DIED, die, in_child
from digests import digest, file_digest
from faults import FaultInjector, WrappedCalls

from trtet_store import BlobStore, ConcurrentWriteError, recover, write_file
from trtet_store.io import Blob, fs, lock
from trtet_store.io.errors import BlobChangedError, InsufficientSpaceError
from trtet_store.io.names import lock_path_of
from trtet_store.io.units import MiB


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def no_temps(*directories: Path) -> None:
    for d in directories:
        left = [n for n in names(d) if ".trtet-" in n]
        assert left == [], left


def tamper(path: os.PathLike | str, offset: int) -> None:
    """Change one byte in place, keeping the size (what a stray writer does)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# -- 5. a blob changed after staging, placed by clone or insert ---------------------------


@pytest.mark.parametrize("fstype,placement", [("xfs", "clone"), ("ext4", "insert")])
@pytest.mark.parametrize("when", ["before", "during"])
@pytest.mark.parametrize("adopted", [False, True])
def test_a_blob_changed_after_staging_is_not_published_by_zero_copy(make_fs, fstype, placement,
                                                                      when, adopted):
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "s")
    data = os.urandom(4 * MiB)
    if adopted:
        (mnt / "user.bin").write_bytes(data)
        blob = store.adopt(mnt / "user.bin")
    else:
        blob = store.put(data)
    dest = mnt / "m.pte"
    dest.write_bytes(b"old")
    consume = placement == "insert"

    class TamperDuring(WrappedCalls):
        """Change the blob inside the placement: at the clone call (checked after it), or
        for an insert right after the host was renamed into place (checked on the open
        file before room is inserted; the fallocate call itself is the one window left)."""

        def _wrap(self, name, real):
            def call(*args):
                if self.done:
                    return real(*args)
                if name == "clone_range":
                    self.done = True
                    tamper(blob.path, 2 * MiB)
                elif name == "open" and os.fspath(args[0]).endswith(".tmp") and \
                        os.path.exists(args[0]):
                    self.done = True
                    tamper(args[0], 2 * MiB)
                return real(*args)
            return call

    if when == "before":
        tamper(blob.path, 2 * MiB)
        ctx = FaultInjector()
    else:
        ctx = TamperDuring()
        ctx.done = False
    tampered = file_digest(blob.path) if when == "before" else None
    with ctx, pytest.raises(BlobChangedError, match="changed after it was staged"):
        write_file(dest, [b"H" * 4096, blob], consume=consume)
    assert dest.read_bytes() == b"old"
    assert Path(blob.path).exists() and os.path.getsize(blob.path) == 4 * MiB
    if tampered is not None:
        assert file_digest(blob.path) == tampered  # as the user left it: nothing of ours
    assert not blob.consumed
    no_temps(mnt)
    store.close()


@pytest.mark.parametrize("fstype,placement", [("xfs", "clone"), ("ext4", "insert")])
def test_adopt_reads_nothing_and_zero_copy_stays_o1(make_fs, fstype, placement):
    mnt = make_fs(fstype, 400)
    fs.capabilities.clear()
    src = mnt / "payload.bin"
    with open(src, "wb") as f:
        f.truncate(64 * MiB)  # sparse: a read would still cost time per byte
    with FaultInjector() as inj, BlobStore(mnt / "s") as store:
        blob = store.adopt(src)
        assert not blob.has_digests
        report = write_file(mnt / "m.pte", [b"H" * 4096, blob], consume=placement == "insert")
    assert "pread" not in inj.log, inj.log
    assert report.placements[0].placement == placement
    assert os.path.getsize(mnt / "m.pte") == 4096 + 64 * MiB


def test_adopted_blob_is_digested_where_a_move_reads_it(here_fs):
    src = here_fs / "p.bin"
    data = os.urandom(3 * MiB + 5)
    src.write_bytes(data)
    with BlobStore(here_fs / "s", chunk_size=MiB) as store:
        blob = store.adopt(src)
        assert not blob.has_digests
        write_file(here_fs / "m.pte", [b"h", blob], consume=True, placements=["move"])
        assert blob.consumed
    assert (here_fs / "m.pte").read_bytes() == b"h" + data


# -- 6. capability cache on a reused loop device; placement-time fallbacks; preflight ------


def test_capability_cache_tells_apart_two_filesystems_on_one_loop_device(make_fs, fs_factory):
    """XFS's f_fsid is its device number: (st_dev, f_fsid) repeats on a reused loop device."""
    fs.capabilities.clear()
    from filesystems import FilesystemUnavailable

    try:
        first = fs_factory.make("xfs", 300)  # released by hand, so not through make_fs
    except FilesystemUnavailable as exc:
        pytest.skip(str(exc))
    ident = fs.fs_identity(first)
    old_key = (os.stat(first).st_dev, os.statvfs(first).f_fsid)
    for problem in fs_factory.release(first):
        pytest.fail(problem)
    second = make_fs("xfs", 300)
    if (os.stat(second).st_dev, os.statvfs(second).f_fsid) != old_key:
        pytest.skip("the loop device was not reused, so the old key differs anyway")
    assert fs.fs_identity(second) != ident


class Unsupported(WrappedCalls):
    """``name`` fails with ``code`` (for a fallocate: only with ``mode``), as on a filesystem
    that cannot do it though the cache said it could."""

    def __init__(self, name: str, code: int, mode: int | None = None) -> None:
        self.name, self.code, self.mode, self.fired = name, code, mode, 0

    def _wrap(self, name, real):
        def call(*args):
            if name == self.name and (self.mode is None or args[1] == self.mode):
                self.fired += 1
                raise OSError(self.code, os.strerror(self.code))
            return real(*args)
        return call


@contextlib.contextmanager
def placed_despite(mnt: Path, failure: Unsupported, *, consume: bool = False,
                   clone_cached: bool = False) -> Iterator[tuple[str, Blob, bytes]]:
    """Write a 4 KiB header and a 4 MiB blob to ``mnt/m.pte`` while ``failure`` fails the
    placement; yield (the placement the report names, the blob, its bytes) with the store
    still open, then check the output is complete and no temp file is left.

    Parameters
    ----------
    mnt : Path
        A fresh filesystem; its capability cache is cleared first.
    failure : Unsupported
        The call that fails; it must have fired.
    consume : bool
        Whether the write consumes the blob.
    clone_cached : bool
        Probe clone first, so that the cache says clone works here.
    """
    fs.capabilities.clear()
    with BlobStore(mnt / "s") as store:
        data = os.urandom(4 * MiB)
        blob = store.put(data)
        if clone_cached:
            fs.probe_clone(blob.path, mnt)
        with failure:
            report = write_file(mnt / "m.pte", [b"H" * 4096, blob], consume=consume)
        assert failure.fired
        yield report.placements[0].placement, blob, data
    assert (mnt / "m.pte").read_bytes() == b"H" * 4096 + data
    no_temps(mnt)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL])
def test_a_clone_that_fails_at_placement_falls_back_to_copy(make_fs, code):
    mnt = make_fs("xfs", 400)
    with placed_despite(mnt, Unsupported("clone_range", code),
                        clone_cached=True) as (placement, blob, data):
        assert placement == "copy"
        assert file_digest(blob.path) == digest(data)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_an_insert_that_fails_at_placement_falls_back_to_a_move(make_fs, code):
    mnt = make_fs("ext4", 200)
    with placed_despite(mnt, Unsupported("fallocate", code, fs.FALLOC_FL_INSERT_RANGE),
                        consume=True) as (placement, blob, _):
        assert placement == "move"
        assert blob.consumed
    acts = recover(mnt)  # only orphans may be left to report
    assert all(o.action == "orphan" for o in acts), (acts)


def test_preflight_counts_a_moves_step(make_fs):
    """A move needs one step of free space: short of it, refused before anything exists."""
    mnt = make_fs("ext4", 64)
    with BlobStore(mnt / "s", chunk_size=MiB) as store:
        data = os.urandom(8 * MiB)
        blob = store.put(data)
        os.sync()
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            # leave 1 MiB of slack + 4 MiB: half of the 8 MiB step the move needs
            free = fs.free_bytes(mnt)
            os.posix_fallocate(f.fileno(), 0, free - 5 * MiB)
        os.sync()
        before = names(mnt)
        with pytest.raises(InsufficientSpaceError):
            write_file(mnt / "m.pte", [b"H" * 4096, blob], consume=True,
                       placements=["move"], chunk_size=8 * MiB)
        assert file_digest(blob.path) == digest(data)
        assert names(mnt) == before


# -- 8. mode and owner; hard links and symlinks ---------------------------------------------


@pytest.mark.parametrize("consume", [False, True])
def test_replacing_a_destination_keeps_its_mode_and_owner(make_fs, consume):
    mnt = make_fs("ext4", 200)
    dest = mnt / "m.pte"
    dest.write_bytes(b"old")
    os.chown(dest, 12345, 12345)
    os.chmod(dest, 0o600)
    with BlobStore(mnt / "s") as store:
        blob = store.put(os.urandom(MiB))
        report = write_file(dest, [b"H" * 4096, blob], consume=consume)
    if consume:
        assert report.placements[0].placement == "insert"
    st = os.stat(dest)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 12345, 12345)


class _AfterChmod(WrappedCalls):
    """Run ``action`` before the call that follows the write's first ``fchmod``: the
    insert's host is in place and has just taken the destination's mode and owner."""

    def __init__(self, action) -> None:
        self.action, self.armed, self.fired = action, False, False

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if self.armed and not self.fired:
                self.fired = True
                self.action()
            self.armed = self.armed or name == "fchmod"
            return real(*args, **kwargs)
        return call


def _fail() -> None:
    raise OSError(errno.EIO, "injected EIO")


@pytest.mark.parametrize("recovered", [False, True], ids=["rollback", "recover"])
def test_an_insert_host_rolled_back_gets_its_own_mode_and_owner_back(make_fs, recovered):
    """A write that fails (or dies, and is recovered) after the insert's host took the
    destination's mode and owner gives the adopted file back with its bytes, mode and
    owner as they were."""
    mnt = make_fs("ext4", 200)
    dest = mnt / "m.pte"
    dest.write_bytes(b"old")
    os.chmod(dest, 0o600)
    user = mnt / "engine.bin"
    data = os.urandom(2 * MiB)
    user.write_bytes(data)
    os.chown(user, 12345, 12345)
    os.chmod(user, 0o640)

    def write() -> None:
        store = BlobStore(mnt / "s")
        blob = store.adopt(user)
        with _AfterChmod(die if recovered else _fail) as hook, contextlib.suppress(OSError):
            write_file(dest, [b"H" * 4096, blob], consume=True)
        assert hook.fired
        store.close()  # gives the unconsumed adopted file back to its path

    if recovered:
        assert in_child(write) == DIED
        outcomes = recover(mnt)
        assert [o.action for o in outcomes if o.outputs == [os.fspath(dest)]] == [
            "rolled back"], outcomes
        (back,) = (mnt / "s").glob("*.blob")  # its store died: an orphan, for adopt_orphan
    else:
        write()
        back = user
    st = os.stat(back)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 12345, 12345)
    assert file_digest(back) == digest(data)
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in mnt.iterdir() if ".trtet-" in p.name) == []


def test_a_hard_link_keeps_the_old_bytes_and_a_symlink_is_written_through(here_fs):
    dest = here_fs / "m.pte"
    dest.write_bytes(b"old")
    os.link(dest, here_fs / "hard")
    (here_fs / "sym").symlink_to(dest)
    write_file(here_fs / "sym", [b"new"])
    assert (here_fs / "sym").is_symlink()
    assert dest.read_bytes() == b"new"
    assert (here_fs / "hard").read_bytes() == b"old"


# -- 10. unreadable journals ---------------------------------------------------------------


@pytest.mark.parametrize("content", [b"garbage\n", b'{"version": 2}\n', b'{"version": 1}\n',
                                     b'{"version": 1, "token": "x"'])
def test_an_unreadable_journal_names_itself_and_blocks_only_its_destination(here_fs, content):
    journal = here_fs / f".other.pte.trtet-{'a' * 16}.trtet-journal"
    journal.write_bytes(content)
    (here_fs / "other.pte").write_bytes(b"old")
    # another destination in the same directory is written as usual
    write_file(here_fs / "mine.pte", [b"new"])
    assert (here_fs / "mine.pte").read_bytes() == b"new"
    if b"\n" not in content:
        # cut short: its writer died before doing anything; removed under the lock
        write_file(here_fs / "other.pte", [b"x"])
        assert not journal.exists()
        return
    with pytest.raises(ValueError) as err:
        write_file(here_fs / "other.pte", [b"new"])
    assert os.fspath(journal) in str(err.value) and "trtet-store recover" in str(err.value)
    assert (here_fs / "other.pte").read_bytes() == b"old"
    outcomes = recover(here_fs)
    damaged = [o for o in outcomes if o.action == "damaged"]
    assert len(damaged) == 1 and os.fspath(journal) in str(damaged[0].journal)
    assert "move it away" in damaged[0].detail
    assert journal.exists()  # left for a person: it may describe where bytes are


# -- 11. long names --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [218, 230, 255])
def test_destination_names_up_to_name_max_work(here_fs, length):
    name = "m" * (length - 4) + ".pte"
    dest = here_fs / name
    with BlobStore(here_fs / "s", chunk_size=65536) as store:
        data = os.urandom(MiB)
        blob = store.put(data)
        dest.write_bytes(b"old")
        with FaultInjector(fail_at=8, mode="eio"), pytest.raises(OSError):
            write_file(dest, [b"h", blob], consume=True, chunk_size=65536)
        assert dest.read_bytes() == b"old" and file_digest(blob.path) == digest(data)
        no_temps(here_fs)
        write_file(dest, [b"h", blob], consume=True, chunk_size=65536)
    assert dest.read_bytes() == b"h" + data
    assert names(here_fs) == sorted([name, "s"])


def test_a_long_names_interrupted_write_is_recovered(here_fs):
    name = "n" * 251 + ".pte"
    script = textwrap.dedent(f"""
        import os, signal
        from trtet_store import BlobStore, write_file
        from trtet_store.io import fs
        store = BlobStore({os.fspath(here_fs / "s")!r}, chunk_size=65536)
        blob = store.put(b"z" * (1 << 20))
        real = fs.calls.ftruncate
        def die(fd, n):
            if os.fstat(fd).st_size > n and n:
                real(fd, n)
                os.kill(os.getpid(), signal.SIGKILL)
            return real(fd, n)
        fs.calls.ftruncate = die
        write_file({os.fspath(here_fs / name)!r}, [b"h", blob], consume=True, chunk_size=65536)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    outcomes = [o for o in recover(here_fs) if o.action not in ("removed stray",)]
    assert [o.action for o in outcomes] == ["rolled forward"]
    assert (here_fs / name).read_bytes() == b"h" + b"z" * (1 << 20)
    no_temps(here_fs)


# -- 12. clear errors ----------------------------------------------------------------------


def test_a_read_only_mount_is_reported_as_such(make_fs):
    mnt = make_fs("tmpfs", 8)
    (mnt / "m.pte").write_bytes(b"old")
    subprocess.run(["mount", "-o", "remount,ro", os.fspath(mnt)], check=True)
    with pytest.raises(OSError, match="read-only") as err:
        write_file(mnt / "m.pte", [b"new"])
    assert err.value.errno == errno.EROFS
    assert (mnt / "m.pte").read_bytes() == b"old"


def test_out_of_inodes_is_reported_as_such(make_fs):
    mnt = make_fs("tmpfs", 8, mount_options="nr_inodes=16")
    (mnt / "m.pte").write_bytes(b"old")
    n = 0
    with pytest.raises(OSError):
        while True:
            (mnt / f"f{n}").touch()
            n += 1
    with pytest.raises(OSError, match="inode") as err:
        write_file(mnt / "m.pte", [b"new"])
    assert err.value.errno == errno.ENOSPC
    assert (mnt / "m.pte").read_bytes() == b"old"
    assert not [x for x in names(mnt) if ".trtet" in x]


def test_bytes_instead_of_a_piece_list_is_a_helpful_type_error(here_fs):
    with pytest.raises(TypeError, match=r"a list of pieces.*\[data\]"):
        write_file(here_fs / "m.pte", b"abc")
    assert names(here_fs) == []


def test_placements_as_one_string_is_one_placement(here_fs):
    with BlobStore(here_fs / "s") as store:
        blob = store.put(b"p" * 100_000)
        report = write_file(here_fs / "m.pte", [b"h", blob], consume=True, placements="move")
        assert report.placements[0].placement == "move"
        with pytest.raises(ValueError, match=r"unknown placement 'mvoe'"):
            write_file(here_fs / "n.pte", [b"h"], placements="mvoe")


def test_consume_hint_only_where_consume_would_help(make_fs, here_fs):
    out = make_fs("tmpfs", 4)
    with BlobStore(here_fs / "s") as store:
        blob = store.put(os.urandom(6 * MiB))
        for consume in (False, True):
            with pytest.raises(InsufficientSpaceError) as err:
                write_file(out / "m.pte", [b"h", blob], consume=consume)
            msg = str(err.value)
            if consume:  # already consuming, across filesystems: a copy is the only way
                assert "consume=True needs only one chunk" not in msg
                assert "another filesystem" in msg
        assert names(out) == []


# -- 13. logging, recover's detail once, waiting for a busy destination ---------------------


def test_the_package_logger_has_a_null_handler():
    handlers = logging.getLogger("trtet_store").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_recover_says_its_rollback_detail_once(here_fs):
    script = textwrap.dedent(f"""
        import os, signal
        from trtet_store import BlobStore, write_file
        from trtet_store.io import fs
        store = BlobStore({os.fspath(here_fs / "s")!r}, chunk_size=65536)
        blob = store.put(os.urandom(1 << 20))
        real = fs.calls.fdatasync
        n = [0]
        def die(fd):
            n[0] += 1
            if n[0] == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(fd)
        fs.calls.fdatasync = die
        write_file({os.fspath(here_fs / "out.pte")!r}, [b"h", blob, b"t"], consume=True,
                   chunk_size=65536, placements=["move"])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # the temp file goes missing: recovery must roll back
    for p in here_fs.glob(".out.pte.trtet-*.tmp"):
        with open(p, "r+b") as f:
            f.seek(0)
            f.write(b"X")
    proc = subprocess.run([sys.executable, "-m", "trtet_store.cli", "recover", os.fspath(here_fs)],
                          capture_output=True, text=True)
    both = proc.stdout + proc.stderr
    assert "rolled back" in both, both
    assert both.count("back in place") == 1, both


def test_a_busy_destination_can_be_waited_for(here_fs):
    dest = here_fs / "m.pte"
    fd = lock.lock_file(lock_path_of(dest), dest)
    with pytest.raises(ConcurrentWriteError):
        write_file(dest, [b"a"])
    t0 = time.monotonic()
    with pytest.raises(ConcurrentWriteError, match="0.3"):
        write_file(dest, [b"a"], timeout=0.3)
    # It waited (the lower bound); the upper one is a hang guard far above the 0.3 s asked.
    assert 0.25 < time.monotonic() - t0 < 60
    release = threading.Timer(0.3, lambda: (os.unlink(lock_path_of(dest)), os.close(fd)))
    release.start()
    write_file(dest, [b"b"], timeout=10)
    release.join()
    assert dest.read_bytes() == b"b"


@pytest.mark.slow
@pytest.mark.parametrize("fstype,placement", [("xfs", "clone"), ("ext4", "insert")])
def test_adopt_then_zero_copy_takes_the_same_time_at_256_mib_and_4_gib(make_fs, fstype,
                                                                       placement):
    """Issue 14 item 4: adopt + clone/insert (durable) is O(1) in the payload's size.

    The payloads are ``posix_fallocate``d (unwritten extents: nothing is
    written, a read would return zeros at memory speed), medians of three.
    """
    import statistics

    mnt = make_fs(fstype, 9000)
    medians = {}
    for size in (256 * MiB, 4096 * MiB):
        times = []
        for _ in range(3):
            src = mnt / "payload.bin"
            with open(src, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, size)
            os.sync()
            with BlobStore(mnt / "s") as store:
                t0 = time.perf_counter()
                blob = store.adopt(src)
                report = write_file(mnt / "m.pte", [b"H" * 4096, blob],
                                    consume=placement == "insert")
                fd = os.open(mnt / "m.pte", os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                times.append(time.perf_counter() - t0)
            assert report.placements[0].placement == placement
            (mnt / "m.pte").unlink()
            src.unlink(missing_ok=True)
            os.sync()
        medians[size] = statistics.median(times)
    print(f"\nadopt+{placement} on {fstype}: 256 MiB {medians[256 * MiB] * 1e3:.1f} ms, "
          f"4 GiB {medians[4096 * MiB] * 1e3:.1f} ms")
    assert medians[4096 * MiB] < max(1.5 * medians[256 * MiB], 0.05)


@pytest.mark.parametrize("corrupt", [False, True])
def test_a_crash_after_an_insert_became_a_move_is_recovered_from_the_amended_journal(
        make_fs, corrupt):
    """The journal records the switch before a byte moves; recovery follows the move."""
    mnt = make_fs("ext4", 200)
    out = mnt / "out"
    out.mkdir()
    (out / "m.pte").write_bytes(b"old")
    data = os.urandom(2 * MiB)
    (mnt / "data.bin").write_bytes(data)
    script = textwrap.dedent(f"""
        import errno, os, signal
        from pathlib import Path
        from trtet_store import BlobStore, write_file
        from trtet_store.io import fs
        store = BlobStore({os.fspath(mnt / "s")!r}, chunk_size=64 << 10)
        blob = store.put(Path({os.fspath(mnt / "data.bin")!r}).read_bytes())
        print(blob.path, flush=True)
        real_falloc, real_trunc, n = fs.calls.fallocate, fs.calls.ftruncate, [0]
        def falloc(fd, mode, off, length):
            if mode == fs.FALLOC_FL_INSERT_RANGE:
                raise OSError(errno.EOPNOTSUPP, "not here")
            return real_falloc(fd, mode, off, length)
        def trunc(fd, size):
            real_trunc(fd, size)
            if size and size < (2 << 20) and size % (64 << 10) == 0:
                n[0] += 1
                if n[0] == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
        fs.calls.fallocate, fs.calls.ftruncate = falloc, trunc
        write_file({os.fspath(out / "m.pte")!r}, [b"H" * 4096, blob], consume=True,
                   chunk_size=128 << 10)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    source = Path(proc.stdout.strip())
    assert 0 < source.stat().st_size < 2 * MiB  # moving, not inserting
    journal = next(out.glob(".m.pte.trtet-*.trtet-journal"))
    assert b'"amend"' in journal.read_bytes()
    if corrupt:  # the header did not reach the disk: must roll back
        with open(next(out.glob(".m.pte.trtet-*.tmp")), "r+b") as f:
            f.write(b"X")
    actions = [o.action for o in recover(out) if o.action not in ("removed stray", "orphan")]
    if corrupt:
        assert actions == ["rolled back"]
        assert (out / "m.pte").read_bytes() == b"old"
        assert file_digest(source) == digest(data)
    else:
        assert actions == ["rolled forward"]
        assert (out / "m.pte").read_bytes() == b"H" * 4096 + data
        assert not source.exists()
    assert names(out) == ["m.pte"]
