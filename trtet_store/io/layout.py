"""Layout: an output file as ordered pieces with absolute offsets, known before any I/O."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trtet_store.io import transfer
from trtet_store.io.blobstore import Blob
from trtet_store.io.units import MiB


@dataclass(frozen=True)
class ExternalFile:
    """A file, or a byte range of one, that the writer may read but does not own.

    Always copied (or cloned, where both offsets are block aligned), never
    truncated. ``size`` is the length placed; ``offset`` where it starts in
    the file; ``file_size`` the whole file's length when the layout was
    planned (by default ``offset + size``): the write fails if the file no
    longer has it. ``chunk_digests`` (xxh3 of each ``chunk_size`` bytes of the
    range, as :func:`chunk_digests` computes them), when given, are checked
    against what is placed.

    A range may come from a file the same write replaces: the old file
    stays whole under its name until every output is placed and verified, so
    a file can be rewritten from its own bytes (a re-save of tensors mapped
    from it, a download that keeps the unchanged ranges of the old version).
    """

    path: Path
    size: int
    offset: int = 0
    file_size: int | None = None
    chunk_size: int = MiB
    chunk_digests: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.size < 0 or self.offset < 0:
            raise ValueError(f"{self.path}: offset {self.offset} and size {self.size} must "
                             "not be negative")
        if self.file_size is None:
            object.__setattr__(self, "file_size", self.offset + self.size)
        elif self.offset + self.size > self.file_size:
            raise ValueError(f"{self.path}: range [{self.offset}, {self.offset + self.size}) "
                             f"ends past the file's {self.file_size} bytes")
        if self.chunk_size <= 0:
            raise ValueError(f"{self.path}: chunk_size must be positive")
        if self.chunk_digests is not None:
            digests = tuple(self.chunk_digests)
            object.__setattr__(self, "chunk_digests", digests)
            expected = -(-self.size // self.chunk_size)
            if len(digests) != expected:
                raise ValueError(f"{self.path}: {len(digests)} chunk digests for {self.size} "
                                 f"bytes in chunks of {self.chunk_size}; expected {expected}")

    @classmethod
    def of(cls, path: os.PathLike | str) -> ExternalFile:
        """An :class:`ExternalFile` with the current size of ``path``."""
        p = Path(path).absolute()
        return cls(p, os.stat(p).st_size)

    @classmethod
    def range(cls, path: os.PathLike | str, offset: int, size: int, *,
              digests: bool = False) -> ExternalFile:
        """Bytes ``[offset, offset + size)`` of ``path``, planned with its current length.

        Parameters
        ----------
        path : path-like
            The file.
        offset, size : int
            Where the range starts in it, and its length.
        digests : bool
            Read the range now and record its chunk digests, so that a copy is
            checked against the bytes as they are now.
        """
        p = Path(path).absolute()
        file_size = os.stat(p).st_size
        chunks = None
        if digests:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            try:
                chunks = tuple(transfer.range_chunk_digests(fd, offset, size, MiB, os.fspath(p)))
            finally:
                os.close(fd)
        return cls(p, size, offset, file_size, MiB, chunks)


Payload = Blob | ExternalFile
Piece = bytes | bytearray | memoryview | Blob | ExternalFile


@dataclass(frozen=True)
class Extent:
    """One piece at its place in the output."""

    index: int
    offset: int
    size: int
    piece: Piece

    @property
    def is_payload(self) -> bool:
        return isinstance(self.piece, (Blob, ExternalFile))


class Layout:
    """The output file as a sequence of extents.

    Parameters
    ----------
    pieces : iterable of bytes, Blob or ExternalFile
        The file content in order. ``bytes`` pieces are small (headers,
        flatbuffers, padding) and written inline; file pieces are placed.
    """

    def __init__(self, pieces) -> None:
        extents = []
        offset = 0
        for i, piece in enumerate(pieces):
            if isinstance(piece, (bytes, bytearray, memoryview)):
                size = len(memoryview(piece).cast("B"))
            elif isinstance(piece, Blob):
                if piece.closed:
                    raise ValueError(f"piece {i}: {piece!r} was released")
                size = piece.size
            elif isinstance(piece, ExternalFile):
                size = piece.size
            else:
                raise TypeError(
                    f"piece {i}: expected bytes, Blob or ExternalFile, got {type(piece).__name__}"
                )
            extents.append(Extent(i, offset, size, piece))
            offset += size
        self.extents: tuple[Extent, ...] = tuple(extents)
        self.size = offset

    @property
    def payloads(self) -> list[Extent]:
        """Extents backed by files, in file order."""
        return [e for e in self.extents if e.is_payload and e.size]

    @property
    def inline(self) -> list[Extent]:
        """Extents held in memory, in file order."""
        return [e for e in self.extents if not e.is_payload and e.size]

    def inline_bytes(self) -> int:
        """Bytes written from memory."""
        return sum(e.size for e in self.inline)

    def __len__(self) -> int:
        return self.size
