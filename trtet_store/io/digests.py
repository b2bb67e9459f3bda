"""What a blob is sealed with: its file identity and its content digests.

A blob's content is digested as it is written (:class:`Digester`): one
xxh3-128 of the whole stream, for reports, and one xxh3-64 of each
``chunk_size`` chunk, which a placement checks the payload against chunk by
chunk. Its *identity* (:func:`file_identity`) is what a zero-copy placement,
which never reads the bytes, checks instead.

Every byte digested here is counted (:func:`bytes_digested`): a digest is
computed once per byte that enters the machine, and the count's delta over
one export is how tests (and benchmarks) see that no layer read it again.

Where a signature must vouch for the bytes, a cryptographic digest is asked
for too (``sha256=True`` on :class:`Digester`, :class:`InOrderDigest`,
:func:`read_digests`): it is taken in the same pass over the same buffers,
never by reading the bytes again (xxh3 is not second-preimage resistant, so
it alone cannot carry a signature).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import xxhash

from trtet_store.io import fs, pagecache
from trtet_store.io.units import MiB

DEFAULT_CHUNK_SIZE = MiB

# Bytes digested by this process, every digest path of io together (see bytes_digested).
_digested = 0
_digested_mutex = threading.Lock()


def _count(n: int) -> None:
    global _digested
    with _digested_mutex:
        _digested += n


def bytes_digested() -> int:
    """Bytes this process has digested so far, through any of io's digest paths.

    :class:`Digester` (a blob's writer, :func:`digest_fd`, :func:`digest_file`,
    an adopted file's first use) and :func:`chunk_digest` (a placement's or a
    download's check) all count here. Take the difference of two calls to
    measure one operation (other threads' digests count too).
    """
    with _digested_mutex:
        return _digested


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The identity a blob is sealed with: device, inode, size, mtime_ns, ctime_ns.

    Any write, truncate, ``touch`` or replacement of the file changes one of
    them, and comparing them costs one ``stat``, whatever the file's size.
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Digests:
    """A file's digests, known without reading it: what a layer that computed or
    checked them hands to the next, so that no layer reads the bytes again.

    Attributes
    ----------
    digest : str
        xxh3-128 hex of the whole file (as :class:`Digester`).
    size : int
        Its length in bytes.
    chunk_size : int
        The span each of ``chunk_digests`` covers.
    chunk_digests : tuple of int or None
        xxh3-64 of each chunk, or None when not known.
    identity : tuple of int or None
        :func:`file_identity` of the file the digests were taken of, when it
        is that file: a receiver trusts them only while the file still has it.
        None: the digests describe the bytes, wherever they are now (a clone
        just made of a file whose identity matched its seal).
    sha256 : str or None
        sha256 hex of the whole file, taken in the same pass, when it was
        asked for (what a signature names the bytes by); else None.
    """

    digest: str
    size: int
    chunk_size: int
    chunk_digests: tuple[int, ...] | None = None
    identity: tuple[int, ...] | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.digest, str) or len(self.digest) != 32:
            raise ValueError(f"Digests.digest must be an xxh3-128 hex digest, got "
                             f"{self.digest!r}")
        if self.chunk_digests is not None and \
                len(self.chunk_digests) != -(-self.size // self.chunk_size):
            raise ValueError(f"{len(self.chunk_digests)} chunk digests for {self.size} bytes "
                             f"in chunks of {self.chunk_size}")
        if self.sha256 is not None and not is_sha256(self.sha256):
            raise ValueError(f"Digests.sha256 must be a sha256 hex digest, got {self.sha256!r}")

    def chunks_for(self, chunk_size: int) -> tuple[int, ...] | None:
        """The chunk digests if they are of ``chunk_size`` chunks, else None."""
        return self.chunk_digests if self.chunk_size == chunk_size else None


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 hex digest as written here (64 lowercase hex digits)."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


class Digester:
    """xxh3-128 of a whole stream plus xxh3-64 of each ``chunk_size`` chunk of it.

    ``sha256=True``: the stream's sha256 too, from the same buffers
    (:meth:`sha256`).
    """

    def __init__(self, chunk_size: int, *, sha256: bool = False) -> None:
        self.chunk_size = chunk_size
        self.total = xxhash.xxh3_128()
        self._sha = hashlib.sha256() if sha256 else None
        self.chunks: list[int] = []
        self._chunk = xxhash.xxh3_64()
        self._fill = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Digest ``data``, the next bytes of the stream (any buffer, read as bytes)."""
        view = memoryview(data).cast("B")
        self.total.update(view)
        if self._sha is not None:
            self._sha.update(view)
        self.size += len(view)
        _count(len(view))
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

    def sha256(self) -> str | None:
        """The sha256 hex of the stream so far (None unless asked for)."""
        return self._sha.hexdigest() if self._sha is not None else None


class InOrderDigest:
    """xxh3-128 of a file whose ranges arrive from several threads, taken in offset order.

    Each thread holding a range's bytes (in memory, just received) calls
    :meth:`add`, which waits until every earlier byte was added: the file is
    digested as it arrives, never read back. ``counted=False`` when these
    bytes were counted already by the same pass (a download's chunk check of
    the same buffer). ``sha256=True``: the file's sha256 too, in the same pass.
    """

    def __init__(self, size: int, *, counted: bool = False, sha256: bool = False) -> None:
        self.size = size
        self._counted = counted
        self._hasher = xxhash.xxh3_128()
        self._sha = hashlib.sha256() if sha256 else None
        self._next = 0
        self._turn = threading.Condition()

    def add(self, offset: int, data: bytes | bytearray | memoryview,
            stop: threading.Event | None = None) -> bool:
        """Digest ``data``, the bytes at ``offset``, once all before them are in.

        Returns False (nothing digested) when ``stop`` is set while waiting.
        """
        with self._turn:
            while self._next != offset:
                if (stop is not None and stop.is_set()) or offset < self._next:
                    return False
                self._turn.wait(0.1)
            view = memoryview(data).cast("B")
            self._hasher.update(view)
            if self._sha is not None:
                self._sha.update(view)
            if not self._counted:
                _count(len(view))
            self._next += len(view)
            self._turn.notify_all()
        return True

    def digest(self) -> str | None:
        """The xxh3-128 hex of the whole file, or None unless all ``size`` bytes were added."""
        with self._turn:
            return self._hasher.hexdigest() if self._next == self.size else None

    def sha256(self) -> str | None:
        """The sha256 hex of the whole file, or None (not asked for, or not all added)."""
        with self._turn:
            if self._sha is None or self._next != self.size:
                return None
            return self._sha.hexdigest()


def chunk_digest(data: bytes | memoryview) -> int:
    """The per-chunk digest recorded in :attr:`Blob.chunk_digests`."""
    _count(len(data) if isinstance(data, bytes) else memoryview(data).nbytes)
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
    got = read_digests(fd, chunk_size)
    return got.digest, got.chunk_digests or (), got.size


def read_digests(fd: int, chunk_size: int, *, sha256: bool = False) -> Digests:
    """Read the open file ``fd`` from its start to its end once: its :class:`Digests`.

    ``sha256=True``: with the sha256 of the bytes, from the same pass. The
    identity is left None (the caller knows which file it opened).
    """
    d = Digester(chunk_size, sha256=sha256)
    step = max(chunk_size, 8 * MiB) // chunk_size * chunk_size
    pos = 0
    while chunk := fs.calls.pread(fd, step, pos):
        d.update(chunk)
        pos += len(chunk)
    digest, chunks = d.finish()
    return Digests(digest, d.size, chunk_size, chunks, None, d.sha256())
