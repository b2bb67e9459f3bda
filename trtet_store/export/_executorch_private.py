"""The one place that touches ExecuTorch internals (written against executorch 1.5.1).

Everything trtet_store needs from ExecuTorch that is not public API goes through
this module, so that a future ExecuTorch that renames something breaks here,
loudly, and :func:`check_private_api` says which attribute moved.

Private attributes used (executorch 1.5.1)
------------------------------------------
``ExecutorchProgramManager._pte_data`` : ``Cord``
    The serialized ``.pte``, built eagerly in ``__init__`` by
    ``serialize_for_executorch``; ``save``/``write_to_file`` write exactly it.
``ExecutorchProgramManager._tensor_data`` : ``dict[str, Cord]``
    One serialized ``.ptd`` per external tag; ``write_tensor_data_to_file``
    writes each to ``outdir/<tag>[.ptd]``.
``Cord._buffers`` : ``list[bytes | FileBackedData]``
    The pieces of a Cord in file order (``Cord.append`` flattens nested Cords).
    ``Cord._byte_size`` is their total length (``len(cord)``).
``FileBackedData._path`` : ``str``
    The file holding the payload.
``FileBackedData._size``
    Read through the public ``len(fbd)``: ``os.path.getsize`` taken once, at
    construction. The layout is planned with it.
``FileBackedData._finalizer`` : ``weakref.finalize | None``
    Not None when the object owns its file (``cleanup=True`` or ``move_from``):
    calling it removes ``_path`` (``FileBackedData._remove`` ignores
    ``OSError``, so a file already renamed away or deleted is a silent no-op).
``FileBackedData._remove`` : staticmethod
    The finalizer's callback; used to recognise ExecuTorch's finalizers.
``weakref.finalize._registry`` (CPython stdlib)
    Enumerated to find *every* live finalizer that would remove a path, including
    the one of an original ``FileBackedData`` when we only hold a deep copy (a
    deep-copied ``weakref.finalize`` is a dead no-op; the original stays armed).

One attribute of ours is set on ``FileBackedData`` objects: ``_trtet_blob``, a
:class:`_BlobRef` holding the :class:`~trtet_store.io.blobstore.Blob` that owns
the file. It keeps the blob alive as long as ExecuTorch holds the payload and
lets the adapter recognise its own files without a store lookup.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir._serialize._cord import Cord, FileBackedData
    from executorch.exir.program import ExecutorchProgramManager

    from trtet_store.io.blobstore import Blob

TESTED_EXECUTORCH = "1.5.1"
_BLOB_ATTR = "_trtet_blob"


class ExecutorchPrivateAPIError(RuntimeError):
    """An ExecuTorch internal that trtet_store relies on is missing or changed."""


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


def _fail(what: str, detail: str) -> ExecutorchPrivateAPIError:
    return ExecutorchPrivateAPIError(
        f"ExecuTorch internal {what} is not as trtet_store expects ({detail}); "
        f"trtet_store was written against executorch {TESTED_EXECUTORCH} "
        f"(installed: {executorch_version()}). Update trtet_store/export/_executorch_private.py."
    )


def executorch_version() -> str:
    """The installed executorch distribution version, or ``"unknown"``."""
    try:
        from importlib.metadata import version

        return version("executorch")
    except Exception:  # pragma: no cover - metadata missing
        return "unknown"


def _cord_module() -> Any:
    try:
        from executorch.exir._serialize import _cord
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise _fail("module executorch.exir._serialize._cord", str(exc)) from exc
    for name in ("Cord", "FileBackedData"):
        if not hasattr(_cord, name):
            raise _fail(f"executorch.exir._serialize._cord.{name}", "missing")
    return _cord


# --- programs -----------------------------------------------------------------


def pte_cord(program: ExecutorchProgramManager) -> Cord:
    """The serialized ``.pte`` of ``program``: ``program._pte_data``."""
    cord = getattr(program, "_pte_data", None)
    if cord is None or not isinstance(cord, _cord_module().Cord):
        raise _fail(
            "ExecutorchProgramManager._pte_data",
            f"expected a Cord, found {type(cord).__name__}",
        )
    return cord


def ptd_cords(program: ExecutorchProgramManager) -> dict[str, Cord]:
    """The serialized ``.ptd`` files of ``program`` by tag: ``program._tensor_data``."""
    if not hasattr(program, "_tensor_data"):
        raise _fail("ExecutorchProgramManager._tensor_data", "missing")
    data = program._tensor_data
    if data is None:
        return {}
    cord_cls = _cord_module().Cord
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, cord_cls) for k, v in data.items()
    ):
        raise _fail("ExecutorchProgramManager._tensor_data", "expected dict[str, Cord]")
    return dict(data)


def cord_pieces(cord: Cord) -> list[bytes | FileBackedData]:
    """The pieces of ``cord`` in file order: ``cord._buffers`` (a copy of the list)."""
    mod = _cord_module()
    buffers = getattr(cord, "_buffers", None)
    if not isinstance(buffers, list):
        raise _fail("Cord._buffers", f"expected a list, found {type(buffers).__name__}")
    total = 0
    for item in buffers:
        if not isinstance(item, (bytes, mod.FileBackedData)):
            raise _fail("Cord._buffers", f"unexpected piece type {type(item).__name__}")
        total += len(item)
    if total != len(cord):
        raise _fail("Cord._buffers", f"pieces sum to {total} bytes, len(cord) is {len(cord)}")
    return list(buffers)


# --- FileBackedData -------------------------------------------------------------


def is_file_backed(obj: object) -> bool:
    """Whether ``obj`` is an ExecuTorch ``FileBackedData``."""
    return isinstance(obj, _cord_module().FileBackedData)


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

    fbd_cls = _cord_module().FileBackedData
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
    fbd = _cord_module().FileBackedData(os.fspath(blob.path), cleanup=False, sha256=sha256)
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


def set_known_sha256(fbd: FileBackedData, sha256: bytes) -> None:
    """Give ``fbd`` its SHA-256 (``fbd._sha256``) if it has none, so ExecuTorch won't hash it."""
    if not hasattr(fbd, "_sha256"):
        raise _fail("FileBackedData._sha256", "missing")
    if fbd._sha256 is None:
        fbd._sha256 = sha256


