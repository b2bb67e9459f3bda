"""One progress across the keys of a push or pull (the two-level cache's transfers).

Knows no TensorRT: keys are opaque strings, progress is :class:`trtet_store.io.Progress`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from trtet_store.io import Progress

__all__ = ["Tally", "check_progress", "key_list"]


def key_list(keys: Sequence[str], what: str) -> list[str]:
    """``keys`` as a list without repeats; TypeError/ValueError naming ``what()`` otherwise."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"{what}() takes a sequence of keys, got {type(keys).__name__} "
                        "(a single key: [key])")
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad:
        raise TypeError(f"{what}() keys must be non-empty strings, got {bad!r}")
    if not keys:
        raise ValueError(f"{what}() needs at least one key")
    return list(dict.fromkeys(keys))


class Tally:
    """One :class:`~trtet_store.io.Progress` across the keys of a push or pull.

    The tier reports each key's transfer on its own (publish's
    ``PublishProgress``, fetch's ``FetchProgress``: ``.done`` of that key's
    files), from several threads and not always in order; the caller is given
    bytes across every key of the call, never going back.
    """

    def __init__(self, callback: Callable[[Progress], Any] | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.base = 0  # the bytes of the keys settled so far
        self.done = 0
        self._lock = threading.Lock()
        if callback is not None:
            callback(Progress(0, total))  # the bar appears (and knows its size) at once

    def key(self, size: int) -> Callable[[Any], None] | None:
        """The tier's progress callback for the next key (``size`` bytes), or None."""
        if self.callback is None:
            return None
        base = self.base
        return lambda update: self._report(base + min(max(int(update.done), 0), size))

    def settled(self, size: int) -> None:
        """The key is done, whatever was sent (an entry already there sends nothing)."""
        self.base += size
        self._report(self.base)

    def _report(self, done: int) -> None:
        if self.callback is None:
            return
        with self._lock:  # in order: a later update never shows fewer bytes
            if done <= self.done:
                return
            self.done = done
            self.callback(Progress(done, self.total))


def check_progress(progress: Any, what: str) -> None:
    """TypeError unless ``progress`` is None or callable."""
    if progress is not None and not callable(progress):
        raise TypeError(f"{what}(): progress must be a callable taking a "
                        f"trtet_store.Progress(done, total), got {type(progress).__name__}")


