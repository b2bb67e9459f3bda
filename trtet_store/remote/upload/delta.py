"""Which parts of a new object can be copied server-side from bytes already in the bucket.

A piece (a header, an engine) whose size and xxh3-128 equal a piece of an
object already published (the previous version under the same key, read
from its manifest, or another program, found through the engine-digest
index) occupies a known range there. Adjacent such pieces whose ranges
continue one another in the same object merge into one *segment*. A part
that lies wholly inside a segment is copied with UploadPartCopy
(``CopySourceRange``, ``CopySourceIfMatch`` = the object's ETag); every
other part is uploaded: the changed bytes and, at each boundary between
changed and unchanged bytes, the one part that straddles it. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trtet_store.remote.manifest import Manifest
from trtet_store.remote.upload.parts import Part


@dataclass(frozen=True)
class Where:
    """A range of bytes already in the bucket: object ``key`` (at ``etag``) from ``offset``."""

    key: str
    offset: int
    etag: str


@dataclass(frozen=True)
class CopyFrom:
    """A part's action when copied: ``[offset, offset + size)`` of ``key`` at ``etag``."""

    key: str
    offset: int
    etag: str


Candidates = dict[tuple[int, str], list[Where]]


def candidates_from_manifest(manifest: Manifest, into: Candidates | None = None) -> Candidates:
    """Every piece of every object of ``manifest``, by ``(size, xxh3)``."""
    out: Candidates = {} if into is None else into
    for obj in manifest.objects:
        for p in obj.pieces:
            if p.size:
                out.setdefault((p.size, p.xxh3), []).append(Where(obj.key, p.offset, obj.etag))
    return out


@dataclass
class _Segment:
    start: int  # in the new object
    size: int
    where: Where

    @property
    def end(self) -> int:
        return self.start + self.size


def segments(pieces: Iterable[tuple[int, int, str | None]],
             candidates: Candidates) -> list[_Segment]:
    """Merged ranges of the new object found in the bucket.

    ``pieces`` are ``(offset, size, xxh3 or None)`` in order; a piece with
    no known digest is never matched.
    """
    out: list[_Segment] = []
    for offset, size, digest in pieces:
        if not size or digest is None:
            continue
        options = candidates.get((size, digest))
        if not options:
            continue
        pick = options[0]
        if out and out[-1].end == offset:
            last = out[-1]
            # prefer the option that continues the previous segment in its object
            for o in options:
                if (o.key, o.etag) == (last.where.key, last.where.etag) and \
                        o.offset == last.where.offset + last.size:
                    last.size += size
                    pick = None
                    break
        if pick is not None:
            out.append(_Segment(offset, size, pick))
    return out


def copy_actions(parts: list[Part], segs: list[_Segment]) -> dict[int, CopyFrom]:
    """``{part number: CopyFrom}`` for every part lying wholly inside one segment."""
    actions: dict[int, CopyFrom] = {}
    i = 0
    for part in parts:
        if part.size == 0:
            continue
        while i < len(segs) and segs[i].end <= part.offset:
            i += 1
        if i < len(segs):
            s = segs[i]
            if s.start <= part.offset and part.end <= s.end:
                actions[part.number] = CopyFrom(s.where.key,
                                                s.where.offset + part.offset - s.start,
                                                s.where.etag)
    return actions
