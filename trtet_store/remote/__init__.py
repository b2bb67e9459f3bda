"""Publishing programs to S3-compatible object storage (and reading them back).

``publish`` streams a program's pieces (or local files) into multipart
uploads: resumable from a journal, only changed bytes sent on a re-publish,
checked with per-part and full-object CRC64NVME, committed by a manifest
written last with a conditional write. boto3 is an optional extra
(``trtet-store[s3]``) and loads on first use, in :mod:`.s3` only; this
package uses only :mod:`trtet_store.io`'s public face.
"""

from __future__ import annotations

from typing import Any

from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ChecksumMismatchError,
    ConflictError,
    EndpointUnreachableError,
    KeyExistsError,
    ManifestError,
    OwnedByOtherProgramError,
    PartSizeError,
    RemoteError,
    RemoteURLError,
    UploadKeptError,
)
from trtet_store.remote.manifest import Manifest, manifest_key

# name -> module; imported on first access (PEP 562), so importing this
# package loads neither boto3 nor ExecuTorch.
_LAZY = {
    "publish": "trtet_store.remote.program",
    "PublishReport": "trtet_store.remote.report",
    "abort": "trtet_store.remote.publish",
    "list_uploads": "trtet_store.remote.publish",
    "pending": "trtet_store.remote.publish",
    "interrupted": "trtet_store.remote.publish",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trtet_store.remote' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "ChecksumMismatchError",
    "ConflictError",
    "EndpointUnreachableError",
    "KeyExistsError",
    "Manifest",
    "ManifestError",
    "OwnedByOtherProgramError",
    "PartSizeError",
    "PublishReport",
    "RemoteError",
    "RemoteURLError",
    "UploadKeptError",
    "abort",
    "interrupted",
    "list_uploads",
    "manifest_key",
    "pending",
    "publish",
]
