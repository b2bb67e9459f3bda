"""What the tier's calls did: a download, a publish (losing a race is a result, not an error)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.cache.tier.entry import RemoteEntry

__all__ = ["TierDownload", "TierPublish"]


@dataclass
class TierDownload:
    """What :meth:`RemoteTier.download` did.

    Attributes
    ----------
    paths : dict of str to Path
        Each file's name -> its local path (in the directory given).
    downloaded : int
        Bytes received from the server (0 when the directory already held the entry).
    seconds : float
        Wall time.
    """

    paths: dict[str, Path]
    downloaded: int
    seconds: float


@dataclass
class TierPublish:
    """What :meth:`RemoteTier.publish` did; losing a race is a result, not an error.

    Attributes
    ----------
    key : str
    published : bool
        Whether our pointer is the one committed.
    reason : str or None
        Why not (another publisher first, an entry already there).
    sent : int
        Bytes uploaded.
    entry : RemoteEntry or None
        The committed pointer: ours, or the winner's when we lost.
    """

    key: str
    published: bool
    reason: str | None
    sent: int
    entry: RemoteEntry | None = field(default=None)
