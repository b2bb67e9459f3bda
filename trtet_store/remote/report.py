"""What a publish says it did: :class:`PublishReport` and its per-object rows."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
