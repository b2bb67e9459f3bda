"""The one place that touches ExecuTorch internals (written against executorch 1.4.1 and 1.5.1).

Everything trtet_store needs from ExecuTorch that is not public API goes through
this module, so that a future ExecuTorch that renames something breaks here,
loudly, and :func:`check_private_api` says which attribute moved.

Private attributes used (executorch 1.4.1 and 1.5.1 unless said)
-----------------------------------------------------------------
``ExecutorchProgramManager._pte_data`` : ``Cord``
    The serialized ``.pte``, built eagerly in ``__init__`` by
    ``serialize_for_executorch``; ``save``/``write_to_file`` write exactly it.
``ExecutorchProgramManager._tensor_data`` : ``dict[str, Cord]``
    One serialized ``.ptd`` per external tag; ``write_tensor_data_to_file``
    writes each to ``outdir/<tag>[.ptd]``.
``Cord._buffers`` : ``list[bytes | FileBackedData]``
    The pieces of a Cord in file order (``Cord.append`` flattens nested Cords).
    ``Cord._byte_size`` is their total length (``len(cord)``).
``executorch.exir._serialize._program._extract_delegate_segments(program, segments)``
    Moves each delegate's ``processed_bytes`` into an ``AlignedData`` segment
    (``.data`` a Cord), identical blobs once. Wrapped by
    :func:`expand_delegate_segments` so that a TensorRT delegate's segment is
    its blob header followed by the staged engine file (an :class:`EngineView`).
``FileBackedData`` (1.5.1 only; 1.4.1 has no file-backed Cord pieces)
    ``_path`` (the file), ``_size`` (read through ``len``), ``_sha256``,
    ``_finalizer`` (a ``weakref.finalize`` when it owns its file: ``cleanup=True``
    or ``move_from``) and the staticmethod ``_remove`` it calls.
``executorch.exir._serialize._named_data_store.NamedDataStore``
    The store a backend's ``preprocess`` returns as ``data_store_output``
    (:func:`named_data_store`).
``executorch.exir._serialize._flatbuffer_program._flatbuffer_to_program(bytes)``
    A ``.pte``'s Program flatbuffer as ExecuTorch's dataclasses (:func:`program_from_flatbuffer`).
``executorch.extension.flat_tensor.serialize.serialize._deserialize_to_flat_tensor(bytes)``
    A ``.ptd``'s FlatTensor flatbuffer, the same way (:func:`flat_tensor_from_flatbuffer`).
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
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir._serialize._cord import Cord, FileBackedData
    from executorch.exir.program import ExecutorchProgramManager

    from trtet_store.io.blobstore import Blob

TESTED_EXECUTORCH = ("1.4.1", "1.5.1")
_BLOB_ATTR = "_trtet_blob"


class ExecutorchPrivateAPIError(RuntimeError):
    """An ExecuTorch internal that trtet_store relies on is missing or changed."""


class FileBackedDataUnavailableError(RuntimeError):
    """A file-backed payload was asked for from an ExecuTorch without ``FileBackedData``."""


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
        f"trtet_store was written against executorch {' and '.join(TESTED_EXECUTORCH)} "
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
    if not hasattr(_cord, "Cord"):
        raise _fail("executorch.exir._serialize._cord.Cord", "missing")
    return _cord


def has_file_backed_data() -> bool:
    """Whether this ExecuTorch has file-backed Cord pieces (``FileBackedData``, 1.5+)."""
    return hasattr(_cord_module(), "FileBackedData")


def _file_backed_class() -> Any:
    """``FileBackedData``, or raise naming the version that lacks it."""
    cls = getattr(_cord_module(), "FileBackedData", None)
    if cls is None:
        raise FileBackedDataUnavailableError(
            f"executorch {executorch_version()} has no FileBackedData (it came in 1.5): "
            "payloads it holds are in memory, and a file can only reach a program as a "
            "TensorRT engine inline in its delegate; install executorch>=1.5.1 for "
            "file-backed named data (external_engine_data)"
        )
    return cls


def _program_module() -> Any:
    try:
        from executorch.exir._serialize import _program
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise _fail("module executorch.exir._serialize._program", str(exc)) from exc
    if not callable(getattr(_program, "_extract_delegate_segments", None)):
        raise _fail("executorch.exir._serialize._program._extract_delegate_segments", "missing")
    return _program


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


def cord_pieces(cord: Cord) -> list[bytes | FileBackedData | EngineView]:
    """The pieces of ``cord`` in file order: ``cord._buffers`` (a copy of the list)."""
    mod = _cord_module()
    buffers = getattr(cord, "_buffers", None)
    if not isinstance(buffers, list):
        raise _fail("Cord._buffers", f"expected a list, found {type(buffers).__name__}")
    kinds = (bytes, EngineView) + ((mod.FileBackedData,) if has_file_backed_data() else ())
    total = 0
    for item in buffers:
        if not isinstance(item, kinds):
            raise _fail("Cord._buffers", f"unexpected piece type {type(item).__name__}")
        total += len(item)
    if total != len(cord):
        raise _fail("Cord._buffers", f"pieces sum to {total} bytes, len(cord) is {len(cord)}")
    return list(buffers)


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


# --- serializer and deserializer entry points -------------------------------------


def named_data_store() -> Any:
    """A new ``NamedDataStore``, for a ``preprocess`` that hands data over as named data."""
    try:
        from executorch.exir._serialize._named_data_store import NamedDataStore
    except ImportError as exc:
        raise _fail("executorch.exir._serialize._named_data_store", str(exc)) from exc
    store = NamedDataStore()
    for name in ("add_named_data", "get_named_data_store_output"):
        if not callable(getattr(store, name, None)):
            raise _fail(f"NamedDataStore.{name}", "missing")
    return store


def program_from_flatbuffer(data: bytes) -> Any:
    """A ``.pte``'s Program (ExecuTorch's dataclasses) from its flatbuffer bytes."""
    try:
        from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    except ImportError as exc:
        raise _fail("_flatbuffer_program._flatbuffer_to_program", str(exc)) from exc
    return _flatbuffer_to_program(data)


def flat_tensor_from_flatbuffer(data: bytes) -> Any:
    """A ``.ptd``'s FlatTensor (ExecuTorch's dataclasses) from its flatbuffer bytes."""
    try:
        from executorch.extension.flat_tensor.serialize.serialize import (
            _deserialize_to_flat_tensor,
        )
    except ImportError as exc:
        raise _fail("flat_tensor serialize._deserialize_to_flat_tensor", str(exc)) from exc
    return _deserialize_to_flat_tensor(data)


# --- staged engines inside delegate segments --------------------------------------


class EngineView(mmap.mmap):
    """A staged blob as a piece of a Cord: a read-only mapping of its file.

    ExecuTorch 1.4.1 writes a Cord with ``outfile.write(piece)`` and 1.5.1 calls
    ``piece.write_to_file(outfile)`` for anything that is not ``bytes``; a
    mapping serves both without reading the file into memory, so ExecuTorch's
    own ``save`` still writes the program. trtet_store's writer never reads it:
    it places :attr:`blob` instead. Copies are the view itself, as for
    :class:`_BlobRef`. Closed once a write consumed the blob (a consumed file is
    gone or truncated, and touching its pages would fault).
    """

    blob: Blob

    def __new__(cls, blob: Blob) -> EngineView:
        if blob.size <= 0:
            raise ValueError(f"{blob!r} is empty: a TensorRT engine has bytes")
        with open(blob.path, "rb") as f:
            view = super().__new__(cls, f.fileno(), blob.size, prot=mmap.PROT_READ)
        view.blob = blob
        return view

    def __len__(self) -> int:
        # The planned size, even once the view is closed (mmap's own len() raises then).
        return self.blob.size

    def check_live(self) -> None:
        if self.blob.closed or self.closed:
            state = "consumed by a write" if self.blob.consumed else "released"
            raise ValueError(f"staged engine {self.blob.path} was {state}; the program "
                             "cannot be written again")

    def write_to_file(self, outfile: Any) -> None:
        """Write the engine's bytes to ``outfile`` (ExecuTorch 1.5.1's Cord protocol)."""
        self.check_live()
        outfile.write(self)

    def to_bytes(self) -> bytes:
        """The engine's bytes, read into memory (``bytes(cord)`` on 1.5.1)."""
        self.check_live()
        return bytes(self)

    def __copy__(self) -> EngineView:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> EngineView:
        return self

    def __reduce__(self) -> Any:
        raise TypeError("a staged TensorRT engine cannot be pickled; write the program "
                        "with trtet_store.save_program")


