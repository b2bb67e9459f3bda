"""Publishing programs to S3-compatible object storage, and fetching them back.

A shared floor (errors, url, s3, manifest, checksum, report) under two halves
that never import each other: :mod:`.upload` (``publish``) and
:mod:`.download` (``fetch``). ``publish`` streams a program's pieces (or local files) into multipart
uploads: resumable from a journal, only changed bytes sent on a re-publish,
checked with per-part and full-object CRC64NVME, committed by a manifest
written last with a conditional write. boto3 is an optional extra
(``trtet-store[s3]``) and loads on first use, in :mod:`.s3` only; this
package uses only :mod:`trtet_store.io`'s public face. ``fetch`` reads a
program back through its manifest with ranged, checked, resumable GETs.

Submodules are named by role (``upload``, ``send``), functions by verb
(``publish``, ``fetch``): a name here is never both a module and a function.
"""

from __future__ import annotations

from typing import Any

from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ChecksumMismatchError,
    ConditionalWritesUnsupportedError,
    ConflictError,
    EndpointUnreachableError,
    FetchInterruptedError,
    FetchVerificationError,
    FileNameError,
    KeyExistsError,
    ManifestError,
    MissingDataError,
    NotARegularFileError,
    ObjectChangedError,
    ObjectNotFoundError,
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
    "publish": "trtet_store.remote.upload.program",
    "compile_and_publish": "trtet_store.remote.upload.program",
    "fetch": "trtet_store.remote.download.receive",
    "PublishReport": "trtet_store.remote.report",
    "PublishConfig": "trtet_store.remote.upload.config",
    "FetchReport": "trtet_store.remote.report",
    "abort": "trtet_store.remote.upload.unfinished",
    "list_uploads": "trtet_store.remote.upload.unfinished",
    "pending": "trtet_store.remote.upload.unfinished",
    "interrupted": "trtet_store.remote.upload.unfinished",
}


# The shared tier moved to trtet_store.cache.tier (the cache's second level);
# its names stay here for one release, each access warning where to import it.
_MOVED_TO_CACHE_TIER = frozenset({
    "KeyFileError", "Lease", "LeaseWaitTimeout", "PublicKey", "RemoteEntry", "RemoteTier",
    "SigningKey", "SigningUnavailableError", "TierDownload", "TierEntryError", "TierPublish",
    "TierSignatureError", "keygen",
})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MOVED_TO_CACHE_TIER:
        import warnings

        warnings.warn(f"trtet_store.remote.{name} moved to trtet_store.cache.tier.{name}; "
                      "import it from there (this alias goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("trtet_store.cache.tier"), name)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trtet_store.remote' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "ChecksumMismatchError",
    "ConditionalWritesUnsupportedError",
    "ConflictError",
    "EndpointUnreachableError",
    "FetchInterruptedError",
    "FetchReport",
    "FetchVerificationError",
    "FileNameError",
    "KeyExistsError",
    "Manifest",
    "ManifestError",
    "MissingDataError",
    "NotARegularFileError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "OwnedByOtherProgramError",
    "PartSizeError",
    "PublishConfig",
    "PublishReport",
    "RemoteError",
    "RemoteURLError",
    "UploadKeptError",
    "abort",
    "compile_and_publish",
    "fetch",
    "interrupted",
    "list_uploads",
    "manifest_key",
    "pending",
    "publish",
]
