"""What a publish or a fetch says it did, and what their ``progress`` callbacks receive.

Publish: :class:`PublishReport` and its per-object rows, :class:`PublishProgress`.
Fetch: :class:`FetchReport`, its per-object :class:`FetchedObject`, :class:`FetchProgress`.
Both halves (``upload/``, ``download/``) import them from here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from trtet_store.io import WriteReport


@dataclass
class ObjectReport:
    """One object of a publish."""

    name: str
    key: str
    size: int
    etag: str
    crc64nvme: str  # full-object CRC64NVME, base64, as HeadObject returned it
    part_size: int
    parts: int
    parts_sent: int = 0
    parts_copied: int = 0
    parts_resumed: int = 0  # already on the server from an interrupted run
    resumed_upload: bool = False
    unchanged: bool = False  # byte for byte the version already there: kept, nothing written


@dataclass
class PublishReport:
    """What :func:`trtet_store.publish` did.

    Attributes
    ----------
    url : str
        ``s3://bucket/key`` of the program.
    manifest_key, manifest_etag : str
        The manifest written last, the commit point.
    objects : list of ObjectReport
        The ``.pte`` first, then each ``.ptd``.
    bytes_total : int
        The objects' sizes together.
    bytes_sent : int
        Bytes uploaded in parts by this call (not counting retries of a failed send).
    bytes_copied : int
        Bytes copied server-side (UploadPartCopy) from an earlier version or another program.
    bytes_resumed : int
        Bytes an interrupted publish had already sent, found with ListParts.
    bytes_unchanged : int
        Bytes of objects identical to the version already there (same pieces,
        digests and ETag as the previous manifest says): kept, not rewritten.
    parts : int
        Parts of all objects.
    checksum : str
        The program object's full-object CRC64NVME (base64).
    seconds : float
        Wall time of the call.
    retries : int
        Parts sent again after a refused checksum or a network failure.
    """

    url: str
    manifest_key: str
    manifest_etag: str
    objects: list[ObjectReport] = field(default_factory=list)
    bytes_total: int = 0
    bytes_sent: int = 0
    bytes_copied: int = 0
    bytes_resumed: int = 0
    bytes_unchanged: int = 0
    parts: int = 0
    checksum: str = ""
    seconds: float = 0.0
    retries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


class PublishProgress(NamedTuple):
    """Passed to ``progress``: bytes handled so far of ``total``, and how."""

    done: int
    total: int
    sent: int
    copied: int
    resumed: int
    unchanged: int = 0


class FetchProgress(NamedTuple):
    """Passed to ``progress``: bytes of the program accounted for, of ``total``, and how.

    ``downloaded`` counts bytes received (a retried range twice), ``reused``
    bytes found in local files, ``resumed`` bytes an interrupted fetch had
    staged; ``done`` is their sum, at most ``total``.
    """

    done: int
    total: int
    downloaded: int
    reused: int
    resumed: int


@dataclass
class FetchedObject:
    """What a fetch did for one object."""

    name: str
    key: str
    path: str
    size: int
    etag: str
    checksum: str | None  # "crc64nvme:<base64>" when verified against one
    bytes_downloaded: int = 0
    bytes_reused: int = 0
    reused_from: list[str] = field(default_factory=list)
    placements: dict[str, int] = field(default_factory=dict)  # placement -> bytes
    #: xxh3-128 hex of the object's bytes, digested as they arrived (never read back),
    #: when every byte of it arrived in this fetch; else None (resumed, reused, up to date).
    digest: str | None = None
    #: With ``digest``: the span and xxh3-64 of each chunk the bytes were checked
    #: against (the manifest's, when one piece covers the object), else None.
    chunk_size: int | None = None
    chunk_digests: tuple[int, ...] | None = field(default=None, repr=False)
    #: sha256 hex of the bytes, from the same pass as ``digest``, when the fetch was
    #: asked for it (``fetch(sha256=True)``); else None.
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("chunk_digests")  # one per MiB: not for a report
        if d.get("sha256") is None:
            d.pop("sha256", None)  # asked for by the shared tier only
        return d


@dataclass
class FetchReport:
    """What :func:`trtet_store.fetch` did.

    Attributes
    ----------
    url : str
    version : str
        The manifest's ETag (or the plain object's): what was fetched.
    objects : list of FetchedObject
        The ``.pte`` first, then each ``.ptd``.
    bytes_downloaded : int
        Bytes received from the server, retried ranges included.
    bytes_reused : int
        Bytes taken from local files instead (see ``reused_by``).
    bytes_resumed : int
        Bytes an earlier, interrupted fetch had staged and this one kept.
    reused_by : dict
        Placement (``clone``, ``copy``) -> bytes of reused ranges placed so.
    verified : bool
        Every byte checked: per range against the manifest's chunk digests
        and per object against the full-object checksum. False only for a
        plain object without a full-object checksum (``unverified_reason``).
    up_to_date : bool
        The destination already held this version: nothing was written.
    restarts, retries : int
        Restarts against a new version; ranges or calls retried.
    seconds : float
    removed : list of str
        ``.ptd`` files of the version the destination held that the fetched
        manifest no longer names, removed once the new files were in place
        (those another ``.pte`` of the directory needs are kept).
    """

    url: str
    version: str
    objects: list[FetchedObject]
    bytes_downloaded: int = 0
    bytes_reused: int = 0
    bytes_resumed: int = 0
    reused_by: dict[str, int] = field(default_factory=dict)
    verified: bool = True
    unverified_reason: str | None = None
    up_to_date: bool = False
    restarts: int = 0
    retries: int = 0
    seconds: float = 0.0
    removed: list[str] = field(default_factory=list)
    writes: list[WriteReport] = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def paths(self) -> list[Path]:
        return [Path(o.path) for o in self.objects]

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("objects", "writes")}
        d["objects"] = [o.to_json() for o in self.objects]
        d["size"] = self.size
        return d
