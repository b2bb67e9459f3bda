"""Keeping staged payloads out of the page cache: write-behind and drop-behind.

A staged engine is written once and then only placed, never read by us again.
Left in the page cache it costs twice:

- a blob of tens of GiB evicts everything else the machine had cached, and
  sits dirty in memory until writeback catches up with it;
- ext4's ``FALLOC_FL_INSERT_RANGE`` writes back and drops every cached page
  of the file beyond the insert offset (``truncate_pagecache``), so an insert
  placement into a fully cached 4 GiB blob took 0.37 s here and into an
  uncached one under a millisecond: the one placement that should cost the
  same at every size would grow with it.

So a blob's writer starts writeback of each window as soon as it is full and
drops the window before it once that is on disk, the pattern of
``dd oflag=nocache``. The work happens while the bytes are being written
anyway; ``benchmarks/drop_behind.py`` measures what it costs the staging.

``sync_file_range`` only schedules and waits for page writeback: it commits
no metadata and flushes no disk cache, so it is no substitute for ``fsync``;
a write still syncs its sources before its journal names them.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os

from trtet_store.io import fs
from trtet_store.io.units import MiB, round_up

log = logging.getLogger("trtet_store.pagecache")

WINDOW = 8 * MiB
"""Bytes per writeback window: large enough for sequential I/O, small next to RAM."""

PAGE = mmap.PAGESIZE
"""The page cache's page: the kernel's page size (``units.PAGE`` is a block, 4 KiB)."""

LARGEST_FOLIO = 2 * MiB
"""The largest page-cache folio of a file (x86-64 and arm64 with 4 KiB pages:
PMD size); a folio only partly inside a range is not dropped from the cache."""

# A pipe (ESPIPE), FUSE or an old kernel cannot do this: the pages stay
# cached, which costs memory and time but loses nothing. Any other error
# (EIO above all) is a failed writeback and must be raised: sync_file_range
# consumes the file's error state, so a later fsync on another descriptor
# would not report it.
_NOT_SUPPORTED = fs.UNSUPPORTED_ERRNOS | {errno.ESPIPE}


def supported(call, *args: int) -> bool:
    """Run ``call(*args)``; False where the file cannot do it, any other error raised."""
    try:
        call(*args)
    except OSError as exc:
        if exc.errno not in _NOT_SUPPORTED:
            raise
        log.debug("page cache control not supported here (%s); pages stay cached", exc)
        return False
    return True


def drop(fd: int, offset: int, length: int) -> bool:
    """Write ``[offset, offset+length)`` of ``fd`` back, wait for it, and drop it from the cache.

    ``length`` 0 means to the end of the file. Returns False where the file
    cannot do this (its pages simply stay cached); raises on a writeback error.
    """
    wait_all = (fs.SYNC_FILE_RANGE_WAIT_BEFORE | fs.SYNC_FILE_RANGE_WRITE
                | fs.SYNC_FILE_RANGE_WAIT_AFTER)
    return (supported(fs.calls.sync_file_range, fd, offset, length, wait_all)
            and supported(fs.calls.fadvise, fd, offset, length, os.POSIX_FADV_DONTNEED))


def drop_clean(fd: int, start: int, end: int) -> bool:
    """Drop the whole pages of bytes ``[start, end)`` of ``fd``, already written back.

    Waits for nothing: clean pages go, and a page only partly inside the
    range stays (its other bytes may not be written yet). Returns False where
    the file cannot do this (its pages simply stay cached).
    """
    first, last = round_up(start, PAGE), end // PAGE * PAGE
    return last <= first or supported(fs.calls.fadvise, fd, first, last - first,
                                      os.POSIX_FADV_DONTNEED)


class DropBehind:
    """Write-behind and drop-behind for a file written front to back.

    Call :meth:`advance` after each write with the length written so far and
    :meth:`finish` once the last byte is written. At most two windows of the
    file are in the page cache at any time: the one being filled and the one
    being written back. Where the file cannot do this, it stops trying.

    Parameters
    ----------
    fd : int
        The file, open for writing.
    window : int
        Bytes per writeback window.
    """

    def __init__(self, fd: int, window: int = WINDOW) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.fd = fd
        self.window = window
        self.started = 0  # writeback scheduled for [0, started)
        self.dropped = 0  # written back and dropped: [0, dropped)
        self.enabled = True

    def advance(self, written: int) -> None:
        """The file's first ``written`` bytes are written; push full windows behind."""
        while self.enabled and written - self.started >= self.window:
            self.enabled = supported(fs.calls.sync_file_range, self.fd, self.started,
                                      self.window, fs.SYNC_FILE_RANGE_WRITE)
            if not self.enabled:
                return
            self.started += self.window
            # The window before this one had a whole window's writing time to
            # reach the disk, so waiting for it rarely waits.
            if self.started - self.dropped > self.window:
                self.enabled = drop(self.fd, self.dropped, self.window)
                if self.enabled:
                    self.dropped += self.window

    def finish(self, written: int) -> None:
        """Drop the rest of the file, if it was long enough to start dropping at all.

        A file shorter than a window stays cached: waiting for its writeback
        would cost a small blob more than its cached pages ever can.
        """
        if (self.enabled and self.started and written > self.dropped
                and drop(self.fd, self.dropped, written - self.dropped)):
            self.dropped = written
