"""``FileBackedData`` (executorch 1.5): our blobs as its files, adoption, ownership."""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import TYPE_CHECKING, Any

from trtet_store.export._executorch_private.core import _cord_module, _fail, _file_backed_class

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir._serialize._cord import FileBackedData

    from trtet_store.io.blobstore import Blob


_BLOB_ATTR = "_trtet_blob"


class _BlobRef:
    """A strong reference to a Blob that survives ``copy``/``deepcopy`` as itself.

    ExecuTorch deep-copies some structures (``serialize_pte_binary`` copies the
    Program). A deep copy of a Blob would be a second owner of the same file;
    this wrapper makes every copy share the one Blob instead.
    """

    __slots__ = ("blob",)

    def __init__(self, blob: Blob) -> None:
        self.blob = blob

    def __copy__(self) -> _BlobRef:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _BlobRef:
        return self




# --- FileBackedData -------------------------------------------------------------


def is_file_backed(obj: object) -> bool:
    """Whether ``obj`` is an ExecuTorch ``FileBackedData`` (never, on 1.4.1)."""
    cls = getattr(_cord_module(), "FileBackedData", None)
    return cls is not None and isinstance(obj, cls)


def file_backed_path(fbd: FileBackedData) -> str:
    """The file a ``FileBackedData`` reads from (``fbd._path``)."""
    path = getattr(fbd, "_path", None)
    if not isinstance(path, str):
        raise _fail("FileBackedData._path", f"expected str, found {type(path).__name__}")
    return path


def file_backed_owns_file(fbd: FileBackedData) -> bool:
    """Whether ``fbd`` was made to own its file (``cleanup=True`` or ``move_from``).

    True also for a deep copy of an owner, whose own finalizer is dead but whose
    original may still be armed to delete the file.
    """
    if not hasattr(fbd, "_finalizer"):
        raise _fail("FileBackedData._finalizer", "missing")
    return fbd._finalizer is not None


def attached_blob(fbd: FileBackedData) -> Blob | None:
    """The Blob attached by :func:`new_file_backed_data` or :func:`transfer_to_blob`."""
    ref = getattr(fbd, _BLOB_ATTR, None)
    return ref.blob if isinstance(ref, _BlobRef) else None


def _remove_func() -> Any:
    import inspect

    fbd_cls = _file_backed_class()
    func = inspect.getattr_static(fbd_cls, "_remove", None)
    if not isinstance(func, staticmethod):
        raise _fail("FileBackedData._remove", "expected a staticmethod")
    return func.__func__


def _finalizers_removing(path: str) -> list[weakref.finalize]:
    """Every live ``weakref.finalize`` that would run ``FileBackedData._remove(path)``."""
    registry = getattr(weakref.finalize, "_registry", None)
    if not isinstance(registry, dict):
        raise _fail("weakref.finalize._registry", "expected a dict (CPython stdlib)")
    remove = _remove_func()
    found = []
    for fin in list(registry):
        info = fin.peek()
        if info is not None and info[1] is remove and tuple(info[2]) == (path,):
            found.append(fin)
    return found


def disarm_finalizers(fbd: FileBackedData) -> int:
    """Detach every ExecuTorch finalizer that would delete ``fbd``'s current file.

    Returns the number detached. Detaching never deletes anything.
    """
    path = file_backed_path(fbd)
    n = 0
    own = getattr(fbd, "_finalizer", None)
    if own is not None and own.detach() is not None:
        n += 1
    for fin in _finalizers_removing(path):
        if fin.detach() is not None:
            n += 1
    return n


def new_file_backed_data(blob: Blob, *, sha256: bytes | None = None) -> FileBackedData:
    """A ``FileBackedData`` reading ``blob``'s file, without cleanup, keeping ``blob`` alive.

    ExecuTorch never deletes the file (no finalizer); the Blob, owned by its
    BlobStore, does when it is released. The object holds the Blob, so the
    file lives at least as long as ExecuTorch holds the payload.
    """
    fbd = _file_backed_class()(os.fspath(blob.path), cleanup=False, sha256=sha256)
    if len(fbd) != blob.size:
        raise ValueError(f"{blob!r}: file has {len(fbd)} bytes, the blob recorded {blob.size}")
    setattr(fbd, _BLOB_ATTR, _BlobRef(blob))
    return fbd


def transfer_to_blob(fbd: FileBackedData, blob: Blob) -> None:
    """Re-point ``fbd`` at ``blob``'s file, which now owns the bytes it had.

    Call right after the file was renamed into the store. ExecuTorch's
    finalizers for the old path are detached (they would be no-ops on a
    missing file, but could hit a new file that reuses the name), ``fbd`` stops
    owning anything (``_finalizer = None``), reads from the blob's path from
    now on, and keeps the blob alive.
    """
    disarm_finalizers(fbd)
    fbd._path = os.fspath(blob.path)
    fbd._finalizer = None
    setattr(fbd, _BLOB_ATTR, _BlobRef(blob))


def return_from_blob(fbd: FileBackedData, path: str) -> None:
    """Undo :func:`transfer_to_blob`: ``fbd`` reads ``path`` again and owns it.

    Call once the blob's file is back at ``path``. Ownership is a new
    ``weakref.finalize`` calling ``FileBackedData._remove(path)``, what
    ``cleanup=True`` and ``move_from`` arm.
    """
    fbd._path = path
    fbd._finalizer = weakref.finalize(fbd, _remove_func(), path)
    with contextlib.suppress(AttributeError):
        delattr(fbd, _BLOB_ATTR)


def set_known_sha256(fbd: FileBackedData, sha256: bytes) -> None:
    """Give ``fbd`` its SHA-256 (``fbd._sha256``) if it has none, so ExecuTorch won't hash it."""
    if not hasattr(fbd, "_sha256"):
        raise _fail("FileBackedData._sha256", "missing")
    if fbd._sha256 is None:
        fbd._sha256 = sha256
