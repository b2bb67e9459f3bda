"""Layout: an output file as ordered pieces with absolute offsets, known before any I/O."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trtet_store.io.blobstore import Blob


@dataclass(frozen=True)
class ExternalFile:
    """A file the writer may read but does not own: always copied, never truncated.

    ``size`` is the length the layout was planned with; the write fails if the
    file no longer has it.
    """

    path: Path
    size: int

    @classmethod
    def of(cls, path: os.PathLike | str) -> ExternalFile:
        """An :class:`ExternalFile` with the current size of ``path``."""
        p = Path(path).absolute()
        return cls(p, os.stat(p).st_size)


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
