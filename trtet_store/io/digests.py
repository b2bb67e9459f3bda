"""What a blob is sealed with: its file identity and its content digests.

A blob's content is digested as it is written (:class:`Digester`): one
xxh3-128 of the whole stream, for reports, and one xxh3-64 of each
``chunk_size`` chunk, which a placement checks the payload against chunk by
chunk. Its *identity* (:func:`file_identity`) is what a zero-copy placement,
which never reads the bytes, checks instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from trtet_store.io import fs, pagecache
from trtet_store.io.units import MiB

DEFAULT_CHUNK_SIZE = MiB


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The identity a blob is sealed with: device, inode, size, mtime_ns, ctime_ns.

    Any write, truncate, ``touch`` or replacement of the file changes one of
    them, and comparing them costs one ``stat``, whatever the file's size.
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Digester:
    """xxh3-128 of a whole stream plus xxh3-64 of each ``chunk_size`` chunk of it."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.total = xxhash.xxh3_128()
        self.chunks: list[int] = []
        self._chunk = xxhash.xxh3_64()
        self._fill = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Digest ``data``, the next bytes of the stream (any buffer, read as bytes)."""
        view = memoryview(data).cast("B")
        self.total.update(view)
        self.size += len(view)
        while len(view):
            take = min(len(view), self.chunk_size - self._fill)
            self._chunk.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == self.chunk_size:
                self.chunks.append(self._chunk.intdigest())
                self._chunk = xxhash.xxh3_64()
                self._fill = 0

    def finish(self) -> tuple[str, tuple[int, ...]]:
        """``(xxh3-128 hex of the stream, xxh3-64 of each chunk)``; call once."""
        if self._fill:
            self.chunks.append(self._chunk.intdigest())
            self._fill = 0
        return self.total.hexdigest(), tuple(self.chunks)


def chunk_digest(data: bytes | memoryview) -> int:
    """The per-chunk digest recorded in :attr:`Blob.chunk_digests`."""
    return xxhash.xxh3_64_intdigest(data)


def digest_file(path: Path, chunk_size: int,
                drop_cached: bool) -> tuple[str, tuple[int, ...], int]:
    """Read ``path`` once and digest it as :class:`Digester` would have as it was written.

    Parameters
    ----------
    path : pathlib.Path
        The file to read.
    chunk_size : int
        The span of each per-chunk digest.
    drop_cached : bool
        Drop the file's pages from the page cache afterwards (see
        :mod:`trtet_store.io.pagecache`).

    Returns
    -------
    tuple
        ``(digest, chunk_digests, size)``: the xxh3-128 hex digest, the
        xxh3-64 of each chunk, and the number of bytes read.
    """
    fd = fs.calls.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        result = digest_fd(fd, chunk_size)
        if drop_cached:
            pagecache.drop(fd, 0, 0)
    finally:
        fs.calls.close(fd)
    return result


def digest_fd(fd: int, chunk_size: int) -> tuple[str, tuple[int, ...], int]:
    """Read the open file ``fd`` from its start to its end and digest it as :func:`digest_file`.

    Returns
    -------
    tuple
        ``(digest, chunk_digests, size)``, as :func:`digest_file`.
    """
    d = Digester(chunk_size)
    step = max(chunk_size, 8 * MiB) // chunk_size * chunk_size
    pos = 0
    while chunk := fs.calls.pread(fd, step, pos):
        d.update(chunk)
        pos += len(chunk)
    digest, chunks = d.finish()
    return digest, chunks, d.size
