"""What a publish reads: objects as ordered pieces (bytes, staged blobs, file ranges).

An :class:`ObjectSource` is one object to publish, named like the file
``save_program`` would write, made of the storage engine's pieces: inline
``bytes``, :class:`~trtet_store.io.Blob` (a staged file, read in place) and
:class:`~trtet_store.io.ExternalFile` (a file, or a range of one). Bytes are
read with ``preadv`` straight into the part buffer, never assembled into a
local file.

Each file piece is checked as it is read: a blob against its sealed identity
(before anything is sent, and again after its last byte passes) and, where
its digests are known, against them; a file against the size it was planned
with. A change raises :class:`~trtet_store.io.SourceChangedError`.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.io import Blob, ExternalFile, MiB, SourceChangedError
from trtet_store.remote.checksum import CHUNK_SIZE, PieceDigester
from trtet_store.remote.errors import FileNameError, NotARegularFileError
from trtet_store.remote.filenames import name_problem


def check_regular_file(path: Path) -> None:
    """Raise unless ``path`` is a regular file (a link to one is one), by ``stat``: never opened.

    Raises
    ------
    FileNotFoundError
        Nothing is there.
    NotARegularFileError
        A FIFO, a device (``/dev/zero``), a directory, a socket.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise NotARegularFileError(f"{path} is not a regular file ({kind}): publish reads "
                                   "files only; give the path of a file", os.fspath(path))


def _open_source(path: os.PathLike | str) -> int:
    """Open a source file to read; O_NONBLOCK so that a FIFO swapped in never blocks us."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SourceChangedError(path, "the file is gone") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SourceChangedError(path, "it is no longer a regular file")
    return fd


@dataclass
class Extent:
    """One piece at its place in the object."""

    offset: int
    size: int
    piece: object  # bytes-like, Blob or ExternalFile

    @property
    def kind(self) -> str:
        return "file" if isinstance(self.piece, (Blob, ExternalFile)) else "inline"

    @property
    def end(self) -> int:
        return self.offset + self.size

    def known_digest(self) -> str | None:
        """The piece's xxh3-128 if known without reading a file (inline: hashed now)."""
        if self.kind == "inline":
            return _inline_digest(self.piece)
        if isinstance(self.piece, Blob) and self.piece.has_digests:
            return self.piece.digest
        return None


def _inline_digest(piece: object) -> str:
    d = PieceDigester()
    d.update(piece)  # type: ignore[arg-type]
    return d.finish()[0]


def _piece_size(i: int, piece: object) -> int:
    if isinstance(piece, (bytes, bytearray, memoryview)):
        return memoryview(piece).nbytes
    if isinstance(piece, Blob):
        if piece.closed:
            raise ValueError(f"piece {i}: {piece!r} was released")
        return piece.size
    if isinstance(piece, ExternalFile):
        return piece.size
    raise TypeError(f"piece {i}: expected bytes, Blob or ExternalFile, got {type(piece).__name__}")


