"""safetensors files written through the blob store: atomic, durable, preflighted, streamed.

:func:`save_file` takes what ``safetensors.torch.save_file`` takes (torch
tensors, numpy arrays) and staged blobs, and writes the same bytes:

- the header is computed from dtypes, shapes and lengths alone, as
  safetensors' ``prepare()`` does (sorted by dtype, descending in its enum's
  order, then by name; offsets as running sums; JSON padded with spaces to a
  multiple of 8; ``__metadata__`` first);
- then the file is one :func:`trtet_store.io.write_file`: the header as an
  inline piece, each tensor as views of its own memory, a file range, or its
  staged blob. No buffer of the whole file is ever built; the destination
  keeps its old content until the new file is complete and durable.

``alignment=4096`` pads the header so that the data starts on a page, and
puts the tensors whose length is a multiple of the alignment first, each on
a page: staged blobs can then be cloned (XFS, btrfs) or inserted (ext4,
XFS). Readers accept the padded header (it is JSON followed by spaces); the
file is no longer byte-identical to ``save_file``'s.

:func:`save_sharded` writes ``model-0000k-of-0000N.safetensors`` and
``model.safetensors.index.json`` (Hugging Face's layout) as one transaction.
Once that has committed, it removes the previous checkpoint's files (its
shards, or its single ``model.safetensors``) that the new index does not name,
as ``huggingface_hub.save_torch_state_dict`` does, but only after the new
index is durable (see :func:`remove_stale_shards`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import struct
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtet_store.formats.tensors import RANK, TensorBytes, describe_all
from trtet_store.io import (
    InsufficientSpaceError,
    WriteOptions,
    WriteReport,
    fsync_dir,
    write_files,
)
from trtet_store.io.options import UNSET, ProgressCallback, resolve

log = logging.getLogger("trtet_store.formats")

__all__ = ["ShardedReports", "build_layout", "header_bytes", "remove_stale_shards", "save_file",
           "save_sharded", "shard_plan"]


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str (safetensors stores text only); "
                            f"got {k!r}: {v!r}")
    return dict(metadata)


def data_order(items: Sequence[TensorBytes], alignment: int | None) -> list[TensorBytes]:
    """The order of the tensors in the file.

    safetensors' own: dtype descending in its enum's order (each tensor then
    starts aligned to its element), then name (code points, as Rust compares
    UTF-8 bytes). With an alignment, tensors whose length is a multiple of it
    come first, each group in that order, so each of those starts on a boundary.
    """
    def key(t: TensorBytes) -> tuple[int, str]:
        return (-RANK[t.dtype], t.name)

    ordered = sorted(items, key=key)
    if alignment:
        return ([t for t in ordered if t.nbytes % alignment == 0]
                + [t for t in ordered if t.nbytes % alignment])
    return ordered


def header_bytes(ordered: Sequence[TensorBytes], metadata: Mapping[str, str] | None,
                 alignment: int | None = None) -> bytes:
    """The 8-byte length and the JSON header, padded: everything before the first tensor.

    The JSON is serde_json's compact form: no spaces, non-ASCII as UTF-8,
    control characters escaped (Python's ``json`` with ``ensure_ascii=False``
    writes exactly that). It is padded with spaces to a multiple of 8, or so
    that the data starts at a multiple of ``alignment``.
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    boundary = alignment or 8
    pad = -(8 + len(text)) % boundary if alignment else -len(text) % 8
    text += b" " * pad
    return struct.pack("<Q", len(text)) + text


def build_layout(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
                 alignment: int | None = None) -> tuple[list[Any], list[TensorBytes]]:
    """The pieces of a safetensors file, and the tensors in file order.

    The pieces go to :func:`trtet_store.io.write_file` as they are: the
    header, then each tensor's memory slices, file range or blob. Keep the
    tensors alive until the write returns.
    """
    _check_alignment(alignment)
    metadata = _check_metadata(metadata)
    ordered = data_order(describe_all(tensors), alignment)
    for name in (t.name for t in ordered):
        if name == "__metadata__":
            raise ValueError("'__metadata__' is the header's metadata key; rename that tensor")
    pieces: list[Any] = [header_bytes(ordered, metadata, alignment)]
    for t in ordered:
        pieces += t.pieces
    return pieces, ordered


