"""trtet_store: disk-aware storage for TensorRT engines in ExecuTorch programs.

The public face. Importing it is cheap: the ExecuTorch and TensorRT adapters
load on first use.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trtet_store.io import (
    BlobStore,
    ConcurrentWriteError,
    ExternalFile,
    InsufficientSpaceError,
    NeededByAnotherError,
    Progress,
    StorageError,
    VerificationError,
    WriteOptions,
    write_file,
    write_files,
)

__version__ = "0.1.0"

# A library does not decide where its log goes: without this, Python's
# last-resort handler printed our warnings to stderr (a recovery's rollback
# detail twice, beside the CLI's own line).
logging.getLogger("trtet_store").addHandler(logging.NullHandler())

# name -> module that defines it; imported on first access (PEP 562).
_LAZY = {
    "save": "trtet_store.export.executorch",
    "write_tensor_data": "trtet_store.export.executorch",
    "save_program": "trtet_store.export.executorch",
    "compile_and_save": "trtet_store.export.compile",
    "EngineCache": "trtet_store.export.engine_cache",
    "CacheDirectoryError": "trtet_store.cache.directory",
    "export_program": "trtet_store.export.lowering",
    "recover": "trtet_store.io.recovery",
    "publish": "trtet_store.remote.upload.program",
    "fetch": "trtet_store.remote.download.receive",
    "publish_set": "trtet_store.sets.publish",
    "fetch_set": "trtet_store.sets.fetch",
    "SetMember": "trtet_store.sets.publish",
    "NoMemberFitsError": "trtet_store.sets.machine",
    "SharedCacheWarning": "trtet_store.cache.tier.health",
    "LoweringOptions": "trtet_store.export.options",
    "PublishConfig": "trtet_store.remote.upload.config",
    "FetchConfig": "trtet_store.remote.download.options",
    "RemoteError": "trtet_store.remote.errors",
}

# io's own names that were on this face; each access warns where to import it.
_MOVED_TO_IO = frozenset({
    "Blob", "BlobChangedError", "BlobInUseError", "IncompleteJournal", "JournalError",
    "Orphan", "SourceChangedError", "StuckJournalError", "UnsafeDirectoryError",
    "UnsafeLockFileError", "WriteReport",
})

if TYPE_CHECKING:  # pragma: no cover
    from trtet_store.cache.directory import CacheDirectoryError
    from trtet_store.cache.tier.health import SharedCacheWarning
    from trtet_store.export.compile import compile_and_save
    from trtet_store.export.engine_cache import EngineCache
    from trtet_store.export.executorch import save, save_program, write_tensor_data
    from trtet_store.export.lowering import export as export_program
    from trtet_store.export.options import LoweringOptions
    from trtet_store.io.recovery import recover
    from trtet_store.remote.download.options import FetchConfig
    from trtet_store.remote.download.receive import fetch
    from trtet_store.remote.errors import RemoteError
    from trtet_store.remote.upload.config import PublishConfig
    from trtet_store.remote.upload.program import publish
    from trtet_store.sets.fetch import fetch_set
    from trtet_store.sets.machine import NoMemberFitsError
    from trtet_store.sets.publish import Member as SetMember
    from trtet_store.sets.publish import publish_set


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MOVED_TO_IO:
        import warnings

        warnings.warn(f"trtet_store.{name} is io's: import it from trtet_store.io (this "
                      "alias goes in the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("trtet_store.io"), name)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trtet_store' has no attribute {name!r}")

    attr = {"export_program": "export", "SetMember": "Member"}.get(name, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [
    "BlobStore",
    "CacheDirectoryError",
    "ConcurrentWriteError",
    "EngineCache",
    "ExternalFile",
    "FetchConfig",
    "InsufficientSpaceError",
    "LoweringOptions",
    "NeededByAnotherError",
    "NoMemberFitsError",
    "Progress",
    "PublishConfig",
    "RemoteError",
    "SetMember",
    "SharedCacheWarning",
    "StorageError",
    "VerificationError",
    "WriteOptions",
    "compile_and_save",
    "export_program",
    "fetch",
    "fetch_set",
    "publish",
    "publish_set",
    "recover",
    "save",
    "save_program",
    "write_file",
    "write_files",
    "write_tensor_data",
]
