"""What a write reports: per output file, and per payload how it was placed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PlacementRecord:
    """How one payload got into its output."""

    index: int
    source: str
    offset: int
    size: int
    placement: str
    reason: str
    bytes_written: int = 0
    seconds: float = 0.0
    verified: bool = False

    def to_json(self) -> dict[str, object]:
        """The record as a JSON-ready dict (what ``trtet-store`` prints)."""
        return {
            "offset": self.offset,
            "size": self.size,
            "placement": self.placement,
            "reason": self.reason,
            "bytes_written": self.bytes_written,
        }


@dataclass
class WriteReport:
    """What a write did, per output file.

    Attributes
    ----------
    path : pathlib.Path
        The published file.
    size : int
        Its length.
    inline_bytes : int
        Bytes written from memory (headers, metadata, padding).
    placements : list of PlacementRecord
        One per payload: the placement used, why, bytes written, seconds.
    seconds : float
        Wall time of the whole transaction.
    """

    path: Path
    size: int
    inline_bytes: int = 0
    placements: list[PlacementRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_written(self) -> int:
        """Bytes this write put on disk itself (inline plus copied or moved)."""
        return self.inline_bytes + sum(p.bytes_written for p in self.placements)

    def to_json(self) -> dict[str, object]:
        """The report as a JSON-ready dict: path, size, seconds and each placement."""
        return {
            "path": os.fspath(self.path),
            "size": self.size,
            "seconds": self.seconds,
            "placements": [p.to_json() for p in self.placements],
        }
