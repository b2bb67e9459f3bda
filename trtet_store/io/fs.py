"""Filesystem primitives: checked I/O, durability, free space, capability cache.

Every system call that changes or reads file content goes through the module
object :data:`calls`, so fault-injection tests can wrap the real calls (raise,
return a short count) without faking the filesystem.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from trtet_store.io import names
from trtet_store.io.errors import PlacementUnavailable

# Errors that mean "this placement is not possible here", never "the disk is full".
UNSUPPORTED_ERRNOS = frozenset(
    {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EPERM}
)


@dataclass
class Syscalls:
    """The system calls the storage engine makes, as one replaceable table.

    Tests install a wrapper around each real call; production code always runs
    the real ``os`` functions.
    """

    open: object = field(default=os.open)
    close: object = field(default=os.close)
    pread: object = field(default=os.pread)
    pwrite: object = field(default=os.pwrite)
    ftruncate: object = field(default=os.ftruncate)
    fsync: object = field(default=os.fsync)
    fdatasync: object = field(default=os.fdatasync)
    copy_file_range: object = field(default=os.copy_file_range)
    rename: object = field(default=os.rename)
    replace: object = field(default=os.replace)
    link: object = field(default=os.link)
    unlink: object = field(default=os.unlink)
    fallocate: object = field(default=lambda *a: fallocate(*a))
    clone_range: object = field(default=lambda *a: clone_range(*a))
    sync_file_range: object = field(default=lambda *a: sync_file_range(*a))
    fadvise: object = field(default=os.posix_fadvise)
    fchmod: object = field(default=os.fchmod)
    fchown: object = field(default=os.fchown)
    symlink: object = field(default=os.symlink)


calls = Syscalls()

NAMES = tuple(Syscalls.__dataclass_fields__)


def free_bytes(path: os.PathLike | str) -> int:
    """Bytes free to unprivileged users on the filesystem holding ``path``.

    ``f_bavail`` rather than ``f_bfree``: root may dip into ext4's reserve, but
    a plan that needs the reserve is a plan that fails for everyone else.
    """
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def block_size(path: os.PathLike | str) -> int:
    """The filesystem's allocation unit for ``path`` (a file or directory)."""
    return os.statvfs(path).f_bsize


def pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset``; a short count is retried, never ignored.

    A zero-byte write without an error would loop forever, so it is raised as
    ENOSPC (what the kernel means by it on a full filesystem).
    """
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = calls.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, "write made no progress", None)
        done += n


def pread_exact(fd: int, size: int, offset: int, path: os.PathLike | str = "") -> bytes:
    """Read exactly ``size`` bytes at ``offset`` or raise: a file that shrank is an error."""
    parts = []
    done = 0
    while done < size:
        chunk = calls.pread(fd, size - done, offset + done)
        if not chunk:
            raise OSError(
                errno.EIO,
                f"file ended at {offset + done}, expected {size} bytes from {offset}",
                os.fspath(path),
            )
        parts.append(chunk)
        done += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def fsync_dir(path: os.PathLike | str) -> None:
    """fsync a directory, so a rename or unlink in it survives a power cut."""
    fd = calls.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        calls.fsync(fd)
    finally:
        calls.close(fd)


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stat results name one inode."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


class CapabilityCache:
    """What a filesystem was found unable to do, so later writes don't pay to find out.

    Keys are ``(operation, fs_identity of source, fs_identity of destination)``
    (see :func:`fs_identity`; never bare ``st_dev``, which loop devices reuse).
    The one cache of the storage engine; a key is never a prediction: a miss
    always tries the call.
    """

    def __init__(self) -> None:
        self._known: dict[tuple, tuple[bool, str]] = {}

    def get(self, key: tuple) -> tuple[bool, str] | None:
        return self._known.get(key)

    def put(self, key: tuple, works: bool, reason: str) -> None:
        self._known[key] = (works, reason)

    def clear(self) -> None:
        self._known.clear()


capabilities = CapabilityCache()


def fs_identity(path: os.PathLike | str) -> tuple:
    """A cache key for the filesystem holding ``path``, new with every mkfs.

    ``st_dev`` is reused when a loop device is detached and attached again
    with another filesystem on it, and XFS's ``f_fsid`` is only the device
    number, so neither tells two filesystems made on one loop device apart
    (a reflink=0 XFS was handed the clone capability of the reflink=1 one
    made there before). The superblock's UUID (``FS_IOC_GETFSUUID``, Linux
    6.5+) is new per mkfs; where it is not offered, the root directory's
    inode and change time, and the mount's id, stand in for it.
    """
    st = os.stat(path)
    return st.st_dev, os.statvfs(path).f_fsid, _fs_uuid(path) or _mount_key(path, st)


# struct fsuuid2 { __u8 len; __u8 uuid[16]; }; _IOR(0x15, 0, struct fsuuid2)
FS_IOC_GETFSUUID = 0x80111500


def _fs_uuid(path: os.PathLike | str) -> bytes | None:
    """The filesystem's UUID, or None where the kernel or the filesystem does not tell it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFSUUID, bytes(17))
    except OSError:
        return None
    finally:
        os.close(fd)
    n = min(buf[0], 16)
    uuid_ = bytes(buf[1:1 + n])
    return uuid_ if uuid_.strip(b"\0") else None


