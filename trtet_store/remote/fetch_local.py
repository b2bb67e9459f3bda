"""Delta: which pieces of the new version are already in local files, found by their digests.

Each manifest piece is looked for in every candidate file (the destination's
previous version, files given with ``reuse=``): at its own offset, and at its
offset shifted by the difference in file sizes (a piece after one whose size
changed). A candidate matches when every one of the piece's xxh3-64 chunk
digests matches; the first mismatching chunk ends the look, so a changed
engine costs one chunk read, an unchanged one a read of its bytes (no
download). Nothing here writes.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from awscrt.checksums import crc64nvme

from trtet_store.io import chunk_digest
from trtet_store.remote.fetch_plan import ObjectSpec, Reuse

log = logging.getLogger("trtet_store.remote.fetch")

#: Bytes per read while matching.
READ_STEP = 8 << 20


def candidate_files(paths: Sequence[os.PathLike | str]) -> list[tuple[str, int]]:
    """The existing regular files among ``paths``, each once, with their sizes."""
    seen: set[tuple[int, int]] = set()
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        out.append((os.fspath(Path(p).absolute()), st.st_size))
    return out


def find_reusable(spec: ObjectSpec, candidates: Sequence[tuple[str, int]]) -> list[Reuse]:
    """Every piece of ``spec`` whose bytes one of ``candidates`` holds, as :class:`Reuse`.

    Parameters
    ----------
    spec : ObjectSpec
        The object, with the manifest's pieces (a plain object has none: nothing is reused).
    candidates : sequence of (path, size)
        Local files that may hold an earlier version.
    """
    found = []
    fds: dict[str, int] = {}
    try:
        for piece in spec.pieces:
            if piece.size == 0:
                continue
            for path, size in candidates:
                hit = None
                for src_off in dict.fromkeys((piece.offset, piece.offset + size - spec.size)):
                    if src_off < 0 or src_off + piece.size > size:
                        continue
                    if path not in fds:
                        fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    crc = _match(fds[path], src_off, piece.size, spec.chunk_size, piece.chunks)
                    if crc is not None:
                        hit = Reuse(piece.offset, piece.size, path, src_off, size, crc,
                                    piece.chunks)
                        break
                if hit is not None:
                    found.append(hit)
                    break
    finally:
        for fd in fds.values():
            os.close(fd)
    log.info("%s: %d of %d pieces (%d of %d bytes) found locally", spec.name, len(found),
             sum(1 for p in spec.pieces if p.size), sum(r.size for r in found), spec.size)
    return found


def _match(fd: int, offset: int, size: int, chunk_size: int,
           chunks: Sequence[int]) -> int | None:
    """The CRC64NVME of ``[offset, offset + size)`` if its chunks match ``chunks``, else None."""
    crc = 0
    step = max(chunk_size, READ_STEP // chunk_size * chunk_size)
    k = 0
    pos = 0
    while pos < size:
        data = os.pread(fd, min(step, size - pos), offset + pos)
        if not data:
            return None
        view = memoryview(data)
        for c in range(0, len(view), chunk_size):
            if k >= len(chunks) or chunk_digest(view[c:c + chunk_size]) != chunks[k]:
                return None
            k += 1
        crc = crc64nvme(data, crc)
        pos += len(data)
    return crc if k == len(chunks) else None