def _check_alignment(alignment: int | None) -> None:
    if alignment is None:
        return
    if not isinstance(alignment, int) or alignment < 8 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two of at least 8 (4096 for zero-copy "
                         f"placement), got {alignment!r}")


def save_file(tensors: Mapping[str, Any], filename: os.PathLike | str,
              metadata: Mapping[str, str] | None = None, *, alignment: int | None = None,
              options: WriteOptions | None = None, consume: bool = UNSET,
              progress: ProgressCallback | None = UNSET,
              placements: Collection[str] | str | None = UNSET,
              timeout: float | None = UNSET) -> WriteReport:
    """Write ``tensors`` to ``filename`` in safetensors format, as one transaction.

    Parameters
    ----------
    tensors : dict of str to tensor
        torch tensors, numpy arrays, :class:`~trtet_store.formats.tensors.StagedTensor`
        or blobs with ``dtype`` and ``shape`` metadata. In-memory tensors must
        be dense, contiguous and not share memory (each refusal says the fix).
    filename : path-like
        The destination. It may be the file the tensors were loaded from
        (``load_file`` / ``safe_open`` map it): the old file is read until the
        new one replaces it.
    metadata : dict of str to str, optional
        The header's ``__metadata__``, in the order given (safetensors' own
        order of a dict with several keys varies from run to run).
    alignment : int, optional
        Start the data, and every tensor whose length is a multiple of it, at
        a multiple of ``alignment`` (4096: staged blobs are cloned or inserted).
        Default: byte-identical to ``safetensors.torch.save_file``.
    options : trtet_store.io.WriteOptions, optional
        The write options as one object, handed to the write (its
        ``chunk_size`` too). The keywords below still work (for one
        release); one given both ways with different values is a ``TypeError``.
    consume : bool
        Let staged blobs be moved or inserted into the file (they are used up).
    progress : callable, optional
        Called with a :class:`trtet_store.io.Progress` (``.done``, ``.total``);
        a callable of two positional arguments gets ``(done, total)``.
    placements, timeout
        As for :func:`trtet_store.io.write_file`.

    Returns
    -------
    WriteReport
        Per tensor blob or file range, how it was placed and why.
    """
    opts = resolve(options, "save_file", consume=consume, progress=progress,
                   placements=placements, timeout=timeout)
    pieces, ordered = build_layout(tensors, metadata, alignment)
    owners = [t.owner for t in ordered]  # the memory the pieces view stays alive
    log.info("%s: %d tensors, %d bytes of data (%d staged)", filename, len(ordered),
             sum(t.nbytes for t in ordered), sum(t.nbytes for t in ordered if t.staged))
    try:
        (report,) = write_files([(filename, pieces)], options=opts)
    except OSError as exc:
        raise _space_error(exc, [(filename, pieces)]) from exc
    finally:
        del owners
    return report


def _space_error(exc: OSError, outputs: Sequence[tuple[Any, Sequence[Any]]]) -> OSError:
    """A disk that filled during the write as :class:`InsufficientSpaceError`; others as they are.

    The preflight found the space and something else took it meanwhile: the
    caller gets the path, what the files need (their sizes) and what is free
    now, as from a refused preflight, instead of a bare ``ENOSPC``.
    """
    if exc.errno != errno.ENOSPC or isinstance(exc, InsufficientSpaceError):
        return exc
    needed = sum(_piece_size(p) for _, pieces in outputs for p in pieces)
    return InsufficientSpaceError.during_write(exc, needed, outputs[0][0])


def _piece_size(piece: Any) -> int:
    if isinstance(piece, (bytes, bytearray)):
        return len(piece)
    if isinstance(piece, memoryview):
        return piece.nbytes
    return piece.size  # a Blob or an ExternalFile


