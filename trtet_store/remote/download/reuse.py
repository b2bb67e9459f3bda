"""Delta: which pieces of the new version are already in local files, found by their digests.

Each chunk of each manifest piece (the xxh3-64 digests the manifest records
per ``chunk_size`` bytes) is looked for in every candidate file (the
destination's previous version, files given with ``reuse=``): at its piece's
own offset, and shifted by the difference in file sizes (a piece after one
whose size changed). A chunk found is not downloaded; runs of them become
ranges of the old file in the new one. Costs a read of the candidates'
bytes, never a download. Nothing here writes. A signed manifest's chunk is
reused only where its sha256 is the signed one too (``spec.signed``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from trtet_store.io import MiB, chunk_digest
from trtet_store.remote.checksum import combine, crc64nvme
from trtet_store.remote.download.plan import ObjectSpec, Reuse

log = logging.getLogger("trtet_store.remote.download.receive")

#: Bytes per read while matching.
READ_STEP = 8 * MiB


class Candidate(NamedTuple):
    """A local file that may hold pieces: its path, size, and whether a link is followed."""

    path: str
    size: int
    follow: bool = True


def candidate_files(paths: Sequence[tuple[os.PathLike | str, bool]]) -> list[Candidate]:
    """The existing regular files among ``paths``, each once, with their sizes.

    ``paths`` are ``(path, follow)``: a name that came from a manifest (a
    ``.ptd`` beside the destination) is not followed (``lstat``, then opened
    with ``O_NOFOLLOW``): a link there is no earlier version of ours, and the
    write replaces it.
    """
    seen: set[tuple[int, int]] = set()
    out = []
    for p, follow in paths:
        try:
            st = os.stat(p) if follow else os.lstat(p)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        out.append(Candidate(os.fspath(Path(p).absolute()), st.st_size, follow))
    return out


def find_reusable(spec: ObjectSpec, candidates: Sequence[Candidate]) -> list[Reuse]:
    """Every chunk of ``spec`` that one of ``candidates`` holds, as runs of :class:`Reuse`.

    Matching is per manifest chunk (``chunk_size`` bytes on each piece's own
    grid), so an object published as one piece (a local file) is reused where
    its bytes are unchanged too. Consecutive chunks found in the same file at
    the same shift make one :class:`Reuse`.

    Parameters
    ----------
    spec : ObjectSpec
        The object, with the manifest's pieces (a plain object has none: nothing is reused).
    candidates : sequence of Candidate
        Local files that may hold an earlier version (:func:`candidate_files`).
    """
    found: list[Reuse] = []
    fds: dict[str, int] = {}
    try:
        for piece in spec.pieces:
            if piece.size:
                found += _reuse_in_piece(spec, piece, candidates, fds)
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)
    log.info("%s: %d of %d bytes found locally, in %d range(s)", spec.name,
             sum(r.size for r in found), spec.size, len(found))
    return found


def _open(path: str, follow: bool) -> int:
    """``path`` opened for reading, or -1 when it is no longer a regular file (or a link
    where ``follow`` is False): O_NONBLOCK, so a FIFO swapped in never blocks the open."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return -1
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd


def _reuse_in_piece(spec: ObjectSpec, piece, candidates: Sequence[Candidate],
                    fds: dict[str, int]) -> list[Reuse]:
    chunk = spec.chunk_size
    n = len(piece.chunks)
    owner: list[tuple[str, int, int, int] | None] = [None] * n  # (path, size, shift, crc)
    for path, size, follow in candidates:
        for src_start in dict.fromkeys((piece.offset, piece.offset + size - spec.size)):
            todo = [k for k in range(n) if owner[k] is None]
            if not todo:
                break
            if src_start < 0:
                continue
            if path not in fds:
                fds[path] = _open(path, follow)
            if fds[path] < 0:
                break  # not the regular file it was a moment ago: not a candidate
            for k in todo:
                off = k * chunk
                length = min(chunk, piece.size - off)
                if src_start + off + length > size:
                    break
                data = os.pread(fds[path], length, src_start + off)
                if len(data) == length and chunk_digest(data) == piece.chunks[k] and (
                        not spec.signed or (piece.sha256 is not None and hashlib.sha256(
                            data).hexdigest() == piece.sha256[k])):
                    owner[k] = (path, size, src_start, crc64nvme(data))
    out: list[Reuse] = []
    k = 0
    while k < n:
        if owner[k] is None:
            k += 1
            continue
        path, size, src_start, crc = owner[k]
        first, total = k, 0
        k += 1
        while k < n and owner[k] is not None and owner[k][:3] == (path, size, src_start):
            k += 1
        for j in range(first, k):
            length = min(chunk, piece.size - j * chunk)
            crc = owner[j][3] if j == first else combine(crc, owner[j][3], length)
            total += length
        out.append(Reuse(piece.offset + first * chunk, total, path, src_start + first * chunk,
                         size, crc, tuple(piece.chunks[first:k])))
    return out