def cord_with_view(head: bytes, blob: Blob) -> Cord:
    """A Cord of ``head`` followed by ``blob``'s bytes, as an :class:`EngineView`."""
    cord = _cord_module().Cord(head)
    view = EngineView(blob)
    # Cord.append takes only bytes, Cords and (1.5) FileBackedData.
    cord._buffers.append(view)
    cord._byte_size += len(view)
    return cord


#: Turns one delegate segment's bytes into (bytes before the engine, staged engine blob),
#: or None for a segment it does not know.
SegmentExpander = Callable[[bytes], "tuple[bytes, Blob] | None"]


def expand_delegate_segments(expander: SegmentExpander) -> None:
    """Have ExecuTorch's serializer expand delegate segments that ``expander`` recognises.

    ``_extract_delegate_segments`` is wrapped (once per process): after it has
    moved every delegate's processed bytes into a segment, deduplicated, each
    new segment that is one ``bytes`` piece is offered to every expander, and a
    hit becomes ``head + EngineView(blob)``. The segment table and the extended
    header are computed afterwards from the segment's length, so offsets and
    sizes in the ``.pte`` describe the expanded segment. Idempotent.
    """
    mod = _program_module()
    extract = mod._extract_delegate_segments
    expanders: list[SegmentExpander] | None = getattr(extract, "_trtet_expanders", None)
    if expanders is None:
        original = extract
        expanders = []

        def extract(program: Any, segments: list[Any]) -> None:
            start = len(segments)
            original(program, segments)
            for segment in segments[start:]:
                data = getattr(segment, "data", None)
                if data is None:
                    raise _fail("AlignedData.data", "missing")
                pieces = cord_pieces(data)
                if len(pieces) != 1 or not isinstance(pieces[0], bytes):
                    continue
                for expand in expanders:
                    hit = expand(pieces[0])
                    if hit is not None:
                        segment.data = cord_with_view(*hit)
                        break

        extract._trtet_expanders = expanders  # type: ignore[attr-defined]
        extract.__wrapped__ = original  # type: ignore[attr-defined]
        mod._extract_delegate_segments = extract
    if expander not in expanders:
        expanders.append(expander)