@dataclass
class ObjectSource:
    """One object to publish: its ``name`` (a plain file name) and its pieces in order."""

    name: str
    pieces: list
    extents: list[Extent] = field(init=False)
    size: int = field(init=False)
    #: a file piece's (device, inode, size, mtime, ctime) when checked, by id(piece)
    identities: dict[int, tuple[int, ...]] = field(init=False, default_factory=dict)
    #: Set ``want_sha256`` and a :class:`Reader` that reads the object whole, in order,
    #: leaves the sha256 of what it read in ``sha256`` (the upload's own pass: what a
    #: signature names the bytes by, taken without reading them again).
    want_sha256: bool = field(init=False, default=False)
    sha256: str | None = field(init=False, default=None)
    #: With ``sha256``, for an object of one piece: that pass's xxh3-128 of it.
    sha256_xxh3: str | None = field(init=False, default=None)
    #: Set ``want_chunk_sha256`` (with ``want_sha256``) and that pass leaves the sha256 of
    #: each chunk of each piece in ``chunk_sha256`` too (a signed program manifest's).
    want_chunk_sha256: bool = field(init=False, default=False)
    chunk_sha256: tuple[tuple[str, ...], ...] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # Every object's floor (publish checks a program's names against the .ptd rule
        # too): plain, showable, none of trtet_store's own; before anything is sent.
        why = name_problem(self.name, program=True)
        if why is not None:
            raise FileNameError(f"an object's name {self.name!r} {why}", self.name)
        offset = 0
        self.extents = []
        for i, piece in enumerate(self.pieces):
            size = _piece_size(i, piece)
            self.extents.append(Extent(offset, size, piece))
            offset += size
        self.size = offset

    @classmethod
    def of_file(cls, path: os.PathLike | str, name: str | None = None) -> ObjectSource:
        """A local file as one object (one file piece)."""
        p = Path(path)
        check_regular_file(p)
        return cls(name or p.name, [ExternalFile.of(p)])

    def read_at(self, offset: int, buf: memoryview) -> None:
        """Fill ``buf`` with the bytes at ``offset``, reading only those (no digests).

        Random access for a part that must be read again (a server-side copy
        that fell back to an upload): only the pieces under the range are
        opened, and only the range is read. The caller checks what it got
        against the checksum of its first, digested pass.

        Raises
        ------
        ValueError
            The range is not inside the object.
        SourceChangedError
            A file is gone or ends early.
        """
        buf = buf.cast("B") if buf.format != "B" else buf
        end = offset + len(buf)
        if offset < 0 or end > self.size:
            raise ValueError(f"{self.name}: bytes {offset}-{end} are outside its {self.size}")
        for e in self.extents:
            lo, hi = max(offset, e.offset), min(end, e.end)
            if lo >= hi:
                continue
            dst = buf[lo - offset:hi - offset]
            start = lo - e.offset
            if e.kind == "inline":
                dst[:] = memoryview(e.piece).cast("B")[start:start + (hi - lo)]  # type: ignore[arg-type]
                continue
            base = getattr(e.piece, "offset", 0) if isinstance(e.piece, ExternalFile) else 0
            path = e.piece.path  # type: ignore[attr-defined]
            fd = _open_source(path)
            try:
                got = 0
                while got < len(dst):
                    r = os.preadv(fd, [dst[got:]], base + start + got)
                    if r == 0:
                        raise SourceChangedError(path, f"it ended at {base + start + got} "
                                                       "bytes")
                    got += r
            finally:
                os.close(fd)

    def check(self) -> None:
        """Refuse before anything is sent: a blob not as sealed, a file not as planned.

        A file's identity is recorded here, and compared again when its last
        byte has been read: a file written to meanwhile is refused.
        """
        for e in self.extents:
            _check_piece(e.piece)
            if isinstance(e.piece, ExternalFile):
                self.identities[id(e.piece)] = _identity(e.piece.path)


def _identity(path: os.PathLike | str) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_piece(piece: object) -> None:
    if isinstance(piece, Blob):
        if piece.closed:
            raise SourceChangedError(piece.path, "the blob was released")
        piece.check_identity()
    elif isinstance(piece, ExternalFile):
        try:
            size = os.stat(piece.path).st_size
        except FileNotFoundError:
            raise SourceChangedError(piece.path, "the file is gone") from None
        planned = getattr(piece, "file_size", None) or piece.size + getattr(piece, "offset", 0)
        if size != planned:
            raise SourceChangedError(piece.path, f"size {planned} -> {size}")


