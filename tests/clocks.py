"""A lease wait's clock for tests (``RemoteTier.clock``): it moves only when the wait sleeps.

``TestClock(on_sleep)``: ``monotonic()`` starts at 0 and ``time()`` at a fixed epoch
second; ``sleep(s)`` adds ``s`` at once and then calls ``on_sleep(clock)`` (a holder's
renewal, a bucket writer's put between two looks). ``t`` and ``sleeps`` say how long and
how often the wait slept. So "unchanged for its ttl on the waiter's clock" takes no wall
time. (The server's clock, Date less Last-Modified, is moved by tests/tcp_proxy.py's
``date_skew``.)
"""

from __future__ import annotations

from collections.abc import Callable

from trtet_store.cache.tier.lease import Clock


class TestClock(Clock):
    """A waiter's clock that moves only when it sleeps; ``on_sleep`` runs at each sleep."""

    __test__ = False

    def __init__(self, on_sleep: Callable[[TestClock], object] | None = None) -> None:
        self.t = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return 1_800_000_000.0 + self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.sleeps += 1
        if self.on_sleep is not None:
            self.on_sleep(self)
