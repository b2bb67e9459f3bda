"""Whether a process waits in ``flock``: the state a lock test sets up, never a sleep.

``/proc/locks`` lists each blocked request as a ``->`` line naming the waiting process
(its thread group id, so a thread of this process shows as ``os.getpid()``):
``7: -> FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def waits_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked in ``flock`` (a ``->`` waiter line of /proc/locks)."""
    rows = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
    return any(len(r) > 5 and r[1] == "->" and r[5] == str(pid) for r in rows)


def until_waiting(pid: int, alive: Callable[[], bool], limit: float = 120.0) -> None:
    """Return once ``pid`` waits in ``flock``; fail if ``alive()`` turns False first (or at
    ``limit`` seconds, a hang guard far above any wait on a loaded machine)."""
    end = time.monotonic() + limit
    while not waits_on_a_lock(pid):
        assert alive(), "the waiter ended before it waited on the lock"
        assert time.monotonic() < end, f"pid {pid} never waited on the lock"
        time.sleep(0.01)
