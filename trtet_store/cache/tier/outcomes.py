"""What the tier's calls did: a download, a publish (losing a race is a result, not an error)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.cache.tier.entry import RemoteEntry
from trtet_store.io import Digests

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
    digests : dict of str to Digests
        Each file's digests as its bytes arrived (checked against the
        pointer, with the identity of the file just after), for the local
        cache to take without reading it again; a file resumed or already
        there was read once to check it, and has them too.
    """

    paths: dict[str, Path]
    downloaded: int
    seconds: float
    digests: dict[str, Digests] = field(default_factory=dict)


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