def _mount_key(path: os.PathLike | str, st: os.stat_result) -> tuple:
    """Mount ids of ``st_dev`` (from /proc/self/mountinfo) and the mount root's inode/ctime."""
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    ids, root = [], None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                if parts[2] == f"{major}:{minor}":
                    ids.append(int(parts[0]))
                    root = parts[4]
    except OSError:
        pass
    root_id = None
    if root is not None:
        # Not its ctime: every file created or removed in a mount root changes it.
        with contextlib.suppress(OSError):
            root_id = os.stat(root).st_ino
    return tuple(sorted(ids)), root_id


class Mount(NamedTuple):
    """One line of ``/proc/mounts``, its escapes undone."""

    source: str
    mountpoint: str
    fstype: str
    options: str


def _unescape_mount_field(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mounts() -> list[Mount]:
    """Return every mount in ``/proc/mounts``, in its order (later ones on top)."""
    rows = []
    with open("/proc/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4:
                rows.append(Mount(_unescape_mount_field(parts[0]),
                                  _unescape_mount_field(parts[1]), parts[2], parts[3]))
    return rows


def mount_holding(path: os.PathLike | str) -> Mount | None:
    """The mount whose point is the longest prefix of ``path`` (the topmost of equals)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in read_mounts():
        mp = m.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (
                best is None or len(mp) >= len(best.mountpoint)):
            best = m
    return best


#: Mount options that discard freed blocks as they are freed (btrfs's
#: ``discard=async``, its default on SSDs, batches them in the background).
_ONLINE_DISCARD = frozenset({"discard", "discard=sync"})


def online_discard(path: os.PathLike | str) -> bool:
    """Whether the filesystem holding ``path`` is mounted with online discard.

    There every block freed is also discarded (ext4 and XFS ``-o discard``,
    btrfs ``discard=sync``), which costs the disk time in proportion to the
    bytes freed: on a plain virtio ext4 disk, cutting a 2 GiB file in 98
    steps took 0.55 s mounted with ``discard`` and 0.001 s without
    (benchmarks/discard_ab.sh). A move frees every byte it copies, so it
    pays this where a copy does not. Read from ``/proc/mounts`` (the mount
    holding ``path``, :func:`mount_holding`); False where that cannot be read.
    """
    try:
        m = mount_holding(path)
    except OSError:
        return False
    return m is not None and not _ONLINE_DISCARD.isdisjoint(m.options.split(","))


def _probe_on_scratch(key: tuple, directory: Path, attempt, works: str,
                      fails: str) -> str:
    """Try ``attempt(scratch_fd)`` on a scratch file in ``directory``; cache the verdict.

    ``fails`` is formatted with the error's text. Only "not possible here"
    errors are a verdict; any other error is raised.
    """
    known = capabilities.get(key)
    if known is not None:
        return _verdict(known)
    probe = names.probe_path(directory, f"{key[0]}-{uuid.uuid4().hex[:8]}")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        attempt(fd)
    except OSError as exc:
        if exc.errno not in UNSUPPORTED_ERRNOS:
            raise
        result = (False, fails.format(os.strerror(exc.errno)))
    else:
        result = (True, works)
    finally:
        os.close(fd)
        os.unlink(probe)
    capabilities.put(key, *result)
    return _verdict(result)


def _verdict(result: tuple[bool, str]) -> str:
    """Why it works, or :class:`PlacementUnavailable` with why not."""
    works, reason = result
    if not works:
        raise PlacementUnavailable(reason)
    return reason


def probe_clone(source: Path, dest_dir: Path) -> str:
    """Why blocks of ``source`` can be shared into a file in ``dest_dir``, found by trying it.

    Clones one block of the source into a scratch file (no data is copied,
    no space is used) and deletes it. Raises :class:`PlacementUnavailable`
    (why not) where it cannot.
    """
    bs = block_size(dest_dir)
    if os.stat(source).st_size < bs:
        raise PlacementUnavailable(f"the payload is smaller than one block ({bs} bytes)")
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _probe_on_scratch(
            ("clone", fs_identity(source), fs_identity(dest_dir)), dest_dir,
            lambda fd: clone_range(src, 0, bs, fd, 0),
            f"{source.parent} and {dest_dir} share a reflink filesystem",
            f"reflink not possible from {source.parent} to {dest_dir} (FICLONERANGE: {{}})")
    finally:
        os.close(src)


def probe_insert_range(directory: Path) -> str:
    """Why files in ``directory`` can grow at the front (``FALLOC_FL_INSERT_RANGE``).

    Tried on a sparse scratch file, which costs no space. Raises
    :class:`PlacementUnavailable` (why not) where they cannot.
    """
    bs = block_size(directory)

    def attempt(fd: int) -> None:
        os.ftruncate(fd, 2 * bs)
        fallocate(fd, FALLOC_FL_INSERT_RANGE, 0, bs)

    return _probe_on_scratch(
        ("insert", fs_identity(directory)), directory, attempt,
        f"{directory} can insert ranges at the front of a file",
        f"{directory} cannot insert ranges (fallocate INSERT_RANGE: {{}})")


def probe_same_filesystem(source: Path, dest_dir: Path) -> str:
    """Why ``source`` can be renamed into ``dest_dir``, found by trying a hard link.

    A link succeeds exactly where a rename would (same mount of the same
    superblock); bind mounts and btrfs subvolumes make ``st_dev`` unreliable.
    Raises :class:`PlacementUnavailable` (why not) where it cannot.
    """
    key = ("link", fs_identity(source), fs_identity(dest_dir))
    known = capabilities.get(key)
    if known is not None:
        return _verdict(known)
    probe = names.probe_path(dest_dir, f"{id(source):x}")
    try:
        os.link(source, probe)
    except OSError as exc:
        if exc.errno in UNSUPPORTED_ERRNOS or exc.errno == errno.EMLINK:
            reason = f"{source.parent} and {dest_dir} are on different filesystems " \
                f"(link: {os.strerror(exc.errno)})"
            capabilities.put(key, False, reason)
            raise PlacementUnavailable(reason, exc.errno) from None
        raise
    os.unlink(probe)
    result = (True, f"{source.parent} and {dest_dir} share a filesystem")
    capabilities.put(key, *result)
    return _verdict(result)


FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_INSERT_RANGE = 0x20
SYNC_FILE_RANGE_WAIT_BEFORE = 0x01
SYNC_FILE_RANGE_WRITE = 0x02
SYNC_FILE_RANGE_WAIT_AFTER = 0x04

_libc = None


def _c_call(name: str, *args: int) -> None:
    """Call libc's ``name`` with integer arguments; a nonzero return raises OSError."""
    import ctypes

    global _libc
    if _libc is None:
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_uint]
        _libc = libc
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """``fallocate(2)`` with mode flags, which ``os.posix_fallocate`` cannot pass."""
    _c_call("fallocate", fd, mode, offset, length)


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    """``sync_file_range(2)``, which the ``os`` module does not offer."""
    _c_call("sync_file_range", fd, offset, length, flags)


# struct file_clone_range { s64 src_fd; u64 src_offset, src_length, dest_offset; }
_CLONE_RANGE = struct.Struct("=qQQQ")
FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> None:
    """Share ``length`` bytes of ``src_fd`` into ``dst_fd`` (``FICLONERANGE``): no data is copied.

    Offsets and length must be multiples of the filesystem block, except a
    length that runs to the source's end. EOPNOTSUPP, EXDEV, EINVAL where the
    filesystem or the alignment does not allow it.
    """
    fcntl.ioctl(dst_fd, FICLONERANGE,
                _CLONE_RANGE.pack(src_fd, src_offset, length, dst_offset))


def allocate(fd: int, offset: int, length: int) -> None:
    """Allocate exactly ``[offset, offset+length)`` before writing it.

    An exact request keeps ext4 from rounding a write's allocation up and
    preallocating past it (seen as a second chunk of transient disk use
    during a move), and a full disk fails here, before any byte is written.
    Where the filesystem cannot preallocate, the write allocates as usual.
    """
    try:
        calls.fallocate(fd, 0, offset, length)
    except OSError as exc:
        if exc.errno not in UNSUPPORTED_ERRNOS:
            raise


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``[offset, offset+length)`` of a file, keeping its size.

    Returns False where the filesystem cannot punch holes: the caller keeps the
    bytes allocated, which costs disk but loses nothing.
    """
    try:
        calls.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    except OSError as exc:
        if exc.errno in UNSUPPORTED_ERRNOS:
            return False
        raise
    return True


#: Bytes per ``copy_file_range`` call of :func:`copy_all` (a call is not interruptible).
COPY_STEP = 64 * 1024 * 1024
#: Bytes per read of :func:`copy_all`'s read/write fallback.
_COPY_READ = 8 * 1024 * 1024


def try_clone(src_fd: int, dst_fd: int, size: int) -> bool:
    """Share all ``size`` bytes of ``src_fd`` into the empty ``dst_fd`` (``FICLONERANGE``).

    No data is copied and no space is used. Returns False, ``dst_fd`` left
    empty, where the filesystem cannot (an error of :data:`UNSUPPORTED_ERRNOS`,
    or the source's length is not ``size``) and for ``size`` 0; any other
    error is raised.
    """
    if not size:
        return False
    try:
        calls.clone_range(src_fd, 0, 0, dst_fd, 0)  # length 0: to the source's end
    except OSError as exc:
        if exc.errno not in UNSUPPORTED_ERRNOS:
            raise
    else:
        if os.fstat(dst_fd).st_size == size:
            return True
    calls.ftruncate(dst_fd, 0)
    return False


def copy_all(src_fd: int, dst_fd: int, size: int, *, what: str = "source") -> None:
    """Copy bytes ``[0, size)`` of ``src_fd`` to the same offsets of ``dst_fd``.

    ``copy_file_range`` (which may share blocks, on XFS and btrfs), else, when
    its first call fails with an error of :data:`UNSUPPORTED_ERRNOS`, reads and
    writes. A source shorter than ``size`` is EIO (``"<what> ended at N of
    size bytes"``).
    """
    done = 0
    try:
        while done < size:
            n = calls.copy_file_range(src_fd, dst_fd, min(size - done, COPY_STEP), done, done)
            if n == 0:
                raise OSError(errno.EIO, f"{what} ended at {done} of {size} bytes")
            done += n
        return
    except OSError as exc:
        if done or exc.errno not in UNSUPPORTED_ERRNOS:
            raise
    while done < size:
        data = calls.pread(src_fd, min(_COPY_READ, size - done), done)
        if not data:
            raise OSError(errno.EIO, f"{what} ended at {done} of {size} bytes")
        pwrite_all(dst_fd, data, done)
        done += len(data)


def clone_or_copy(src_fd: int, dst_fd: int, size: int, *, what: str = "source") -> str:
    """``size`` bytes of ``src_fd`` into the empty ``dst_fd``: shared where the filesystem
    allows (:func:`try_clone`), else copied (:func:`copy_all`).

    Parameters
    ----------
    src_fd, dst_fd : int
        Open for reading, and for writing (not ``O_APPEND``).
    size : int
        The bytes to take: the source's length.
    what : str
        How a source found shorter than ``size`` is named in the EIO raised.

    Returns
    -------
    str
        ``"clone"`` or ``"copy"``.
    """
    if try_clone(src_fd, dst_fd, size):
        return "clone"
    copy_all(src_fd, dst_fd, size, what=what)
    return "copy"