# --- the check ------------------------------------------------------------------


def check_private_api(program: ExecutorchProgramManager | None = None) -> None:
    """Check every ExecuTorch internal this module uses; raise naming the first that changed.

    Parameters
    ----------
    program : ExecutorchProgramManager, optional
        Also check the instance attributes ``_pte_data`` and ``_tensor_data``
        (and the Cords' ``_buffers``) on a real program.

    Raises
    ------
    ExecutorchPrivateAPIError
        Naming the attribute and the installed executorch version.
    """
    import inspect

    mod = _cord_module()
    fbd_cls, cord_cls = mod.FileBackedData, mod.Cord
    params = inspect.signature(fbd_cls.__init__).parameters
    for name in ("path", "cleanup", "sha256"):
        if name not in params:
            raise _fail(f"FileBackedData.__init__({name}=...)", "parameter missing")
    if not callable(getattr(fbd_cls, "move_from", None)):
        raise _fail("FileBackedData.move_from", "missing")
    _remove_func()

    try:
        from executorch.exir._serialize._named_data_store import NamedDataStore
    except ImportError as exc:
        raise _fail("executorch.exir._serialize._named_data_store", str(exc)) from exc
    add_params = inspect.signature(NamedDataStore.add_named_data).parameters
    for name in ("key", "data", "alignment", "external_tag"):
        if name not in add_params:
            raise _fail(f"NamedDataStore.add_named_data({name}=...)", "parameter missing")

    fd, tmp = tempfile.mkstemp(prefix=".trtet-check-", suffix=".data")
    try:
        os.write(fd, b"0123456789")
        os.close(fd)
        plain = fbd_cls(tmp)
        if getattr(plain, "_path", None) != tmp:
            raise _fail("FileBackedData._path", "does not hold the constructor's path")
        if len(plain) != 10 or getattr(plain, "_size", None) != 10:
            raise _fail("FileBackedData._size", "does not hold the file size")
        if not hasattr(plain, "_finalizer") or plain._finalizer is not None:
            raise _fail("FileBackedData._finalizer", "expected None without cleanup")
        if not hasattr(plain, "_sha256"):
            raise _fail("FileBackedData._sha256", "missing")
        owner = fbd_cls(tmp, cleanup=True)
        fin = getattr(owner, "_finalizer", None)
        if not isinstance(fin, weakref.finalize) or not fin.alive:
            raise _fail("FileBackedData._finalizer", "no live weakref.finalize with cleanup=True")
        if fin not in _finalizers_removing(tmp):
            raise _fail(
                "FileBackedData._finalizer",
                "its weakref.finalize does not call FileBackedData._remove(path)",
            )
        fin.detach()  # keep the file: the check must not depend on deletion order
        cord = cord_cls(b"ab")
        cord.append(plain)
        if cord_pieces(cord)[1] is not plain:
            raise _fail("Cord._buffers", "does not hold the appended objects in order")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)

    try:
        from executorch.exir.program import ExecutorchProgramManager
    except ImportError as exc:
        raise _fail("executorch.exir.program.ExecutorchProgramManager", str(exc)) from exc
    for name in ("save", "write_to_file", "write_tensor_data_to_file"):
        if not callable(getattr(ExecutorchProgramManager, name, None)):
            raise _fail(f"ExecutorchProgramManager.{name}", "missing")
    if program is not None:
        cords = [pte_cord(program), *ptd_cords(program).values()]
        for cord in cords:
            cord_pieces(cord)
