"""Multipart plans from sizes alone: equal-size parts within S3's limits. No I/O.

Every part but the last has the same size (Cloudflare R2 requires it; S3
and the rest accept it), at least 5 MiB, at most 5 GiB, and an object takes
at most 10,000 parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtet_store.io import MiB
from trtet_store.remote.errors import PartSizeError
from trtet_store.remote.manifest import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE

#: The part size when none is asked for, while the object fits 10,000 of them:
#: memory is parts in flight x this, and a re-publish re-sends up to one part
#: at each boundary between changed and unchanged bytes.
DEFAULT_PART_SIZE = 8 * MiB


@dataclass(frozen=True)
class Part:
    """One part of an object's multipart upload: 1-based ``number``, ``offset``, ``size``."""

    number: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def choose_part_size(total: int, requested: int | None = None) -> int:
    """The part size for an object of ``total`` bytes.

    Parameters
    ----------
    total : int
        The object's size.
    requested : int, optional
        Use exactly this size; refused if it breaks a limit. Default:
        :data:`DEFAULT_PART_SIZE`, grown in whole MiB until 10,000 parts hold
        the object.

    Raises
    ------
    PartSizeError
        ``requested`` below 5 MiB, above 5 GiB, or too small for 10,000
        parts; or an object too large for 10,000 parts of 5 GiB.
    """
    if total < 0:
        raise ValueError(f"negative object size {total}")
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int):
            raise TypeError(f"part_size must be an int, not {type(requested).__name__}")
        if not MIN_PART_SIZE <= requested <= MAX_PART_SIZE:
            raise PartSizeError(f"part size {requested} bytes is outside S3's limits "
                                f"({MIN_PART_SIZE} bytes to {MAX_PART_SIZE} bytes)")
        if -(-total // requested) > MAX_PARTS:
            need = -(-total // MAX_PARTS)
            raise PartSizeError(f"{total} bytes in parts of {requested} bytes would take "
                                f"{-(-total // requested)} parts; S3 allows {MAX_PARTS}: "
                                f"use a part size of at least {-(-need // MiB)} MiB")
        return requested
    size = max(DEFAULT_PART_SIZE, -(-total // MAX_PARTS))
    size = -(-size // MiB) * MiB
    if size > MAX_PART_SIZE:
        raise PartSizeError(f"{total} bytes do not fit {MAX_PARTS} parts of at most "
                            f"{MAX_PART_SIZE} bytes")
    return size


def plan_parts(total: int, part_size: int) -> list[Part]:
    """The parts of ``total`` bytes: all ``part_size`` but the last (one empty part for 0)."""
    if total == 0:
        return [Part(1, 0, 0)]
    return [Part(i + 1, off, min(part_size, total - off))
            for i, off in enumerate(range(0, total, part_size))]