def engine_views(cords: list[Cord]) -> list[EngineView]:
    """Every :class:`EngineView` in ``cords``."""
    return [p for c in cords for p in cord_pieces(c) if isinstance(p, EngineView)]


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
    mod = _cord_module()
    cord_cls = mod.Cord
    _check_delegate_segments()
    if has_file_backed_data():
        _check_file_backed_data(mod)
    elif executorch_version().startswith("1.5"):
        raise _fail("executorch.exir._serialize._cord.FileBackedData", "missing in 1.5")
    named_data_store()
    _check_deserializers()
    cord = cord_cls(b"ab")
    cord.append(b"cd")
    if cord_pieces(cord) != [b"ab", b"cd"]:
        raise _fail("Cord._buffers", "does not hold the appended bytes in order")
    if not isinstance(getattr(cord, "_byte_size", None), int):
        raise _fail("Cord._byte_size", "missing")

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


def _check_delegate_segments() -> None:
    import inspect

    mod = _program_module()
    extract = getattr(mod._extract_delegate_segments, "__wrapped__",
                      mod._extract_delegate_segments)
    if list(inspect.signature(extract).parameters) != ["program", "segments"]:
        raise _fail("_program._extract_delegate_segments", "expected (program, segments)")
    aligned = getattr(mod, "AlignedData", None)
    if aligned is None or "data" not in inspect.signature(aligned).parameters:
        raise _fail("_program.AlignedData", "expected a class with a data field")
    source = inspect.getsource(mod.serialize_pte_binary)
    if "_extract_delegate_segments(" not in source or "len(segment.data)" not in source:
        raise _fail("_program.serialize_pte_binary",
                    "no longer sizes segments after _extract_delegate_segments")


def _check_file_backed_data(mod: Any) -> None:
    import inspect

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


def _check_deserializers() -> None:
    """Both deserializers exist and take the flatbuffer bytes as their one argument."""
    import inspect

    from executorch.exir._serialize import _flatbuffer_program
    from executorch.extension.flat_tensor.serialize import serialize

    for module, name in ((_flatbuffer_program, "_flatbuffer_to_program"),
                         (serialize, "_deserialize_to_flat_tensor")):
        func = getattr(module, name, None)
        if not callable(func):
            raise _fail(name, "missing")
        if len(inspect.signature(func).parameters) != 1:
            raise _fail(name, "expected one parameter, the flatbuffer bytes")