def shard_plan(items: Sequence[TensorBytes], max_shard_size: int) -> list[list[TensorBytes]]:
    """Tensors into shards, in the given order, each at most ``max_shard_size`` bytes of data.

    A tensor larger than the limit gets a shard of its own (as Hugging Face's
    ``split_torch_state_dict_into_shards`` does).
    """
    shards: list[list[TensorBytes]] = []
    size = 0
    for t in items:
        if not shards or (shards[-1] and size + t.nbytes > max_shard_size):
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards or [[]]


def save_sharded(tensors: Mapping[str, Any], directory: os.PathLike | str, *,
                 max_shard_size: int = 5 << 30, prefix: str = "model",
                 metadata: Mapping[str, str] | None = None, alignment: int | None = None,
                 options: WriteOptions | None = None, consume: bool = UNSET,
                 progress: ProgressCallback | None = UNSET,
                 placements: Collection[str] | str | None = UNSET,
                 timeout: float | None = UNSET) -> list[WriteReport]:
    """Write a sharded checkpoint: every shard and the index, as one transaction.

    The shards are ``{prefix}-0000k-of-0000N.safetensors`` (one
    ``{prefix}.safetensors`` when everything fits in one), the index
    ``{prefix}.safetensors.index.json`` with ``metadata.total_size`` and the
    ``weight_map`` (tensor name to shard file), as Hugging Face writes them.
    Either every file is replaced, or none is. After that has committed, the
    files of the previous checkpoint that the new index does not name are
    removed (:func:`remove_stale_shards`); a save that fails removes nothing.

    Parameters
    ----------
    max_shard_size : int
        Bytes of tensor data per shard (default 5 GiB); a larger tensor gets its own.
    prefix : str
        The base name; a plain file name, no directory part.
    metadata, alignment, options, consume, progress, placements, timeout
        As for :func:`save_file`; ``metadata`` goes into every shard.

    Returns
    -------
    ShardedReports
        A list of WriteReport, one per shard, then the index's; its
        ``removed`` attribute lists the stale files it removed.
    """
    opts = resolve(options, "save_sharded", consume=consume, progress=progress,
                   placements=placements, timeout=timeout)
    if not prefix or os.sep in prefix or prefix in (".", "..") or "\0" in prefix:
        raise ValueError(f"prefix must be a plain file name, got {prefix!r}")
    if max_shard_size <= 0:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size}")
    _check_alignment(alignment)
    metadata = _check_metadata(metadata)
    directory = Path(directory)
    items = describe_all(tensors)
    # Shard in the caller's order, as transformers does (layers stay together).
    shards = shard_plan(items, max_shard_size)
    n = len(shards)
    names = ([f"{prefix}.safetensors"] if n == 1 else
             [f"{prefix}-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)])
    outputs: list[tuple[Path, list[Any]]] = []
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards, strict=True):
        ordered = data_order(shard, alignment)
        pieces: list[Any] = [header_bytes(ordered, metadata, alignment)]
        for t in ordered:
            pieces += t.pieces
            weight_map[t.name] = name
        outputs.append((directory / name, pieces))
    index = {"metadata": {"total_size": sum(t.nbytes for t in items)},
             "weight_map": dict(sorted(weight_map.items()))}
    index_path = directory / f"{prefix}.safetensors.index.json"
    index_bytes = json.dumps(index, indent=2).encode() + b"\n"
    outputs.append((index_path, [index_bytes]))
    # Read before the write replaces it: the old index is what names the old set.
    previous = _indexed_names(index_path)
    owners = [t.owner for t in items]
    log.info("%s: %d tensors in %d shard(s) of at most %d bytes", directory, len(items), n,
             max_shard_size)
    try:
        reports = ShardedReports(write_files(outputs, options=opts))
    except OSError as exc:
        raise _space_error(exc, outputs) from exc
    finally:
        del owners
    # Only here, after write_files returned: the new index is durable, so no
    # reader can still be led to an old shard. An error above removed nothing.
    reports.removed = remove_stale_shards(directory, prefix, previous or (), index_bytes)
    return reports


class ShardedReports(list[WriteReport]):
    """What :func:`save_sharded` returns: its reports (a list), and the stale files it removed.

    Attributes
    ----------
    removed : list of Path
        The previous checkpoint's files that the new index does not name,
        removed after the new one had committed.
    """

    removed: list[Path]

    def __init__(self, reports: Sequence[WriteReport] = ()) -> None:
        super().__init__(reports)
        self.removed = []


def _indexed_names(index_path: Path) -> set[str] | None:
    """The file names an index's ``weight_map`` points to; None if there is no readable index."""
    try:
        weight_map = json.loads(index_path.read_bytes())["weight_map"]
        return {f for f in weight_map.values() if isinstance(f, str)}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s is not a readable index (%s); of the old files only those named "
                    "as this prefix's checkpoint files will be removed", index_path, exc)
        return None


