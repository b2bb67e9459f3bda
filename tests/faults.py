"""Fault injection around the storage engine's real system calls.

:class:`FaultInjector` replaces each entry of ``trtet_store.io.fs.calls`` with
a wrapper that counts calls and, at the Nth, raises or returns a short count
instead of (or after) doing the real thing. Nothing about the filesystem is
faked: every call that is not the faulted one runs for real.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trtet_store.io import fs

SHORTABLE = {"pwrite", "copy_file_range"}


class WrappedCalls:
    """Inside ``with``, every entry of ``fs.calls`` is replaced by ``self._wrap(name, real)``."""

    def __enter__(self):
        self._saved: dict[str, Callable] = {}
        for name in fs.NAMES:
            real = getattr(fs.calls, name)
            self._saved[name] = real
            setattr(fs.calls, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(fs.calls, name, real)

    def _wrap(self, name: str, real: Callable) -> Callable:
        raise NotImplementedError


@dataclass
class FaultInjector(WrappedCalls):
    """Count calls; at call number ``fail_at`` (1-based) inject ``mode``.

    Modes: ``"eio"`` raises EIO before the call, ``"enospc"`` raises ENOSPC,
    ``"short"`` performs half of a write or copy and returns that count (other
    calls raise EIO), ``"crash"`` raises :class:`SimulatedCrash` (a
    BaseException, like a signal), so nothing rolls back after it.
    """

    fail_at: int | None = None
    mode: str = "eio"
    only: frozenset[str] | None = None
    count: int = 0
    fired: str | None = None
    log: list[str] = field(default_factory=list)
    # A move calls from three threads: each call gets its own number.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _wrap(self, name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            if self.only is not None and name not in self.only:
                return real(*args, **kwargs)
            with self._lock:
                self.count += 1
                n = self.count
                self.log.append(name)
                if n == self.fail_at:
                    self.fired = name
            if n != self.fail_at:
                return real(*args, **kwargs)
            if self.mode == "crash":
                raise SimulatedCrash(f"crash at call {n} ({name})")
            if self.mode == "short" and name in SHORTABLE:
                return _short(name, real, args)
            code = errno.ENOSPC if self.mode == "enospc" else errno.EIO
            if name == "close":
                real(*args, **kwargs)  # Linux releases the descriptor even when close fails
            raise OSError(code, f"injected {os.strerror(code)} at call {n} ({name})")

        return call


class SimulatedCrash(BaseException):
    """The process 'dies' here: no except-Exception handler runs."""


def _short(name: str, real: Callable, args: tuple) -> int:
    if name == "pwrite":
        fd, data, offset = args
        data = memoryview(data)
        half = max(1, len(data) // 2) if len(data) > 1 else len(data)
        return real(fd, data[:half], offset)
    src, dst, count, *rest = args
    return real(src, dst, max(1, count // 2), *rest)


def count_calls(action: Callable[[], object]) -> int:
    """How many engine system calls ``action`` makes when nothing fails."""
    with FaultInjector() as inj:
        action()
    return inj.count


@contextlib.contextmanager
def slow_syncs(delay: float):
    """Each ``fdatasync`` returns ``delay`` seconds after it has synced, as on a
    disk whose flush is slow.

    The move's caller copies the next steps meanwhile (after the bytes the
    sync covers), so the next sync covers several steps; a cut past what a
    sync covered would reach bytes only in the page cache.
    """
    real = fs.calls.fdatasync

    def late(fd):
        result = real(fd)
        time.sleep(delay)
        return result

    if delay:
        fs.calls.fdatasync = late
    try:
        yield
    finally:
        fs.calls.fdatasync = real
