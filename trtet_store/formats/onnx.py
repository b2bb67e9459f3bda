"""ONNX models with external data, the ``.onnx`` and its data file written as one transaction.

``onnx.save_model(..., save_as_external_data=True)`` marks the caller's
tensors external, appends their bytes to the data file in place (a re-save
appends to the old data), clears ``raw_data`` in the caller's model and
writes the ``.onnx``. :func:`save_model` instead:

1. copies the model's structure without any initializer's ``raw_data``
   (protobuf's ``CopyFrom`` would duplicate every byte of the weights), so
   the caller's model is never changed;
2. plans the data file from lengths: each tensor at an offset aligned to
   ``alignment`` (64 bytes, or 4096 so that tensors can be cloned),
   recorded as ``location``/``offset``/``length`` on the copy;
3. writes the ``.onnx`` and the data file with one
   :func:`trtet_store.io.write_files`: both appear, or neither changes.

Tensor bytes come from where they are:

- ``raw_data`` in memory is copied out of the protobuf once (the protobuf
  library has no view of it) and written;
- a tensor already external (``data_location=EXTERNAL``, resolved against
  ``base_dir``) is a range of its file, copied by the kernel or cloned, never
  read into memory, even when that file is the data file being replaced;
- a staged blob named in ``tensors`` is placed (clone, insert, move, copy).

The data file holds exactly the current tensors: it is replaced, never
appended to. Which tensors go external follows onnx: initializers (in every
subgraph), and node-attribute tensors with ``convert_attribute=True``, whose
``raw_data`` is at least ``size_threshold`` bytes by onnx's own measure,
``sys.getsizeof`` (the length plus 33 bytes: a 991-byte tensor goes external
at the default 1024).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from trtet_store.formats.tensors import StagedTensor, file_range
from trtet_store.io import Blob, BlobStore, WriteOptions, WriteReport, write_files
from trtet_store.io.options import UNSET, ProgressCallback, resolve

log = logging.getLogger("trtet_store.formats")

__all__ = ["save_model"]


def save_model(model: Any, path: os.PathLike | str, *, location: str,
               size_threshold: int = 1024, convert_attribute: bool = False,
               alignment: int = 64, base_dir: os.PathLike | str | None = None,
               tensors: Mapping[str, Blob | StagedTensor] | None = None,
               store: BlobStore | None = None, options: WriteOptions | None = None,
               consume: bool = UNSET, progress: ProgressCallback | None = UNSET,
               placements: Collection[str] | str | None = UNSET,
               timeout: float | None = UNSET) -> list[WriteReport]:
    """Save ``model`` to ``path`` with its large tensors in ``location``, as one transaction.

    Parameters
    ----------
    model : onnx.ModelProto or onnx_ir.Model
        Never changed.
    path : path-like
        The ``.onnx`` file.
    location : str
        The data file, relative to ``path``'s directory and inside it. Required:
        two models saved into one directory must not share a default name (a
        save replaces the whole data file).
    size_threshold : int
        As onnx's: tensors with ``sys.getsizeof(raw_data) >= size_threshold``
        (the length plus 33 on 64-bit CPython) go external.
    convert_attribute : bool
        Also move node-attribute tensors (``Constant`` values) to the data file.
    alignment : int
        Every tensor's offset is a multiple of it (a power of two; 4096 lets
        staged and already-external tensors be cloned on XFS and btrfs).
    base_dir : path-like, optional
        Where the locations of tensors already external are relative to (the
        directory the model was loaded from). Default: ``path``'s directory.
    tensors : dict of str to Blob or StagedTensor, optional
        Initializer name to a staged blob holding its bytes: placed, never
        read. The initializer keeps its name, type and dims.
    store : BlobStore, optional
        Stage each in-memory tensor into this store as it is copied out of
        the protobuf, and drop the copy: memory then holds one tensor at a
        time, not all of them (the protobuf library gives no view of
        ``raw_data``, only copies). Put the store on the output's filesystem
        and use ``alignment=4096``: the staged bytes are then cloned (XFS,
        btrfs) or inserted and moved (ext4; with ``consume=True``, or when no
        blob of yours is in ``tensors``) instead of copied. Default: the
        copies stay in memory until the write returns (fastest; peak memory
        the size of the external data).
    options : trtet_store.io.WriteOptions, optional
        The write options as one object, handed to the write (its
        ``chunk_size`` too). The keywords below still work (for one
        release); one given both ways with different values is a ``TypeError``.
    consume : bool
        Let staged blobs be moved or inserted (they are used up).
    progress, placements, timeout
        As for :func:`trtet_store.io.write_files`.

    Returns
    -------
    list of WriteReport
        The ``.onnx``'s, then the data file's.
    """
    opts = resolve(options, "save_model", consume=consume, progress=progress,
                   placements=placements, timeout=timeout)
    import onnx

    ir = sys.modules.get("onnx_ir")
    if ir is not None and isinstance(model, ir.Model):
        # Its in-memory tensors become raw_data (a copy each, as onnx_ir's own save
        # makes); its external tensors stay references, resolved against base_dir.
        model = ir.to_proto(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or an onnx_ir.Model, got "
                        f"{type(model).__name__}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    path = Path(path).absolute()
    data_path = _data_path(path, location)
    base = Path(base_dir).absolute() if base_dir is not None else path.parent
    staged = dict(tensors or {})
    for name, value in staged.items():
        if not isinstance(value, (Blob, StagedTensor)):
            raise TypeError(f"tensors[{name!r}]: expected a Blob or StagedTensor, got "
                            f"{type(value).__name__}")

    out = onnx.ModelProto()
    _copy(model, out, onnx)
    ours: list[Blob] = []  # blobs staged here from raw_data, released after the write
    try:
        pieces, size = _plan(model, out, onnx, staged, base, location, size_threshold,
                             convert_attribute, alignment, store, ours)
        header = out.SerializeToString()
        log.info("%s: %d bytes of model, %d bytes of external data in %s (%d tensors staged)",
                 path, len(header), size, data_path, len(ours))
        # Blobs staged here are ours to use up; the caller's only with consume=True.
        use_up = opts.consume or (bool(ours) and not staged)
        return write_files([(path, [header]), (data_path, pieces)],
                           options=dataclasses.replace(opts, consume=use_up))
    finally:
        for blob in ours:
            blob.close()


def _plan(model: Any, out: Any, onnx: Any, staged: dict, base: Path, location: str,
          size_threshold: int, convert_attribute: bool, alignment: int,
          store: BlobStore | None, ours: list[Blob]) -> tuple[list[Any], int]:
    """The data file's pieces, with ``out``'s tensors pointed at them; its size."""
    pieces: list[Any] = []
    offset = 0
    used: set[str] = set()
    for (s, kind), (d, _) in zip(_tensors(model), _tensors(out), strict=True):
        piece = None
        if kind == "initializer" and s.name in staged:
            piece = _staged_piece(s, staged[s.name], onnx)
            used.add(s.name)
        elif _is_external(s, onnx):
            piece = _external_piece(s, base)
        elif s.HasField("raw_data"):
            raw = s.raw_data  # the one copy protobuf allows
            wanted = kind == "initializer" or (kind == "attribute" and convert_attribute)
            # onnx's own measure, sys.getsizeof: the length plus the bytes object's
            # header (33 on 64-bit CPython), so 991..1023-byte tensors go external too.
            if wanted and sys.getsizeof(raw) >= size_threshold:
                piece = raw
                if store is not None:
                    piece = store.put(raw)
                    ours.append(piece)
                    del raw
            else:
                d.raw_data = raw
        if piece is None:
            continue
        size = piece.size if not isinstance(piece, bytes) else len(piece)
        pad = -offset % alignment
        if pad:
            pieces.append(bytes(pad))  # zeros: left as a hole
            offset += pad
        pieces.append(piece)
        _set_external(d, location, offset, size, onnx)
        offset += size
    missing = sorted(set(staged) - used)
    if missing:
        raise ValueError(f"tensors names no initializer of the model: {missing}")
    return pieces, offset


def _data_path(path: Path, location: str) -> Path:
    """The data file for ``location``, refused unless it is a relative name inside the directory."""
    if not isinstance(location, str) or not location or "\0" in location:
        raise ValueError(f"location must be a non-empty relative file name, got {location!r}")
    norm = os.path.normpath(location)
    if os.path.isabs(location) or norm == ".." or norm.startswith(".." + os.sep) or norm == ".":
        raise ValueError(f"location {location!r} must name a file inside {path.parent} "
                         "(relative, without '..'), as ONNX readers resolve it")
    data = path.parent / norm
    real_parent = os.path.realpath(data.parent)
    if os.path.commonpath([real_parent, os.path.realpath(path.parent)]) != os.path.realpath(
            path.parent):
        raise ValueError(f"location {location!r} leads outside {path.parent} through a symlink")
    if data == path:
        raise ValueError(f"location {location!r} is the model file itself")
    return data


def _is_external(t: Any, onnx: Any) -> bool:
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def _external_piece(t: Any, base: Path) -> Any:
    """A tensor already in a file: its range there (``location`` must stay inside ``base``)."""
    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    try:
        source = _data_path(base / "model.onnx", where)
    except ValueError as exc:
        raise ValueError(f"initializer {t.name!r}: {exc}") from None
    offset = int(info.get("offset", 0) or 0)
    file_size = os.stat(source).st_size
    length = int(info["length"]) if info.get("length") else file_size - offset
    if offset < 0 or length < 0 or offset + length > file_size:
        raise ValueError(f"initializer {t.name!r}: bytes [{offset}, {offset + length}) of "
                         f"{source} are past its end ({file_size} bytes)")
    return file_range(source, offset, length)


def _staged_piece(t: Any, value: Blob | StagedTensor, onnx: Any) -> Blob:
    blob = value.blob if isinstance(value, StagedTensor) else value
    try:
        import numpy as np

        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = None  # strings, 4-bit types: no fixed size to check
    if itemsize is not None and t.data_type not in _SUB_BYTE:
        expected = math.prod(t.dims) * itemsize
        if expected != blob.size:
            raise ValueError(f"initializer {t.name!r} is {expected} bytes by its type and dims, "
                             f"its blob {blob.path} is {blob.size}")
    return blob


# INT4, UINT4, FLOAT4E2M1 (packed two per byte): numpy reports one byte each.
_SUB_BYTE = frozenset({21, 22, 23})


def _set_external(t: Any, location: str, offset: int, length: int, onnx: Any) -> None:
    t.ClearField("raw_data")
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


# -- the copy and the walk ------------------------------------------------------

def _copy(src: Any, dst: Any, onnx: Any, *, skip_raw: bool = False) -> None:
    """Copy ``src`` into ``dst`` field by field, leaving out ``raw_data`` where it is walked.

    ``raw_data`` is left out of initializers (``GraphProto.initializer``) and
    node-attribute tensors (``AttributeProto.t``/``tensors``): :func:`_tensors`
    visits exactly those, and the caller puts each back or makes it external.
    Messages that cannot hold such a tensor are copied whole (``CopyFrom``).
    """
    desc = src.DESCRIPTOR
    if not skip_raw and not _holds_walked(desc):
        dst.CopyFrom(src)
        return
    for field in desc.fields:
        name = field.name
        if skip_raw and name == "raw_data":
            continue
        child_skip = (desc.name, name) in _WALKED_FIELDS
        if field.message_type is not None:
            if _repeated(field):
                for item in getattr(src, name):
                    _copy(item, getattr(dst, name).add(), onnx, skip_raw=child_skip)
            elif src.HasField(name):
                _copy(getattr(src, name), getattr(dst, name), onnx, skip_raw=child_skip)
        elif _repeated(field):
            values = getattr(src, name)
            if len(values):
                getattr(dst, name).extend(values)
        elif src.HasField(name):
            setattr(dst, name, getattr(src, name))


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)
    return repeated if repeated is not None else field.label == field.LABEL_REPEATED


#: (message, field) whose TensorProtos are walked (raw_data left out of the copy).
_WALKED_FIELDS = frozenset({("GraphProto", "initializer"), ("AttributeProto", "t"),
                            ("AttributeProto", "tensors")})
_HOLDS: dict[str, bool] = {}


def _holds_walked(desc: Any) -> bool:
    """Whether a message of this type can contain a walked tensor (memoized, cycles cut)."""
    known = _HOLDS.get(desc.full_name)
    if known is not None:
        return known
    _HOLDS[desc.full_name] = False  # while deciding: a cycle adds nothing
    holds = any((desc.name, f.name) in _WALKED_FIELDS
                or (f.message_type is not None and _holds_walked(f.message_type))
                for f in desc.fields)
    _HOLDS[desc.full_name] = holds
    return holds


def _tensors(model: Any) -> Iterator[tuple[Any, str]]:
    """Every walked tensor with its kind, in onnx's order: initializers, then attributes.

    ``initializer``: the main graph's and its subgraphs' (onnx's
    ``_get_initializer_tensors``); ``attribute``: node-attribute tensors of
    the graph and of the functions (``_get_attribute_tensors``); ``other``:
    what onnx does not visit (initializers of graphs inside functions and of
    training graphs), kept in the model as they are.
    """
    yield from ((t, "initializer") for t in _in_graph(model.graph, "initializer"))
    yield from ((t, "attribute") for t in _in_graph(model.graph, "attribute"))
    for fn in model.functions:
        yield from ((t, "attribute") for t in _in_nodes(fn.node, "attribute"))
    for fn in model.functions:
        yield from ((t, "other") for t in _in_nodes(fn.node, "initializer"))
    for info in model.training_info:
        for g in (info.initialization, info.algorithm):
            yield from ((t, "other") for t in _in_graph(g, "initializer"))
            yield from ((t, "other") for t in _in_graph(g, "attribute"))


def _in_graph(graph: Any, kind: str) -> Iterator[Any]:
    if kind == "initializer":
        yield from graph.initializer
    yield from _in_nodes(graph.node, kind)


def _in_nodes(nodes: Any, kind: str) -> Iterator[Any]:
    for node in nodes:
        for a in node.attribute:
            if kind == "attribute":
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
            if a.HasField("g"):
                yield from _in_graph(a.g, kind)
            for g in a.graphs:
                yield from _in_graph(g, kind)
