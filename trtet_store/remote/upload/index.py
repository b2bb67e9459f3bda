"""The engine-digest index: where a piece with a given digest was published before.

Besides each manifest, a publish records every large file piece (an engine)
under ``.trtet-store/pieces/<xxh3>-<size>.json``: the object, offset and
ETag that holds it. A later publish of the same engine into another program
of the bucket finds it there without reading its bytes (the digest is known
from the engine's seal) and copies the parts inside it server-side
(:mod:`.delta`). Best effort both ways: a missing or unreadable entry only
means the bytes are sent, and a failed write is logged.
"""

from __future__ import annotations

import json
import logging

from trtet_store.io import MiB
from trtet_store.remote import checksum
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.manifest import Manifest, crc64nvme_b64
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload import delta
from trtet_store.remote.upload.source import Extent

log = logging.getLogger(__name__)

#: Where the index lives in a bucket: one small object per engine digest and size.
INDEX_PREFIX = ".trtet-store/pieces/"
#: Pieces smaller than this are not indexed (a part is at least 5 MiB: a smaller
#: piece could never be copied server-side as a part of its own).
MIN_INDEXED = 5 * MiB


def index_key_for(size: int, digest: str) -> str:
    """The index object of a piece of ``size`` bytes whose xxh3 digest is ``digest``."""
    return f"{INDEX_PREFIX}{digest}-{size}.json"


def index_lookup(s3: S3, bucket: str, e: Extent) -> list[tuple[delta.Where, int, str]]:
    """Index entries for a piece whose digest is known without reading it."""
    digest = e.known_digest()
    if digest is None:
        return []
    got = s3.get(bucket, index_key_for(e.size, digest), limit=MiB)
    if got is None:
        return []
    try:
        d = json.loads(got[0])
        return [(delta.Where(str(d["key"]), int(d["offset"]), str(d["etag"])), e.size, digest)]
    except (ValueError, KeyError, TypeError):
        return []


def update_index(s3: S3, bucket: str, manifest: Manifest) -> None:
    """Record every large file piece of ``manifest`` (best effort: a failure is logged)."""
    for o in manifest.objects:
        for p in o.pieces:
            if p.kind != "file" or p.size < MIN_INDEXED:
                continue
            body = json.dumps({"key": o.key, "offset": p.offset, "etag": o.etag,
                               "size": p.size}).encode()
            try:
                s3.put(bucket, index_key_for(p.size, p.xxh3), body,
                       crc64nvme_b64(checksum.crc64nvme(body)))
            except (RemoteError, OSError) as exc:
                log.warning("the engine-digest index entry for %s could not be written: %s",
                            o.key, exc)
                return
