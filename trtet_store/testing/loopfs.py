"""Dedicated real filesystems: loop-mounted ext4, XFS and btrfs images, and tmpfs.

The storage engine's behaviour (clone, insert range, peak disk, crash
durability) differs per filesystem, so the tests and the benchmark run on real
ones, never fakes. Each filesystem is a sparse image under a per-session
directory on the root disk (``/var/tmp`` unless ``TRTET_FS_ROOT`` says
otherwise), formatted and loop-mounted; tmpfs is mounted directly. Everything
is unmounted, detached and deleted again on release, a process stopped with
SIGTERM releases what its open factories made before it dies, and a session
killed (SIGKILL) before its teardown is cleaned up by the next one.

Standard library only (Linux); making filesystems needs root, reading
``/proc/mounts`` and ``/sys/block`` does not. The pytest layer over this
module is ``tests/filesystems.py``.

Rough free space right after mkfs (4 KiB blocks, measured with ``statvfs``):

======  ========================  ==========================
fstype  minimum size              free space
======  ========================  ==========================
ext4    8 MiB                     about 85 % (64 MiB) to 93 % (1 GiB)
xfs     300 MiB                   size minus 80-100 MiB (log, AG headers)
btrfs   114 MiB                   size minus 80-120 MiB (DUP metadata)
tmpfs   1 MiB                     the full size
======  ========================  ==========================

Example::

    with FilesystemFactory() as fs:
        mnt = fs.make("xfs", 512)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from trtet_store.io.fs import Mount, mount_holding, read_mounts
from trtet_store.io.units import MiB

__all__ = [
    "FSTYPES",
    "MIN_SIZE_MIB",
    "SESSION_PREFIX",
    "FilesystemFactory",
    "FilesystemUnavailable",
    "Mount",
    "MountedFs",
    "cleanup_stale_sessions",
    "fstype_of",
    "loop_devices_under",
    "mount_source",
    "mounted_fstype",
    "mounts_under",
    "process_start_time",
    "read_mounts",
    "teardown",
    "umount",
]

FSTYPES: tuple[str, ...] = ("ext4", "xfs", "btrfs", "tmpfs")

MIN_SIZE_MIB: dict[str, int] = {"ext4": 8, "xfs": 300, "btrfs": 114, "tmpfs": 1}

#: Prefix of the session directories :class:`FilesystemFactory` makes by default.
SESSION_PREFIX = "trtet-fs-"

_MKFS: dict[str, list[str]] = {
    # Small ext4 images would get 1 KiB blocks from mke2fs.conf's "small"
    # type; the engine's zero-copy placements are about 4 KiB blocks, as on
    # real disks. A later `-b` in mkfs_options overrides this.
    "ext4": ["mkfs.ext4", "-q", "-m", "0", "-F", "-b", "4096"],
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}
_PACKAGES = {"ext4": "e2fsprogs", "xfs": "xfsprogs", "btrfs": "btrfs-progs"}

_OWNER_FILE = "owner"
_TMPFS_SOURCE = "trtet-tmpfs"
_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class FilesystemUnavailable(Exception):
    """A filesystem could not be provided here (not root, no mkfs tool, mount refused)."""


def _which(tool: str) -> str | None:
    # Non-login root shells sometimes lack sbin on PATH.
    found = shutil.which(tool)
    if found:
        return found
    for d in _SBIN:
        candidate = os.path.join(d, tool)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _run(argv: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


# --- /proc/mounts and /sys/block -------------------------------------------------------


def mounted_fstype(path: str | os.PathLike[str]) -> str | None:
    """Return the filesystem type mounted exactly at ``path``, per ``/proc/mounts``.

    Args:
        path: A mount point.

    Returns:
        The type of the topmost mount at that point, or None if nothing is mounted there.
    """
    target = os.path.realpath(path)
    found = None
    for m in read_mounts():
        if m.mountpoint == target:
            found = m.fstype  # later lines are mounted on top of earlier ones
    return found


def mount_source(path: str | os.PathLike[str]) -> str | None:
    """Return the source (device) of the topmost mount exactly at ``path``, or None."""
    target = os.path.realpath(path)
    found = None
    for m in read_mounts():
        if m.mountpoint == target:
            found = m.source
    return found


def fstype_of(path: str | os.PathLike[str]) -> str:
    """Return the type of the filesystem holding ``path`` (the longest mount-point prefix).

    Args:
        path: Any file or directory.

    Returns:
        The type, or ``"unknown"`` if no mount covers it.
    """
    m = mount_holding(path)
    return m.fstype if m else "unknown"


def backing_image(path: str | os.PathLike[str]) -> str | None:
    """Return the image file behind the loop device holding ``path``, or None.

    A loop device reads and writes its image through the page cache of the
    filesystem the image is on, so a file dropped from the loop filesystem's
    cache can still be read from memory there: what is uncached must be
    dropped from both.

    Args:
        path: Any file or directory.

    Returns:
        The backing file's path (``/sys/block/loopN/loop/backing_file``), or
        None when ``path`` is not on a loop device.
    """
    m = mount_holding(path)
    source = m.source if m else None
    if not source or not os.path.basename(source).startswith("loop"):
        return None
    try:
        return Path(f"/sys/block/{os.path.basename(source)}/loop/backing_file").read_text().strip()
    except OSError:
        return None


def mounts_under(base: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """Return ``(mountpoint, fstype)`` of every mount at or below ``base``.

    Args:
        base: A directory.

    Returns:
        The mounts, in ``/proc/mounts`` order.
    """
    root = os.path.realpath(base)
    return [
        (m.mountpoint, m.fstype)
        for m in read_mounts()
        if m.mountpoint == root or m.mountpoint.startswith(root + os.sep)
    ]


def loop_devices_under(base: str | os.PathLike[str]) -> list[str]:
    """Return the loop devices whose backing file lies at or below ``base``.

    Reads ``/sys/block/loop*/loop/backing_file`` (what ``losetup -a`` shows),
    so it sees devices whose image was already deleted.

    Args:
        base: A directory, or an image file.

    Returns:
        Device paths such as ``/dev/loop3``.
    """
    root = os.path.realpath(base)
    found = []
    for entry in sorted(Path("/sys/block").glob("loop*")):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue  # not attached
        backing = backing.removesuffix(" (deleted)")
        if backing == root or backing.startswith(root + os.sep):
            found.append(f"/dev/{entry.name}")
    return found


def _autoclear_pending(dev: str) -> bool:
    """True if ``dev`` is no longer mounted anywhere and will detach itself on last close."""
    try:
        flag = Path(f"/sys/block/{os.path.basename(dev)}/loop/autoclear").read_text().strip()
    except OSError:
        return False
    return flag == "1" and all(m.source != dev for m in read_mounts())


def _detach(devices: list[str]) -> None:
    losetup = _which("losetup") or "losetup"
    for dev in devices:
        _run([losetup, "-d", dev])


def process_start_time(pid: int) -> str | None:
    """Return the start time of process ``pid`` (``/proc/<pid>/stat`` field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


# --- unmounting and teardown -----------------------------------------------------------


def umount(mountpoint: str | os.PathLike[str]) -> tuple[str | None, bool]:
    """Unmount, retrying while busy, then lazily.

    Args:
        mountpoint: The mount point; nothing happens if nothing is mounted there.

    Returns:
        (error or None, whether the lazy unmount was needed).
    """
    umount_tool = _which("umount") or "umount"
    target = os.fspath(mountpoint)
    err = ""
    for attempt in range(6):
        if mounted_fstype(target) is None:
            return None, False
        proc = _run([umount_tool, target])
        if proc.returncode == 0:
            return None, False
        err = proc.stderr.strip()
        # Busy usually means a child process or an open file is still
        # closing; give it a moment before the lazy unmount.
        time.sleep(0.1 * (attempt + 1))
    proc = _run([umount_tool, "-l", target])
    if proc.returncode != 0 and mounted_fstype(target) is not None:
        return f"cannot unmount {target}: {err}; lazy: {proc.stderr.strip()}", True
    return None, True


#: Seconds a teardown or remount waits for a loop device to go after its unmount (a hang
#: guard: the wait ends as soon as it is gone).
DETACH_WAIT = 60.0


def _gone(image: Path, limit: float = DETACH_WAIT) -> bool:
    """Wait until no loop device is attached to ``image``; False if one still is after
    ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while loop_devices_under(image):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def teardown(mountpoint: Path, image: Path | None) -> list[str]:
    """Unmount ``mountpoint``, detach ``image``'s loop device, delete the image and mount point.

    After a lazy unmount (the filesystem was busy) a loop device that will
    detach itself once the last open file on it is closed is not a problem:
    a warning says so.

    Args:
        mountpoint: The mount point (removed if the unmount succeeded).
        image: The image file, or None for tmpfs.

    Returns:
        Problems that remain (empty when everything is gone).
    """
    problems = []
    err, lazy = umount(mountpoint)
    if err:
        problems.append(err)
    if image is not None:
        # `mount -o loop` sets autoclear, so the device normally went with the
        # unmount. `losetup -d` on a device still held open only re-arms
        # autoclear, which is what we want after a lazy unmount.
        _detach(loop_devices_under(image))
        # The kernel detaches an autoclear device at its last close, and udev's probe
        # after the unmount may hold it a while: on a loaded machine (load 20) it took
        # longer than the 2 s this once allowed. The wait ends as soon as it is gone;
        # the limit is a hang guard. After a lazy unmount it stays while still busy: a
        # short look then, and a warning below.
        if not _gone(image, 2.0 if lazy else DETACH_WAIT):
            left = loop_devices_under(image)
            if lazy and all(_autoclear_pending(dev) for dev in left):
                warnings.warn(
                    f"{mountpoint} was busy and unmounted lazily; {', '.join(left)} "
                    "detaches itself when the last open file on it is closed",
                    stacklevel=2,
                )
            else:
                problems.append(f"loop device {', '.join(left)} still attached for {image}")
        with contextlib.suppress(FileNotFoundError):
            image.unlink()
    if not err:
        with contextlib.suppress(OSError):
            mountpoint.rmdir()
    return problems


def cleanup_stale_sessions(
    root: str | os.PathLike[str], prefix: str = SESSION_PREFIX
) -> list[Path]:
    """Tear down session directories under ``root`` whose owning process is gone.

    A session killed before its teardown (SIGKILL, a timeout) leaves mounts
    and loop devices behind; the next session removes them. Sessions of live
    processes are left alone.

    Args:
        root: The directory holding the session directories.
        prefix: Their name prefix (``trtet-fs-`` for tests, ``trtet-bench-``
            for the benchmark).

    Returns:
        The session directories that were cleaned.
    """
    cleaned = []
    for base in sorted(Path(root).glob(prefix + "*")):
        try:
            pid_text, start = (base / _OWNER_FILE).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            # No owner record yet: either being created right now, or broken.
            # Only very old ones are safe to treat as stale.
            try:
                if time.time() - base.stat().st_mtime < 3600:
                    continue
            except OSError:
                continue
            pid, start = -1, ""
        if pid > 0 and process_start_time(pid) == start:
            continue
        mounts = sorted(mounts_under(base), key=lambda m: len(m[0]), reverse=True)
        for mountpoint, _fstype in mounts:
            umount(mountpoint)
        _detach(loop_devices_under(base))
        if not mounts_under(base):
            shutil.rmtree(base, ignore_errors=True)
            cleaned.append(base)
    return cleaned


# --- the factory -----------------------------------------------------------------------


@dataclass
class MountedFs:
    """One filesystem made by :class:`FilesystemFactory`.

    Attributes:
        fstype: ``ext4``, ``xfs``, ``btrfs`` or ``tmpfs``.
        size_mib: Requested size (image size, or tmpfs size).
        mountpoint: Where it is mounted.
        image: The sparse image file, or None for tmpfs.
        loop_device: The loop device backing it, or None for tmpfs.
        mount_options: The extra ``mount -o`` options it was mounted with.
    """

    fstype: str
    size_mib: int
    mountpoint: Path
    image: Path | None
    loop_device: str | None
    mount_options: tuple[str, ...] = ()


#: The factories this process made and has not closed yet, oldest first.
_open_factories: list[FilesystemFactory] = []


def _take_sigterm() -> None:
    """While a factory is open, SIGTERM tears the open factories down, then kills.

    SIGTERM's default action ends the process without running ``finally`` or
    ``atexit``, so a benchmark stopped with ``kill`` or ``timeout`` left its
    loop filesystems mounted until the next factory collected them. Only the
    default handler is replaced (one the program set is its own), and only
    from the main thread (the only one that may set handlers).
    """
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _teardown_and_die)


def _give_back_sigterm() -> None:
    """The last open factory closed: SIGTERM does what it did before."""
    if (not _open_factories
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is _teardown_and_die):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _teardown_and_die(signum: int, frame: object) -> None:
    """Release what this process's open factories made, then die of the signal.

    Dying of the signal keeps the status a caller expects (no SystemExit that
    a test runner might catch and carry on after). A forked child inherits
    the handler and the list, but not the filesystems: it tears down nothing.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        for factory in reversed(list(_open_factories)):  # close() takes each out
            if factory._owner_pid == os.getpid():
                with contextlib.suppress(Exception):
                    factory.close()
    finally:
        os.kill(os.getpid(), signum)


class FilesystemFactory:
    """Create real filesystems under one session directory, and tear them all down again.

    Usable as a context manager::

        with FilesystemFactory() as fs:
            mnt = fs.make("xfs", 512)

    Making a factory first cleans up the stale sessions (same ``prefix``)
    that killed processes left under ``root``.

    Args:
        root: Directory on the root disk that holds session directories
            (default: env ``TRTET_FS_ROOT`` or ``/var/tmp``). Never a tmpfs:
            the images would then eat memory.
        prefix: Name prefix of the session directory.
        tmpfs_source: The source name tmpfs mounts get (shown in ``/proc/mounts``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        prefix: str = SESSION_PREFIX,
        tmpfs_source: str = _TMPFS_SOURCE,
    ) -> None:
        self.root = Path(root or os.environ.get("TRTET_FS_ROOT") or "/var/tmp")
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmpfs_source = tmpfs_source
        self.stale_cleaned = cleanup_stale_sessions(self.root, prefix)
        self.base = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
        # mkdtemp makes it 0700; a test may run its writer as an unprivileged
        # user, which must be able to reach the mount points inside.
        os.chmod(self.base, 0o755)
        # An owner record lets a later session tell our leftovers (after a
        # SIGKILL or a timeout that skipped teardown) from a live session's.
        pid = os.getpid()
        (self.base / _OWNER_FILE).write_text(f"{pid} {process_start_time(pid)}\n")
        self._mounted: dict[Path, MountedFs] = {}
        self._counter = 0
        self._owner_pid = pid
        _open_factories.append(self)
        _take_sigterm()

    def __enter__(self) -> FilesystemFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        problems = self.close()
        if problems and exc[0] is None:
            raise RuntimeError("filesystem teardown left things behind: " + "; ".join(problems))

    def _find_tool(self, tool: str) -> str | None:
        """Path of a command-line tool (mount, mkfs.*, losetup), or None if missing."""
        return _which(tool)

    @property
    def mounted(self) -> list[MountedFs]:
        """The filesystems made and not yet released, oldest first."""
        return list(self._mounted.values())

    def mounted_at(self, mountpoint: str | os.PathLike[str]) -> MountedFs:
        """The filesystem this factory made at ``mountpoint`` (KeyError if none)."""
        return self._mounted[Path(mountpoint)]

    def make(
        self,
        fstype: str,
        size_mib: int,
        *,
        mount_options: list[str] | str | None = None,
        mkfs_options: list[str] | None = None,
    ) -> Path:
        """Create, format and mount a filesystem; return its (writable) mount point.

        Args:
            fstype: One of :data:`FSTYPES`.
            size_mib: Image size in MiB (tmpfs: its size limit). At least
                :data:`MIN_SIZE_MIB` for the type.
            mount_options: Extra ``mount -o`` options, as a list or a
                comma-separated string (e.g. ``["noauto_da_alloc"]``).
            mkfs_options: Extra mkfs arguments, appended after the defaults
                (so they can override them, e.g. ``["-b", "1024"]`` for ext4).

        Returns:
            The mount point.

        Raises:
            ValueError: Unknown type or a size below the type's minimum.
            FilesystemUnavailable: Not root, mkfs tool missing, mkfs or mount failed.
        """
        if fstype not in FSTYPES:
            raise ValueError(f"unknown fstype {fstype!r}; expected one of {FSTYPES}")
        if size_mib < MIN_SIZE_MIB[fstype]:
            raise ValueError(
                f"{fstype} needs at least {MIN_SIZE_MIB[fstype]} MiB, got {size_mib} MiB"
            )
        if os.geteuid() != 0:
            raise FilesystemUnavailable(f"mounting {fstype} needs root")
        if isinstance(mount_options, str):
            mount_options = [o for o in mount_options.split(",") if o]
        opts = list(mount_options or [])

        self._counter += 1
        name = f"{fstype}-{self._counter}"
        mountpoint = self.base / name
        mountpoint.mkdir()
        mount = self._find_tool("mount")
        if mount is None:
            raise FilesystemUnavailable("the mount tool is missing (Debian package: mount)")

        if fstype == "tmpfs":
            argv = [mount, "-t", "tmpfs", "-o", ",".join([f"size={size_mib}m", *opts])]
            argv += [self.tmpfs_source, str(mountpoint)]
            proc = _run(argv)
            if proc.returncode != 0:
                mountpoint.rmdir()
                raise FilesystemUnavailable(f"mounting tmpfs failed: {proc.stderr.strip()}")
            fs = MountedFs(fstype, size_mib, mountpoint, None, None)
        else:
            fs = self._make_image_fs(fstype, size_mib, name, mountpoint, mount, opts, mkfs_options)

        self._mounted[mountpoint] = fs
        os.chmod(mountpoint, 0o777)  # so a test may run its writer unprivileged
        return mountpoint

    def _make_image_fs(
        self,
        fstype: str,
        size_mib: int,
        name: str,
        mountpoint: Path,
        mount: str,
        opts: list[str],
        mkfs_options: list[str] | None,
    ) -> MountedFs:
        image = self.base / f"{name}.img"
        mkfs = _MKFS[fstype]
        tool = self._find_tool(mkfs[0])
        if tool is None:
            mountpoint.rmdir()
            raise FilesystemUnavailable(
                f"{mkfs[0]} is missing (Debian package: {_PACKAGES[fstype]})"
            )
        with open(image, "wb") as f:
            f.truncate(size_mib * MiB)  # sparse: costs no disk until written
        proc = _run([tool, *mkfs[1:], *(mkfs_options or []), str(image)])
        if proc.returncode != 0:
            image.unlink()
            mountpoint.rmdir()
            raise FilesystemUnavailable(
                f"{mkfs[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            )
        argv = [mount, "-t", fstype, "-o", ",".join(["loop", *opts]), str(image), str(mountpoint)]
        proc = _run(argv)
        if proc.returncode != 0:
            # mount -o loop may have attached a device before the mount failed.
            _detach(loop_devices_under(image))
            image.unlink()
            mountpoint.rmdir()
            raise FilesystemUnavailable(
                f"mounting {fstype} ({' '.join(argv)}) failed: {proc.stderr.strip()}"
            )
        return MountedFs(fstype, size_mib, mountpoint, image, mount_source(mountpoint), tuple(opts))

    def remount(self, mountpoint: str | os.PathLike[str]) -> Path:
        """Unmount an image filesystem and mount it again, on a fresh loop device.

        What the filesystem holds afterwards is what reached the image: after
        a shutdown ioctl (a simulated power cut) this is what a machine would
        find on reboot, log replay included.

        Args:
            mountpoint: A mount point returned by :meth:`make` (not a tmpfs:
                its content would be gone).

        Returns:
            The mount point (unchanged).

        Raises:
            ValueError: Not an image filesystem made by this factory.
            RuntimeError: Unmounting or mounting failed.
        """
        fs = self._mounted.get(Path(mountpoint))
        if fs is None or fs.image is None:
            raise ValueError(f"{mountpoint} is not an image filesystem made by this factory")
        err, lazy = umount(fs.mountpoint)
        if err or lazy:
            raise RuntimeError(err or f"{mountpoint} was busy: it was unmounted lazily")
        # `mount -o loop` sets autoclear: the device goes by itself at its last close, which
        # udev's probe after the unmount may delay (past 2 s under load 20). Mounting while
        # the old device is still attached was seen to give the new mount a shut-down
        # filesystem's EIO (test_crash_powercut, a loaded CI run), so nothing is mounted
        # until it is gone.
        if not _gone(fs.image):
            _detach(loop_devices_under(fs.image))
            if not _gone(fs.image):
                raise RuntimeError(f"loop device {', '.join(loop_devices_under(fs.image))} of "
                                   f"{fs.image} still attached {DETACH_WAIT:.0f} s after "
                                   f"unmounting {mountpoint}")
        mount = self._find_tool("mount") or "mount"
        argv = [
            mount,
            "-t",
            fs.fstype,
            "-o",
            ",".join(["loop", *fs.mount_options]),
            str(fs.image),
            str(fs.mountpoint),
        ]
        proc = _run(argv)
        if proc.returncode != 0:
            raise RuntimeError(
                f"mounting {fs.fstype} again ({' '.join(argv)}) failed: {proc.stderr.strip()}"
            )
        fs.loop_device = mount_source(fs.mountpoint)
        return fs.mountpoint

    def release(self, mountpoint: str | os.PathLike[str]) -> list[str]:
        """Unmount one filesystem, detach its loop device and delete its image.

        Args:
            mountpoint: A mount point returned by :meth:`make`.

        Returns:
            Problems that remain (empty when everything is gone).
        """
        fs = self._mounted.pop(Path(mountpoint), None)
        if fs is None:
            return [f"{mountpoint} was not made by this factory or is already released"]
        return teardown(fs.mountpoint, fs.image)

    def leftovers(self) -> list[str]:
        """Describe anything of this session still mounted or attached."""
        found = [f"still mounted: {mp} ({t})" for mp, t in mounts_under(self.base)]
        found += [
            f"loop device still attached: {dev}"
            for dev in loop_devices_under(self.base)
            if not _autoclear_pending(dev)
        ]
        return found

    def close(self) -> list[str]:
        """Release every filesystem, check nothing is left, remove the session directory.

        Returns:
            Problems that remain (empty when everything is gone). The session
            directory is kept if something is still mounted in it.
        """
        problems: list[str] = []
        for mountpoint in reversed(list(self._mounted)):
            problems += self.release(mountpoint)
        left = self.leftovers()
        problems += [p for p in left if p not in problems]
        if not mounts_under(self.base):
            shutil.rmtree(self.base, ignore_errors=True)
        if self in _open_factories:
            _open_factories.remove(self)
            _give_back_sigterm()
        return problems
