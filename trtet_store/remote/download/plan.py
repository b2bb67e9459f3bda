"""What a fetch must download, and in which ranges: decided from sizes and digests, no I/O.

A fetch brings each object of a published program (or one plain object) to a
local file. Some pieces of it may already be on this machine (the previous
version at the destination, or files given with ``reuse=``); those are
*reused*, the rest is downloaded. The downloaded bytes of an object form
*runs* (maximal contiguous intervals), each staged as one blob; a run is
fetched in *ranges* of about ``range_size`` bytes, each one ranged GET.

Range boundaries fall on the manifest's chunk boundaries (each piece's
``chunk_size`` grid, starting at the piece), so every range can be checked
on its own against the chunk digests the manifest records for it, and a bad
range is fetched again without touching the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtet_store.io import MiB
from trtet_store.remote.manifest import ObjectEntry, PieceEntry


@dataclass(frozen=True)
class ObjectSpec:
    """One object to fetch, however it was described (a manifest entry or a HeadObject).

    Attributes
    ----------
    name : str
        The local file name (beside the destination); never a path.
    key : str
        Its key in the bucket.
    size, etag : int, str
        As the manifest (or HeadObject) says; every GET carries ``If-Match: etag``.
    checksum : tuple of (str, str) or None
        ``(algorithm, base64 value)`` of a full-object checksum, e.g.
        ``("crc64nvme", "...")``; None when the object has none we can check.
    pieces : tuple of PieceEntry
        From the manifest; empty for a plain object (then nothing is reused
        and ranges are checked only by the full-object checksum).
    chunk_size : int
        The span of each piece's chunk digests.
    signed : bool
        From a manifest a trusted key vouched for: every chunk downloaded,
        resumed or reused is checked by its signed sha256 too.
    """

    name: str
    key: str
    size: int
    etag: str
    checksum: tuple[str, str] | None
    pieces: tuple[PieceEntry, ...] = ()
    chunk_size: int = MiB
    signed: bool = False

    @classmethod
    def from_entry(cls, entry: ObjectEntry, chunk_size: int, *,
                   signed: bool = False) -> ObjectSpec:
        return cls(entry.name, entry.key, entry.size, entry.etag,
                   ("crc64nvme", entry.crc64nvme), entry.pieces, chunk_size, signed)


@dataclass(frozen=True)
class Reuse:
    """Bytes ``[offset, offset + size)`` of the new object, found in a local file.

    ``source_offset`` is where they start in ``path``; ``crc`` is their
    CRC64NVME (for the full-object check) and ``chunk_digests`` their xxh3-64
    per chunk (so the write checks what it copies).
    """

    offset: int
    size: int
    path: str
    source_offset: int
    file_size: int
    crc: int
    chunk_digests: tuple[int, ...]


@dataclass(frozen=True)
class Range:
    """One ranged GET: bytes ``[offset, offset + size)`` of object ``obj``, in run ``run``."""

    obj: int
    run: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass
class Run:
    """A contiguous interval of an object that is downloaded, staged as one blob."""

    obj: int
    offset: int
    size: int
    ranges: list[Range] = field(default_factory=list)


@dataclass
class ObjectPlan:
    """One object: its spec, what is reused, and the runs it downloads, in offset order."""

    spec: ObjectSpec
    reused: list[Reuse]
    runs: list[Run]

    @property
    def downloaded_bytes(self) -> int:
        return sum(r.size for r in self.runs)

    @property
    def reused_bytes(self) -> int:
        return sum(r.size for r in self.reused)

    def segments(self) -> list[Reuse | Run]:
        """Reused intervals and runs, in offset order, tiling ``[0, size)``."""
        return sorted([*self.reused, *self.runs], key=lambda s: s.offset)


def chunk_cuts(spec: ObjectSpec, start: int, end: int) -> list[int]:
    """Offsets in ``(start, end)`` where a range may end: the chunk boundaries of the pieces.

    Without pieces (a plain object) every offset may be a cut.
    """
    cuts = []
    for p in spec.pieces:
        if p.offset + p.size <= start or p.offset >= end:
            continue
        pos = p.offset
        while pos < p.offset + p.size:
            if start < pos < end:
                cuts.append(pos)
            pos += spec.chunk_size
        if start < p.offset + p.size < end:
            cuts.append(p.offset + p.size)
    return sorted(set(cuts))


def split_run(spec: ObjectSpec, obj: int, run_index: int, run: Run, range_size: int) -> None:
    """Cut ``run`` into ranges of at most ``range_size`` bytes, ending on chunk boundaries.

    A range is never shorter than a chunk can force: where no boundary falls
    within ``range_size`` (a chunk larger than the range size), the range runs
    to the next boundary.
    """
    end = run.offset + run.size
    pos = run.offset
    if not spec.pieces:
        while pos < end:
            n = min(range_size, end - pos)
            run.ranges.append(Range(obj, run_index, pos, n))
            pos += n
        return
    cuts = chunk_cuts(spec, run.offset, end) + [end]
    i = 0
    while pos < end:
        # the furthest cut within range_size, else the first cut after pos
        best = None
        while i < len(cuts) and cuts[i] <= pos:
            i += 1
        j = i
        while j < len(cuts) and cuts[j] - pos <= range_size:
            best = cuts[j]
            j += 1
        if best is None:
            best = cuts[i]
        run.ranges.append(Range(obj, run_index, pos, best - pos))
        pos = best


def plan_object(obj: int, spec: ObjectSpec, reused: Sequence[Reuse], range_size: int) -> ObjectPlan:
    """The runs and ranges of ``spec`` once ``reused`` (non-overlapping, whole pieces) is taken."""
    reused = sorted(reused, key=lambda r: r.offset)
    runs: list[Run] = []
    pos = 0
    for r in [*reused, None]:
        stop = spec.size if r is None else r.offset
        if stop > pos:
            runs.append(Run(obj, pos, stop - pos))
        if r is not None:
            pos = r.offset + r.size
    for k, run in enumerate(runs):
        split_run(spec, obj, k, run, range_size)
    return ObjectPlan(spec, list(reused), runs)


def pieces_within(spec: ObjectSpec, start: int, end: int) -> list[PieceEntry]:
    """The pieces overlapping ``[start, end)``, in order."""
    return [p for p in spec.pieces if p.offset < end and p.offset + p.size > start]


def expected_sha256(spec: ObjectSpec, start: int, end: int) -> list[tuple[int, int, str]]:
    """``(offset, size, sha256 hex)`` of every manifest chunk inside ``[start, end)`` (a
    signed manifest's; as :func:`expected_chunks`, whose grid it shares)."""
    return _chunks_within(spec, start, end, lambda p: p.sha256 or ())


def expected_chunks(spec: ObjectSpec, start: int, end: int) -> list[tuple[int, int, int]]:
    """``(offset, size, xxh3-64)`` of every manifest chunk inside ``[start, end)``.

    ``[start, end)`` must fall on chunk boundaries (as ranges do): every
    chunk it touches is then wholly inside it.
    """
    return _chunks_within(spec, start, end, lambda p: p.chunks)


def _chunks_within(spec: ObjectSpec, start: int, end: int,
                   digests: Callable[[Any], Sequence[Any]]) -> list[tuple[int, int, Any]]:
    """``(offset, size, digest)`` of the chunks inside ``[start, end)``, each piece's
    digests taken by ``digests`` (its xxh3-64 list, or a signed manifest's sha256 list)."""
    out = []
    for p in pieces_within(spec, start, end):
        for k, digest in enumerate(digests(p)):
            off = p.offset + k * spec.chunk_size
            size = min(spec.chunk_size, p.offset + p.size - off)
            if off >= end or off + size <= start:
                continue
            if off < start or off + size > end:
                raise ValueError(f"{spec.name}: range [{start}, {end}) cuts the chunk at {off}")
            out.append((off, size, digest))
    return out
