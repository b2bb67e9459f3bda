"""Engine system calls recorded with the instants they started and returned, for order checks.

A move calls from three threads (copy, check, sync-and-cut): a trace keeps, per call,
one counter's instant at its start and at its return, so a test can ask what
had returned before a call began.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

from faults import WrappedCalls


class Recorder(WrappedCalls):
    """Records ``(name, fd)`` of every engine call (fd: the first argument, if an int).

    ``events`` also has, per call, the instants it started and returned (one
    counter for all threads), its arguments and its result.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.events: list[dict] = []
        self._clock = itertools.count()
        self._lock = threading.Lock()

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            with self._lock:
                self.calls.append((name, args[0] if args and isinstance(args[0], int) else None))
                event = {"name": name, "args": args, "start": next(self._clock),
                         "thread": threading.current_thread().name}
                self.events.append(event)
            result = real(*args, **kwargs)
            with self._lock:
                event["end"], event["result"] = next(self._clock), result
            return result

        return call


def copied_ahead(events: list[dict], src_fd: int, dst_fd: int, dst_offset: int,
                 length: int) -> Iterator[int]:
    """Per destination write of the payload: bytes from its start up to the source's length
    when it began.

    The source's length then is the last truncation that returned before
    the write started: what the move had in both files, this write included.
    """
    cuts = sorted((e["end"], e["args"][1]) for e in events
                  if e["name"] == "ftruncate" and e["args"][0] == src_fd and "end" in e)
    for w in events:
        if w["name"] == "pwrite" and w["args"][0] == dst_fd and w["args"][2] >= dst_offset:
            left = min([new for end, new in cuts if end < w["start"]], default=length)
            yield left - (w["args"][2] - dst_offset)
