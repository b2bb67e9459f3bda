"""Versions, the errors, ExecuTorch's modules, a program's Cords and their pieces."""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir._serialize._cord import Cord, FileBackedData
    from executorch.exir.program import ExecutorchProgramManager

    from trtet_store.io.blobstore import Blob


TESTED_EXECUTORCH = ("1.4.1", "1.5.1")


class ExecutorchPrivateAPIError(RuntimeError):
    """An ExecuTorch internal that trtet_store relies on is missing or changed."""


class FileBackedDataUnavailableError(RuntimeError):
    """A file-backed payload was asked for from an ExecuTorch without ``FileBackedData``."""




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


#: The packages whose ``__init__`` imports torch (and all of ``exir``) on the way to the
#: Program deserializer, which itself needs neither (executorch 1.4.1 and 1.5.1).
_HEAVY_PACKAGES = ("executorch.exir", "executorch.exir._serialize", "executorch.exir.backend")


def _import_without_torch(module: str) -> Any:
    """Import ``module`` (a leaf of ``executorch.exir``) without running the ``__init__``
    of :data:`_HEAVY_PACKAGES`, where torch is not imported yet (``trtet-store inspect``:
    seconds of torch for a file read).

    The packages are empty stand-ins while it imports, then taken out of ``sys.modules``
    again: a later ``import executorch.exir`` runs the real ``__init__``, which finds the
    leaves already imported (one copy of each class). Where torch is imported already, or
    a stand-in cannot be made, a plain import.
    """
    import importlib
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if "torch" in sys.modules or any(p in sys.modules for p in _HEAVY_PACKAGES):
        return importlib.import_module(module)
    made = []
    try:
        for name in _HEAVY_PACKAGES:
            spec = importlib.util.find_spec(name) if name == _HEAVY_PACKAGES[0] else \
                importlib.machinery.PathFinder.find_spec(
                    name, sys.modules[name.rpartition(".")[0]].__path__)
            if spec is None or spec.submodule_search_locations is None:
                return importlib.import_module(module)
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules[name] = package
            made.append(name)
        return importlib.import_module(module)
    finally:
        for name in made:
            sys.modules.pop(name, None)


def program_from_flatbuffer(data: bytes) -> Any:
    """A ``.pte``'s Program (ExecuTorch's dataclasses) from its flatbuffer bytes.

    Imports no torch where none is imported yet (:func:`_import_without_torch`).
    """
    try:
        reader = _import_without_torch("executorch.exir._serialize._flatbuffer_program")
        _flatbuffer_to_program = reader._flatbuffer_to_program
    except (ImportError, AttributeError) as exc:
        raise _fail("_flatbuffer_program._flatbuffer_to_program", str(exc)) from exc
    return _flatbuffer_to_program(data)


def flat_tensor_from_flatbuffer(data: bytes) -> Any:
    """A ``.ptd``'s FlatTensor (ExecuTorch's dataclasses) from its flatbuffer bytes.

    Where torch is not imported yet, read in pure Python (the same fields,
    :func:`~trtet_store.export._executorch_private.flat_tensor.read_flat_tensor`):
    ExecuTorch's reader imports torch and runs ``flatc``.
    """
    import sys

    if "torch" not in sys.modules:
        from trtet_store.export._executorch_private.flat_tensor import read_flat_tensor

        try:
            scalar_type = _import_without_torch("executorch.exir.scalar_type").ScalarType
        except (ImportError, AttributeError):
            scalar_type = None
        return read_flat_tensor(data, scalar_type)
    try:
        from executorch.extension.flat_tensor.serialize.serialize import (
            _deserialize_to_flat_tensor,
        )
    except ImportError as exc:
        raise _fail("flat_tensor serialize._deserialize_to_flat_tensor", str(exc)) from exc
    return _deserialize_to_flat_tensor(data)
