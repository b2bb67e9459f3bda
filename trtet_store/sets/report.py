"""What a set's publish and fetch did, and what was shared."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SetPublishReport:
    """A :func:`~trtet_store.sets.publish_set`.

    Attributes
    ----------
    url, manifest_key, manifest_etag
        The set and the manifest that committed it.
    members : dict
        Member -> its files' names, in runtime order.
    bytes_files : int
        The members' files added up (what a publish per program would store).
    bytes_distinct : int
        The distinct blobs' bytes: what the set's prefix holds, manifests aside.
    bytes_uploaded : int
        Bytes sent over the network (parts uploaded).
    bytes_copied : int
        Bytes copied server-side (parts of an engine the bucket held already).
    bytes_present : int
        Blobs already in the bucket with the same digest and size: not sent.
    blobs_uploaded, blobs_present : list of str
        The blobs (xxh3-128 hex) published by this call, and found present.
    removed : list of str
        Blobs of the replaced manifest that no member names any more, removed
        after the new manifest committed.
    pruned : list of str
        Blobs no manifest names (a losing publisher's, a killed publish's),
        older than ``gc_grace``, removed after the commit.
    dry_run : bool
        Nothing was sent, committed or deleted: ``removed`` and ``pruned`` are what the
        publish would remove, ``kept`` each blob it would keep and why.
    """

    url: str
    manifest_key: str
    manifest_etag: str
    members: dict[str, list[str]]
    bytes_files: int = 0
    bytes_distinct: int = 0
    bytes_uploaded: int = 0
    bytes_copied: int = 0
    bytes_present: int = 0
    blobs_uploaded: list[str] = field(default_factory=list)
    blobs_present: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    dry_run: bool = False
    kept: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SetFetchReport:
    """A :func:`~trtet_store.sets.fetch_set`.

    Attributes
    ----------
    url, member
        The set, and the member fetched.
    picked : bool
        True when the member was picked for this machine (no ``member=``).
    paths : list of Path
        The member's files, the ``.pte`` first.
    store : Path
        The local content store the blobs are kept in.
    bytes_total : int
        The member's files added up.
    bytes_downloaded : int
        Bytes of blobs downloaded by this call (the fetches' own count).
    bytes_in_store : int
        Bytes of the member's blobs the store held already: not downloaded.
    placed : dict
        Bytes placed from the store, by how: ``clone`` (reflink: no new disk),
        ``move`` (without reflinks: the blob just brought into the store renamed
        into place, the store keeping a reference), ``copy``, ``link`` (hard
        link, opt-in).
    removed : list of str
        The previous member's files (by its record) this member does not
        name, removed after the new files were in place.
    left_alone : list of str
        One line for each file this fetch would have read back and acted on
        but did not make (a ``.trtet-set.json`` another user planted, a link,
        a FIFO): "set record DIR/.trtet-set.json is not ours: owned by uid
        65534, not by uid 0; left alone". Nothing was removed by it.
    seconds_download, seconds_place : float
        Wall time spent downloading the blobs the store lacked, and placing
        the member's files (the transaction), for benchmarks.
    """

    url: str
    member: str
    picked: bool
    paths: list[Path]
    store: Path
    bytes_total: int = 0
    bytes_downloaded: int = 0
    bytes_in_store: int = 0
    placed: dict[str, int] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)
    seconds_download: float = 0.0
    seconds_place: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = [str(p) for p in self.paths]
        d["store"] = str(self.store)
        return d