class Reader:
    """Reads an object's bytes in order, digesting every piece as it passes.

    Reading is strictly sequential (the publish reads each part after the
    one before), so each piece's xxh3 digests come out of one pass; a file
    piece is checked (:func:`_check_piece`, and its sealed digests) when its
    last byte has passed.
    """

    def __init__(self, source: ObjectSource) -> None:
        self.source = source
        self.pos = 0
        self._index = 0
        self._fds: dict[int, int] = {}
        self._chunk_sha = source.want_sha256 and source.want_chunk_sha256
        self._digester = PieceDigester(CHUNK_SIZE, chunk_sha256=self._chunk_sha)
        #: (xxh3-128 hex, chunk digests) of every piece, in order, as read
        self.digests: list[tuple[str, tuple[int, ...]]] = []
        #: with want_chunk_sha256: the sha256 of each chunk of every piece, in order
        self.chunk_sha256: list[tuple[str, ...]] = []
        self._sha = hashlib.sha256() if source.want_sha256 else None
        self._skip_empty()
        self._sha_done()

    def _skip_empty(self) -> None:
        ext = self.source.extents
        while self._index < len(ext) and self.pos >= ext[self._index].end:
            self._finish_piece(ext[self._index])
            self._index += 1

    def _fd(self, e: Extent) -> int:
        key = id(e)
        fd = self._fds.get(key)
        if fd is None:
            path = e.piece.path  # type: ignore[attr-defined]
            fd = _open_source(path)
            self._fds[key] = fd
        return fd

    def read_into(self, buf: memoryview) -> None:
        """Fill ``buf`` with the next ``len(buf)`` bytes of the object."""
        buf = buf.cast("B") if buf.format != "B" else buf
        done = 0
        while done < len(buf):
            e = self.source.extents[self._index]
            start = self.pos - e.offset
            n = min(len(buf) - done, e.end - self.pos)
            dst = buf[done:done + n]
            if e.kind == "inline":
                dst[:] = memoryview(e.piece).cast("B")[start:start + n]  # type: ignore[arg-type]
            else:
                base = getattr(e.piece, "offset", 0) if isinstance(e.piece, ExternalFile) else 0
                fd = self._fd(e)
                got = 0
                while got < n:
                    r = os.preadv(fd, [dst[got:]], base + start + got)
                    if r == 0:
                        raise SourceChangedError(e.piece.path,  # type: ignore[attr-defined]
                                                 f"it ended at {base + start + got} bytes")
                    got += r
            self._digester.update(dst)
            if self._sha is not None:
                self._sha.update(dst)
            done += n
            self.pos += n
            self._skip_empty()
        self._sha_done()

    def _sha_done(self) -> None:
        if self._sha is not None and self.pos == self.source.size:
            self.source.sha256 = self._sha.hexdigest()
            one = len(self.source.extents) == 1 and len(self.digests) == 1
            self.source.sha256_xxh3 = self.digests[0][0] if one else None
            if self._chunk_sha:
                self.source.chunk_sha256 = tuple(self.chunk_sha256)
            self._sha = None

    def skip_to(self, window: memoryview, end: int) -> None:
        """Read (and digest) up to offset ``end`` through ``window``, keeping nothing."""
        while self.pos < end:
            n = min(len(window), end - self.pos)
            self.read_into(window[:n])

    def _finish_piece(self, e: Extent) -> None:
        digest, chunks = self._digester.finish()
        if self._chunk_sha:
            self.chunk_sha256.append(self._digester.chunk_sha256())
        self._digester = PieceDigester(CHUNK_SIZE, chunk_sha256=self._chunk_sha)
        piece = e.piece
        if isinstance(piece, Blob):
            piece.check_identity()
            if piece.has_digests and (piece.digest != digest or (
                    piece.chunk_size == CHUNK_SIZE and tuple(piece.chunk_digests) != chunks)):
                raise SourceChangedError(piece.path, "its bytes differ from the digests it was "
                                                     "sealed with")
        elif isinstance(piece, ExternalFile):
            _check_piece(piece)
            before = self.source.identities.get(id(piece))
            if before is not None and _identity(piece.path) != before:
                raise SourceChangedError(piece.path, "it was modified while it was published")
            sealed = getattr(piece, "chunk_digests", None)
            if sealed is not None and getattr(piece, "chunk_size", CHUNK_SIZE) == CHUNK_SIZE \
                    and tuple(sealed) != chunks:
                raise SourceChangedError(piece.path, "its bytes differ from the digests it was "
                                                     "planned with")
        self.digests.append((digest, chunks))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def piece_digests(e: Extent, whole: ObjectSource | None = None) -> tuple[str, tuple[int, ...]]:
    """Read one file piece whole to digest it (a prepass, for pieces with no digest yet).

    ``whole``: the object that is this one piece; where it wants its sha256
    (a signed manifest's), the pass leaves them in it, as its upload's would.
    """
    src = ObjectSource("prepass", [e.piece])
    if whole is not None:
        src.want_sha256, src.want_chunk_sha256 = whole.want_sha256, whole.want_chunk_sha256
    reader = Reader(src)
    try:
        window = memoryview(bytearray(8 * MiB))
        reader.skip_to(window, src.size)
    finally:
        reader.close()
    if whole is not None and src.sha256 is not None:
        whole.sha256, whole.chunk_sha256 = src.sha256, src.chunk_sha256
    return reader.digests[-1]
