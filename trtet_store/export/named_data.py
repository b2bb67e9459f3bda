""".ptd names and named data: where a tag's file goes, and our blobs as ExecuTorch named data.

A ``.ptd`` tag becomes a file name in the output directory, so it is data that
must not escape it (invariant 8): :func:`ptd_file_name` refuses what would.
:func:`add_blob_as_named_data` hands a staged blob to ExecuTorch's
``NamedDataStore`` as file-backed data (executorch 1.5), never read into memory.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from executorch.exir.program import ExecutorchProgramManager

    from trtet_store.export._executorch_private import FileBackedData
    from trtet_store.io.blobstore import Blob

PTD_SUFFIX = ".ptd"


# --- tags ------------------------------------------------------------------------


def ptd_file_name(tag: str) -> str:
    """The file name ExecuTorch gives the ``.ptd`` of ``tag``, after validating ``tag``.

    ``tag`` plus ``.ptd`` unless it already ends in ``.ptd`` (as
    ``ExecutorchProgramManager.write_tensor_data_to_file`` does).

    Raises
    ------
    ValueError
        If the name would not be a plain file name inside the output directory:
        empty, ``.`` or ``..``, absolute, containing a path separator or a NUL.
    """
    if not isinstance(tag, str):
        raise ValueError(f".ptd tag {tag!r} is not a string")
    name = tag if tag.endswith(PTD_SUFFIX) else tag + PTD_SUFFIX
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    problem = None
    if tag in ("", ".", ".."):
        problem = "is empty, '.' or '..'"
    elif any(s in tag for s in seps):
        problem = "contains a path separator"
    elif "\0" in tag:
        problem = "contains a NUL byte"
    elif os.path.isabs(tag):
        problem = "is an absolute path"
    elif name in (PTD_SUFFIX,) or os.path.basename(name) != name:
        problem = "does not name a file"
    if problem is not None:
        raise ValueError(
            f"refusing .ptd tag {tag!r}: it {problem}; a tag must be a plain file name "
            "that stays inside the output directory"
        )
    return name


def ptd_paths(program: ExecutorchProgramManager, outdir: os.PathLike | str) -> dict[str, Path]:
    """Destination of each ``.ptd`` of ``program`` by tag, all validated first.

    Raises
    ------
    ValueError
        On a bad tag (see :func:`ptd_file_name`) or two tags naming one file
        (``w`` and ``w.ptd``: ExecuTorch would silently overwrite the first).
    """
    from trtet_store.export import _executorch_private as priv

    out = Path(outdir)
    paths: dict[str, Path] = {}
    seen: dict[str, str] = {}
    for tag in priv.ptd_cords(program):
        name = ptd_file_name(tag)
        if name in seen:
            raise ValueError(f".ptd tags {seen[name]!r} and {tag!r} both name {name!r}")
        seen[name] = tag
        paths[tag] = out / name
    return paths


# --- handing our blobs to ExecuTorch ------------------------------------------------


def add_blob_as_named_data(
    named_data_store: Any,
    key: str,
    blob: Blob,
    *,
    alignment: int = 16,
    external_tag: str | None = None,
    tensor_layout: Any = None,
    sha256: bytes | None = None,
) -> FileBackedData:
    """Register ``blob`` in an ExecuTorch ``NamedDataStore`` as file-backed named data.

    The ``FileBackedData`` is made without cleanup: ExecuTorch never deletes the
    file; our BlobStore does, when the blob is released or consumed by a write.
    The object holds the blob, so the file stays as long as ExecuTorch keeps
    the payload (``program_layouts`` recognises it and emits the Blob itself).
    One ``FileBackedData`` is reused per blob, so registering a blob under
    several keys (aliases) hashes it at most once.

    Cost: ``FileBackedData`` takes one ``stat``; ``add_named_data`` reads the
    first 32 bytes for its dedup fingerprint. ExecuTorch's dedup uses SHA-256,
    which our xxh3 digests cannot stand in for, so it reads the whole file once
    (8 MiB chunks) only when the fingerprint ``(size, first 32 bytes)`` matches
    another buffer or a key is registered twice; pass ``sha256`` (raw 32-byte
    digest, e.g. the one a TensorRT engine key is derived from) to avoid it.

    Parameters
    ----------
    named_data_store : ExecuTorch's NamedDataStore
        The store a backend's ``preprocess`` returns as ``data_store_output``.
    key : str
        Name the runtime looks the data up by.
    blob : Blob
        A live blob.
    alignment : int
        Alignment of the segment relative to the segment base (absolute only up
        to ``segment_alignment``).
    external_tag : str, optional
        Put the data in ``<tag>.ptd`` instead of the ``.pte``; validated here.
    tensor_layout : executorch.exir.tensor_layout.TensorLayout, optional
        For tensor data.
    sha256 : bytes, optional
        SHA-256 digest (raw bytes) of the blob's content, if known.

    Returns
    -------
    FileBackedData
        The object registered.
    """
    from trtet_store.export import _executorch_private as priv

    if blob.closed:
        raise ValueError(f"{blob!r} was released")
    if external_tag is not None:
        ptd_file_name(external_tag)
    if sha256 is not None and len(sha256) != 32:
        raise ValueError("sha256 must be the raw 32-byte digest")
    fbd = _FBD_BY_BLOB.get(id(blob))
    if fbd is None or priv.attached_blob(fbd) is not blob:
        fbd = priv.new_file_backed_data(blob, sha256=sha256)
        _FBD_BY_BLOB[id(blob)] = fbd
    elif sha256 is not None:
        priv.set_known_sha256(fbd, sha256)
    named_data_store.add_named_data(
        key, fbd, alignment=alignment, external_tag=external_tag, tensor_layout=tensor_layout
    )
    return fbd


#: One FileBackedData per live blob (weak: the FileBackedData holds the blob).
_FBD_BY_BLOB: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
