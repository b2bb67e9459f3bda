"""check_private_api(): every internal this package uses, checked on the installed ExecuTorch."""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

from trtet_store.export._executorch_private.core import (
    _cord_module,
    _fail,
    _program_module,
    cord_pieces,
    executorch_version,
    has_file_backed_data,
    named_data_store,
    ptd_cords,
    pte_cord,
)
from trtet_store.export._executorch_private.file_backed import _finalizers_removing, _remove_func

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir.program import ExecutorchProgramManager



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
