"""A shared tier's trouble said out loud: once per cache, and once more when it works again.

A tier that cannot be used never fails an export, so its trouble would be
easy to miss: a log record only reaches a user who configured logging. Each
cache (the engine cache, the Torch-TensorRT adapter) keeps one
:class:`TierHealth`; its first problem is a log warning *and* a
:class:`SharedCacheWarning` (shown on stderr by Python's default filters,
filterable by category), later problems are logged at INFO until a call
works again, which is said once the same way ("works again"). A server that
ignores conditional writes (:mod:`.probe`) is a lasting problem: its reads
keep working, so a read that works does not say "works again" (it would
flip with each next write's refusal); said once per cache.

Standard library only (and the remote floor's errors); no TensorRT, no
engine cache.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = ["SharedCacheWarning", "TierHealth", "download_failed", "warn"]

# Frames in this package are skipped: the warning names the caller's line (the
# export call), not ours, and Python's "default" filter keys on that line.
_PACKAGE = str(Path(__file__).resolve().parents[2])


class SharedCacheWarning(UserWarning):
    """The shared tier (``EngineCache(remote=...)``) could not be used, or works again.

    The export goes on with the local cache; the events in
    ``report.engine_cache`` say why nothing was downloaded or published.
    Silence it with ``warnings.filterwarnings("ignore",
    category=trtet_store.SharedCacheWarning)``.
    """


#: A log record's attribute: its message is also a :class:`SharedCacheWarning` (shown once).
SAID_AS_WARNING = "trtet_said_as_warning"

def warn(message: str) -> None:
    """Issue ``message`` (made one line) as a :class:`SharedCacheWarning` at the caller's line."""
    frame = sys._getframe(1)  # noqa: SLF001 - the first frame outside the package
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(" ".join(message.split()), SharedCacheWarning, stacklevel=level)


class TierHealth:
    """One cache's view of its tier: down (with the reason warned) or working.

    Parameters
    ----------
    logger : logging.Logger
        Where the log records go (beside the warnings).
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        # Each warning's log record is marked as said already (a SharedCacheWarning),
        # so a handler that prints the library's warnings does not print it twice.
        self._said = {"extra": {SAID_AS_WARNING: True}}
        #: The problem warned about, until a call works again; None while the tier works.
        self.down: str | None = None
        #: The problem is the server's for the process (no conditional writes): kept.
        self.lasting = False

    def failed(self, message: str, *, cause: BaseException | None,
               exc_info: Any = None) -> bool:
        """A tier call failed: warn the first time (True), else log at INFO (False).

        ``cause`` is the failure, given by the caller (never guessed from the
        exception being handled); a
        :class:`~trtet_store.remote.errors.ConditionalWritesUnsupportedError`
        makes the problem lasting (:meth:`worked` does not end it).
        """
        from trtet_store.remote.errors import ConditionalWritesUnsupportedError

        if isinstance(cause, ConditionalWritesUnsupportedError):
            self.lasting = True
        first = self.down is None
        self.down = message
        if first:
            self.log.warning("%s", message, exc_info=exc_info, **self._said)
            warn(message)
        else:
            self.log.info("%s", message)
        return first

    def worked(self, message: str) -> bool:
        """A tier call worked: after a warned problem, say ``message`` once (True).

        Not after a lasting one: the server still ignores conditional writes.
        """
        if self.down is None or self.lasting:
            return False
        self.down = None
        self.log.warning("%s", message, **self._said)
        warn(message)
        return True

    def notice(self, message: str) -> None:
        """A problem of one entry (damaged, foreign), not of the tier: said each time it is met."""
        self.log.warning("%s", message, **self._said)
        warn(message)


#: Substrings of a transport's failure -> what it means to a user, first match wins.
_PLAIN = (("ConnectionResetError", "the connection was reset"),
          ("Connection broken", "the connection was closed"),
          ("IncompleteRead", "the connection was closed"),
          ("ConnectionRefusedError", "the server refused the connection"),
          ("Connection refused", "the server refused the connection"),
          ("timed out", "the server stopped answering"))


def download_failed(exc: BaseException, done: int | None, total: int | None) -> str:
    """What failed in a remote hit's download, for a user: never our own fetch command line.

    ``done``/``total`` are the bytes the download had accounted for when it
    failed (its last progress), when known.
    """
    from trtet_store.io import format_mib

    cause = getattr(exc, "reason", None) or str(exc)
    cause = cause.split("; run `", 1)[0]  # a fetch's own resume command is not the user's
    if "the last with " in cause:  # "<url> bytes a-b: N attempts failed, the last with <why>"
        cause = cause.rsplit("the last with ", 1)[1]
    cause = " ".join(cause.split()).rstrip(".")
    # The transport's nested exception reprs say one plain thing; say that thing.
    plain = next((said for needle, said in _PLAIN if needle in cause), None)
    if plain is not None:
        cause = plain
    if done is not None and total:
        cause += f" at {format_mib(done)} of {format_mib(total)}"
    return cause
