"""Ways for a crash test's writer to die: a power cut, an exit at a chosen system call.

:func:`power_cut` shuts a filesystem down as a power loss would;
:class:`CallHook` runs an action (:func:`die`, a power cut) before a chosen
call of ``trtet_store.io.fs.calls``; :func:`in_child` runs all that in a
forked child so that the test process lives on to recover and check.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from faults import WrappedCalls

# -- the shutdown ioctl ("power cut") --------------------------------------------
#
# include/uapi/linux/ext4.h:   #define EXT4_IOC_SHUTDOWN _IOR('X', 125, __u32)
#                              #define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2
# fs/xfs/libxfs/xfs_fs.h:      #define XFS_IOC_GOINGDOWN _IOR('X', 125, uint32_t)
#                              #define XFS_FSOP_GOING_FLAGS_NOLOGFLUSH 0x2
# (One number for both, also F2FS_IOC_SHUTDOWN and EXFAT_IOC_SHUTDOWN.)
_IOC_READ = 2
_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30


def _ior(type_: str, nr: int, size: int) -> int:
    return ((_IOC_READ << _IOC_DIRSHIFT) | (ord(type_) << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


FS_IOC_SHUTDOWN = _ior("X", 125, 4)  # == EXT4_IOC_SHUTDOWN == XFS_IOC_GOINGDOWN
GOING_FLAGS_NOLOGFLUSH = 2
assert FS_IOC_SHUTDOWN == 0x8004587D

#: The exit status of a process that died on purpose (:func:`die`).
DIED = 86


def power_cut(mountpoint: os.PathLike | str) -> None:
    """Shut the filesystem down without flushing its log: what is not durable is lost.

    From here on every call on the filesystem fails with EIO; unmount and
    mount it again to see what a machine would find after losing power.
    """
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


# -- dying at a chosen system call ---------------------------------------------------------


@dataclass(frozen=True)
class Nth:
    """The ``k``-th call of ``name`` in the run itself, or the call ``plus`` calls after it.

    With ``after``, calls of ``name`` are counted from the first call of
    ``after`` on (``Nth("ftruncate", 2, after="fallocate")``: a move's
    second cut, since the temp files are sized before the first step
    allocates). A number read from another run's trace can fall elsewhere:
    a move's syncs each cover as many steps as were copied meanwhile, so the
    calls before any point in or after a move vary from run to run.
    """

    name: str
    k: int = 1
    plus: int = 0
    after: str | None = None


class CallHook(WrappedCalls):
    """Wrap every call in ``fs.calls``; run ``action(n, name)`` before call number ``at``.

    Parameters
    ----------
    at : int, Nth, set of them, or None
        The call(s) to act before: call numbers, or :class:`Nth` marks found
        in this run as its calls are made; None only counts (``count``,
        ``names``).
    action : callable
        Called as ``action(n, name)``. It may end the process (``os._exit``),
        cut the power, or raise (which the call then does).
    """

    def __init__(self, at: int | Nth | set[int | Nth] | None,
                 action: Callable[[int, str], None]) -> None:
        marks = {at} if isinstance(at, (int, Nth)) else set(at or ())
        self.at = {m for m in marks if isinstance(m, int)}
        self.action = action
        self.count = 0
        self.names: list[str] = []
        #: Each mark's call number, once this run has made that call.
        self.found: dict[Nth, int] = {}
        self._marks = {m: [m.after is None, 0] for m in marks if isinstance(m, Nth)}
        self._lock = threading.Lock()  # a move calls from three threads

    def _wrap(self, name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            with self._lock:
                self.count += 1
                n = self.count
                self.names.append(name)
                self._find(n, name)
            if n in self.at:
                self.action(n, name)
            return real(*args, **kwargs)

        return call

    def _find(self, n: int, name: str) -> None:
        for mark, state in self._marks.items():
            counting, seen = state
            if mark in self.found:
                continue
            if counting and name == mark.name:
                state[1] = seen = seen + 1
                if seen == mark.k:
                    self.found[mark] = n
                    self.at.add(n + mark.plus)
            if name == mark.after:
                state[0] = True


def die(*_: object) -> None:
    """End this process now, like SIGKILL: no cleanup, no finally, no rollback."""
    os._exit(DIED)


def in_child(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child.

    Returns
    -------
    int
        The child's exit status: 0 if ``fn`` returned, 1 if it raised,
        :data:`DIED` (86) if it died on purpose.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            logging.disable(logging.CRITICAL)
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
