"""The storage engine: owned blobs, layouts, placements, the write transaction.

Standard library and xxhash only; nothing here knows about programs or engines.
"""

from trtet_store.io.blobstore import Blob, BlobChangedError, BlobStore, Orphan
from trtet_store.io.fs import InsufficientSpaceError
from trtet_store.io.journal import JournalError
from trtet_store.io.layout import ExternalFile, Layout
from trtet_store.io.lock import ConcurrentWriteError
from trtet_store.io.transfer import VerificationError
from trtet_store.io.writer import (
    PlacementRecord,
    WriteReport,
    write_file,
    write_files,
)

__all__ = [
    "Blob",
    "BlobChangedError",
    "BlobStore",
    "ConcurrentWriteError",
    "ExternalFile",
    "InsufficientSpaceError",
    "JournalError",
    "Layout",
    "Orphan",
    "PlacementRecord",
    "VerificationError",
    "WriteReport",
    "write_file",
    "write_files",
]