def remove_stale_shards(directory: os.PathLike | str, prefix: str,
                        previous: Collection[str], index_bytes: bytes) -> list[Path]:
    """Remove the files of an older checkpoint that the current index does not name.

    Call it only once the new index is durable: readers follow the index, so
    from then on the old files are unreferenced. Stale are the files that the
    previous index named (plain ``*.safetensors`` names in ``directory``) and
    the files named exactly ``{prefix}.safetensors`` or
    ``{prefix}-NNNNN-of-NNNNN.safetensors`` (huggingface_hub's pattern: an
    earlier save may have committed and died before its own cleanup, or the
    old checkpoint was one file with no index), minus everything the current
    index names. A ``{prefix}.safetensors`` left beside a sharded index
    would be worse than unreferenced: transformers loads it before it looks
    for the index. Nothing else is touched.

    Parameters
    ----------
    directory : path-like
        The checkpoint's directory.
    prefix : str
        The checkpoint's base name.
    previous : collection of str
        The file names the index named before the save (read before it).
    index_bytes : bytes
        The index this save wrote. If ``{prefix}.safetensors.index.json`` no
        longer holds exactly these bytes, another save has replaced it since,
        and nothing is removed (that save cleans up after itself).

    Returns
    -------
    list of Path
        The files removed. One that cannot be removed is logged and kept:
        the checkpoint is already published, and the next save tries again.
    """
    directory = Path(directory)
    index_path = directory / f"{prefix}.safetensors.index.json"
    try:
        current_bytes = index_path.read_bytes()
    except OSError as exc:
        log.warning("%s: cannot read back the new index (%s); no stale shard removed",
                    directory, exc)
        return []
    if current_bytes != index_bytes:
        log.warning("%s: another save replaced the index meanwhile; no stale shard removed",
                    directory)
        return []
    current = {f for f in json.loads(index_bytes)["weight_map"].values()}
    ours = re.compile(re.escape(prefix) + r"(-[0-9]{5}-of-[0-9]{5})?\.safetensors")
    why: dict[str, str] = {}
    for name in previous:
        if (name not in current and name.endswith(".safetensors")
                and name == os.path.basename(name) and name not in (".", "..")
                and "\0" not in name):
            why[name] = "named by the previous index, not by the new one"
    try:
        listing = os.listdir(directory)
    except OSError as exc:
        log.warning("%s: cannot list the directory (%s); only the previous index's files "
                    "are checked", directory, exc)
        listing = []
    for name in listing:
        if ours.fullmatch(name) and name not in current:
            why.setdefault(name, f"a file of {prefix!r}'s checkpoint that the new index does "
                                 "not name (left by an earlier save or a single-file one)")
    removed: list[Path] = []
    for name in sorted(why):
        path = directory / name
        try:
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                log.warning("%s: not a file; kept", path)
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: stale shard not removed (%s); the next save tries again",
                        path, exc)
            continue
        log.info("%s: removed: %s", path, why[name])
        removed.append(path)
    if removed:
        _fsync_directory(directory)
    return removed


def _fsync_directory(directory: Path) -> None:
    """Make the unlinks durable (a power cut must not bring the stale shards back)."""
    try:
        fsync_dir(directory)
    except OSError as exc:
        log.warning("%s: directory fsync after removing stale shards failed (%s)",
                    directory, exc)
