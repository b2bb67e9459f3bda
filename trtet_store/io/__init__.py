"""The storage engine: owned blobs, layouts, placements, the write transaction.

Standard library and xxhash only; nothing here knows about programs or engines.
"""

from trtet_store.io.blobstore import Blob, BlobStore
from trtet_store.io.digests import (
    Digester,
    Digests,
    InOrderDigest,
    bytes_digested,
    chunk_digest,
    digest_fd,
    digest_file,
    file_identity,
    is_sha256,
    read_digests,
)
from trtet_store.io.errors import (
    BlobChangedError,
    BlobInUseError,
    ConcurrentWriteError,
    IncompleteJournal,
    InsufficientSpaceError,
    JournalError,
    NeededByAnotherError,
    SourceChangedError,
    StorageError,
    StuckJournalError,
    UnsafeLockFileError,
    VerificationError,
)
from trtet_store.io.fs import (
    UNSUPPORTED_ERRNOS,
    block_size,
    clone_or_copy,
    clone_range,
    copy_all,
    free_bytes,
    fsync_dir,
    online_discard,
    pwrite_all,
    try_clone,
)
from trtet_store.io.layout import ExternalFile, Layout
from trtet_store.io.lock import release, try_lock, unlock_file
from trtet_store.io.names import (
    FETCH_LOCK_PREFIX,
    FETCH_LOCK_SUFFIX,
    PUBLISH_STAGING_DIR,
    STAGING_DIR,
)
from trtet_store.io.options import UNSET, Progress, WriteOptions, merge_options
from trtet_store.io.orphans import Orphan
from trtet_store.io.owned import NotOursError, open_ours, ours_problem, read_fd_capped, read_ours
from trtet_store.io.records import DamagedRecordsError, RecordFile, read_records
from trtet_store.io.recovery import recover
from trtet_store.io.safedir import (
    SafeDir,
    UnsafeDirectoryError,
    check_staging_directory,
    staging_directory,
    write_atomic,
)
from trtet_store.io.seal import Seal, same_identity
from trtet_store.io.sealdir import SealedDir
from trtet_store.io.units import GiB, MiB, format_mib
from trtet_store.io.versioned import (
    VersionedWrite,
    current_version,
    pinned_version,
    recover_versions,
    write_versioned,
)
from trtet_store.io.writer import (
    AutoChunk,
    PlacementRecord,
    WriteReport,
    write_file,
    write_files,
)

__all__ = [
    "open_ours",
    "ours_problem",
    "read_fd_capped",
    "read_ours",
    "AutoChunk",
    "Blob",
    "BlobChangedError",
    "BlobInUseError",
    "BlobStore",
    "ConcurrentWriteError",
    "DamagedRecordsError",
    "Digester",
    "Digests",
    "InOrderDigest",
    "ExternalFile",
    "block_size",
    "bytes_digested",
    "chunk_digest",
    "clone_or_copy",
    "clone_range",
    "copy_all",
    "digest_fd",
    "digest_file",
    "is_sha256",
    "read_digests",
    "file_identity",
    "current_version",
    "free_bytes",
    "fsync_dir",
    "online_discard",
    "pwrite_all",
    "try_clone",
    "UNSUPPORTED_ERRNOS",
    "IncompleteJournal",
    "InsufficientSpaceError",
    "JournalError",
    "NeededByAnotherError",
    "GiB",
    "Layout",
    "MiB",
    "format_mib",
    "Orphan",
    "pinned_version",
    "recover_versions",
    "PlacementRecord",
    "Progress",
    "RecordFile",
    "NotOursError",
    "SafeDir",
    "Seal",
    "SealedDir",
    "same_identity",
    "UnsafeDirectoryError",
    "UnsafeLockFileError",
    "check_staging_directory",
    "staging_directory",
    "write_atomic",
    "SourceChangedError",
    "FETCH_LOCK_PREFIX",
    "FETCH_LOCK_SUFFIX",
    "PUBLISH_STAGING_DIR",
    "STAGING_DIR",
    "StorageError",
    "StuckJournalError",
    "UNSET",
    "VerificationError",
    "VersionedWrite",
    "WriteOptions",
    "WriteReport",
    "read_records",
    "merge_options",
    "recover",
    "release",
    "try_lock",
    "unlock_file",
    "write_file",
    "write_files",
    "write_versioned",
]
