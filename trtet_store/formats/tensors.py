"""A tensor as what a writer needs: safetensors dtype, shape, byte length, and pieces.

Every format adapter starts here. A value is a torch tensor, a numpy array,
a :class:`StagedTensor` (a staged :class:`~trtet_store.io.Blob` with its dtype
and shape), or a ``Blob`` whose metadata records ``dtype`` and ``shape``. It
becomes a :class:`TensorBytes`: its bytes as pieces for a
:class:`~trtet_store.io.Layout`, never copied into a buffer of ours.

- A tensor in memory is a view of its own buffer, cut into slices of
  :data:`SLICE` bytes (a write may copy one slice at a time, never more).
- A tensor whose memory is an unmodified private mapping of a file (what
  ``safetensors.safe_open`` and ``load_file`` return) is that file's byte
  range, an :class:`~trtet_store.io.ExternalFile`, where the io layer takes
  ranges: the kernel copies it (or shares its blocks) instead of our reading it.
- A staged blob is placed (clone, insert, move or copy), never read here.

Refusals come before any write, each with the fix in the message, as
``safetensors.torch.save_file`` words them: tensors that share memory,
non-contiguous or sparse tensors, unknown dtypes.

torch and numpy are never imported here: a value can only be a torch tensor
if torch is loaded already (``sys.modules``).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import Blob, ExternalFile

log = logging.getLogger("trtet_store.formats")

#: Bytes per in-memory piece. A write may copy a piece while it journals and
#: writes it; slices keep that copy small whatever the tensor's size.
SLICE = 8 << 20

#: safetensors' dtypes in the order of its Rust enum (``Dtype``), with bits per
#: element. The enum's order is what ``save_file`` sorts by (descending, then
#: by name), so it is kept here as data, exactly as the 0.8.0 library declares it.
DTYPES: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
RANK = {code: i for i, code in enumerate(DTYPES)}

#: torch and numpy dtype names (``str(torch.float32)`` without ``torch.``,
#: ``numpy.dtype.name``; ml_dtypes' bfloat16 and float8 names are numpy's too).
_CODES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float4_e2m1fn_x2": "F4", "int16": "I16", "uint16": "U16", "float16": "F16",
    "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "complex64": "C64", "float64": "F64", "int64": "I64", "uint64": "U64",
}


def dtype_code(dtype: Any) -> str:
    """The safetensors code (``"F32"``) of a code, a torch dtype or a numpy dtype.

    Raises
    ------
    ValueError
        For a dtype safetensors cannot store.
    """
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    name = dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))
    name = name.removeprefix("torch.")
    try:
        return _CODES[name]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} cannot be stored in safetensors; the dtypes are "
                         f"{', '.join(DTYPES)} (or their torch/numpy names)") from None


def nbytes_of(code: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of safetensors dtype ``code`` and ``shape``.

    Raises
    ------
    ValueError
        When the elements do not fill whole bytes (sub-byte dtypes).
    """
    bits = math.prod(shape) * DTYPES[code]
    if bits % 8:
        raise ValueError(f"{code} tensor of shape {list(shape)} is {bits} bits, not whole bytes")
    return bits // 8


@dataclass(frozen=True)
class StagedTensor:
    """A tensor whose bytes are a staged blob: placed, never read into memory.

    Parameters
    ----------
    blob : Blob
        The tensor's bytes, in the layout the format stores (row-major, little-endian).
    dtype : str or dtype
        A safetensors code (``"F32"``), or a torch or numpy dtype.
    shape : sequence of int
        In the format's terms (safetensors counts F4 elements, two per byte).
    """

    blob: Blob
    dtype: Any
    shape: Sequence[int]

    @classmethod
    def of(cls, blob: Blob) -> StagedTensor:
        """The staged tensor a blob's metadata describes (``dtype`` and ``shape`` keys)."""
        meta = blob.metadata
        if "dtype" not in meta or "shape" not in meta:
            raise ValueError(f"{blob!r} has no dtype and shape in its metadata; stage it with "
                             "metadata={'dtype': 'F32', 'shape': [...]}, or pass "
                             "StagedTensor(blob, dtype, shape)")
        return cls(blob, meta["dtype"], tuple(meta["shape"]))


@dataclass
class TensorBytes:
    """One tensor, ready to lay out: what the header says, and the pieces that hold it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    pieces: list[Any] = field(default_factory=list)
    #: What must stay alive while ``pieces`` are written (the tensor or array).
    owner: Any = None
    #: ``(start, end)`` of the bytes in this process's memory, for the sharing check.
    address: tuple[int, int] | None = None

    @property
    def staged(self) -> bool:
        """Whether the bytes are placed from files, not written from memory."""
        return any(isinstance(p, (Blob, ExternalFile)) for p in self.pieces)


def tensor_bytes(name: str, value: Any, maps: list[str] | None = None) -> TensorBytes:
    """Describe one value of a tensors dict; see the module docstring for what it may be.

    ``maps`` is :func:`read_maps`'s snapshot, read once for many tensors.

    Raises
    ------
    TypeError
        For a value of another type.
    ValueError
        For a tensor ``save_file`` refuses (the message says what to do).
    """
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__name__} {name!r}")
    if isinstance(value, Blob):
        value = StagedTensor.of(value)
    if isinstance(value, StagedTensor):
        return _staged(name, value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch(name, value, torch, maps)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return _numpy(name, value, maps)
    raise TypeError(f"tensor {name!r}: expected a torch.Tensor, a numpy.ndarray, a "
                    f"StagedTensor or a Blob with dtype and shape metadata, got "
                    f"{type(value).__name__}")


def check_disjoint(items: Sequence[TensorBytes]) -> None:
    """Refuse tensors that share memory, as ``safetensors.torch.save_file`` does.

    Two names for overlapping bytes would be written twice and load as two
    tensors that no longer share.
    """
    spans = sorted((t.address[0], t.address[1], t.name) for t in items
                   if t.address is not None and t.address[1] > t.address[0])
    shared: list[set[str]] = []
    last_end, last_name = -1, None
    for start, end, name in spans:
        if start < last_end:
            if shared and last_name in shared[-1]:
                shared[-1].add(name)
            else:
                shared.append({last_name, name})
        if end > last_end:
            last_end, last_name = end, name
    if shared:
        groups = ", ".join("{" + ", ".join(sorted(g)) + "}" for g in shared)
        raise ValueError(f"some tensors share memory: {groups}; each would be written apart and "
                         "load as separate tensors. Save each shared block once (drop the "
                         "duplicate names and re-tie them after loading, as "
                         "safetensors.torch.save_model does), or .clone() the ones meant to "
                         "differ")


def _staged(name: str, value: StagedTensor) -> TensorBytes:
    blob = value.blob
    if blob.closed:
        raise ValueError(f"tensor {name!r}: its blob {blob!r} was released")
    code = dtype_code(value.dtype)
    shape = tuple(int(d) for d in value.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor {name!r}: negative dimension in shape {list(shape)}")
    n = nbytes_of(code, shape)
    if n != blob.size:
        raise ValueError(f"tensor {name!r}: a {code} tensor of shape {list(shape)} is {n} bytes, "
                         f"but its blob {blob.path} is {blob.size}")
    return TensorBytes(name, code, shape, n, [blob] if n else [], owner=blob)


def _torch(name: str, t: Any, torch: Any, maps: list[str] | None) -> TensorBytes:
    if t.layout != torch.strided:
        raise ValueError(f"tensor {name!r} is sparse ({t.layout}); save t.to_dense() instead "
                         "(it may be much larger on disk)")
    if t.device.type == "meta":
        raise ValueError(f"tensor {name!r} is on the meta device: it has no data to save")
    if not t.is_contiguous():
        raise ValueError(f"tensor {name!r} is not contiguous; save t.contiguous() (a packed "
                         "copy), or save the full tensor it views and slice after loading")
    if t.device.type != "cpu":
        t = t.to("cpu")  # as safetensors does: the bytes are written from host memory
    code = dtype_code(t.dtype)
    shape = tuple(t.shape)
    if code == "F4":
        # torch packs two F4 values per element; safetensors counts the values.
        if not shape:
            raise ValueError(f"tensor {name!r}: a 0-d float4_e2m1fn_x2 tensor has no "
                             "safetensors shape; reshape it to (1,)")
        shape = (*shape[:-1], shape[-1] * 2)
    n = t.numel() * t.element_size()
    return _memory(name, code, shape, n, t.data_ptr(), t, maps)


def _numpy(name: str, a: Any, maps: list[str] | None) -> TensorBytes:
    if a.dtype.hasobject:
        raise ValueError(f"array {name!r} holds Python objects ({a.dtype}): no bytes to save")
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        raise ValueError(f"array {name!r} is big-endian ({a.dtype}); safetensors is little-endian: "
                         "save a.astype(a.dtype.newbyteorder('<'))")
    if not a.flags.c_contiguous:
        raise ValueError(f"array {name!r} is not C-contiguous; save numpy.ascontiguousarray(a)")
    code = dtype_code(a.dtype)
    return _memory(name, code, tuple(int(d) for d in a.shape), int(a.nbytes),
                   int(a.__array_interface__["data"][0]), a, maps)


def _memory(name: str, code: str, shape: tuple[int, ...], n: int, address: int,
            owner: Any, maps: list[str] | None) -> TensorBytes:
    expected = nbytes_of(code, shape)
    if n != expected:  # pragma: no cover - a dtype table error, not a user's
        raise AssertionError(f"{name}: {n} bytes in memory, {expected} by dtype and shape")
    if sys.byteorder != "little":  # pragma: no cover - no big-endian machine here
        raise ValueError("safetensors is little-endian; this machine is big-endian")
    item = TensorBytes(name, code, shape, n, owner=owner, address=(address, address + n))
    if n:
        item.pieces = memory_pieces(address, n, maps)
    return item


def memory_pieces(address: int, n: int, maps: list[str] | None = None) -> list[Any]:
    """``n`` bytes of this process's memory at ``address``: file ranges or memory slices.

    Where the bytes are an unmodified private mapping of a file, and the io
    layer places file ranges, the piece is that range; otherwise slices of
    :data:`SLICE` bytes over the memory itself (no copy).
    """
    ranged = mapped_range(address, n, maps) if RANGES else None
    if ranged is not None:
        path, offset = ranged
        return [file_range(path, offset, n)]
    view = memoryview((ctypes.c_ubyte * n).from_address(address)).cast("B")
    return [view[i:i + SLICE] for i in range(0, n, SLICE)]


# -- file ranges --------------------------------------------------------------

#: Whether :class:`~trtet_store.io.ExternalFile` takes a range of a file
#: (``offset``): then mapped tensors are placed from their file.
RANGES = "offset" in getattr(ExternalFile, "__dataclass_fields__", {})


def file_range(path: os.PathLike | str, offset: int, size: int) -> ExternalFile:
    """``size`` bytes of ``path`` from ``offset``, as a piece (io without ranges: whole files)."""
    if RANGES:
        return ExternalFile.range(path, offset, size)
    path = Path(path).absolute()
    if offset != 0 or os.stat(path).st_size != size:
        raise ValueError(f"{path}: bytes {offset}..{offset + size} are a part of the file, and "
                         "this trtet_store's ExternalFile takes whole files only")
    return ExternalFile(path, size)


_PAGE = os.sysconf("SC_PAGE_SIZE")
_PM_PRESENT, _PM_SWAPPED, _PM_FILE = 1 << 63, 1 << 62, 1 << 61


def read_maps() -> list[str]:
    """This process's memory mappings (``/proc/self/maps``), one line each; [] if unreadable."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []


def mapped_range(address: int, n: int,
                 maps: list[str] | None = None) -> tuple[Path, int] | None:
    """``(file, offset)`` when memory ``[address, address+n)`` is a file's unmodified mapping.

    ``/proc/self/maps`` names the file and the offset; the file's name must
    still be that inode (a save over it replaces the name, not the mapping);
    and ``/proc/self/pagemap`` must show no page of the span copied on write
    (a private mapping written to holds its own bytes, not the file's). A
    page never touched reads the file; a touched, unmodified one is the
    file's page cache. Anything else, or anything unreadable, is None: the
    bytes are then read from memory, which is always right.
    """
    if maps is None:
        maps = read_maps()
    end = address + n
    for line in maps:
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if not lo <= address < hi:
            continue
        if end > hi or len(fields) < 6 or not fields[5].startswith("/"):
            return None  # spans mappings, or anonymous
        if fields[1][3] != "p" and fields[1][3] != "s":  # pragma: no cover
            return None
        path = Path(fields[5])
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        try:
            st = os.stat(path)
        except OSError:
            return None  # " (deleted)", or gone
        if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) != (major, minor,
                                                                     int(fields[4])):
            return None  # the name is another file now
        offset = int(fields[2], 16) + (address - lo)
        if offset + n > st.st_size or not _pages_unmodified(address, end):
            return None
        return path, offset
    return None


def _pages_unmodified(start: int, end: int) -> bool:
    """No page of ``[start, end)`` is an anonymous (copied-on-write or swapped) page."""
    first, last = start // _PAGE, (end - 1) // _PAGE
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        step = 1 << 16  # entries per read (512 KiB)
        for page in range(first, last + 1, step):
            count = min(step, last + 1 - page)
            raw = os.pread(fd, 8 * count, 8 * page)
            if len(raw) != 8 * count:
                return False
            for entry in memoryview(raw).cast("Q"):
                if entry & _PM_SWAPPED or (entry & _PM_PRESENT and not entry & _PM_FILE):
                    return False
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def describe_all(tensors: Mapping[str, Any]) -> list[TensorBytes]:
    """Every value of ``tensors`` described, and the sharing check done."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"expected a dict of name -> tensor, got {type(tensors).__name__}")
    maps = read_maps() if RANGES else None  # one snapshot for every tensor
    items = [tensor_bytes(name, value, maps) for name, value in tensors.items()]
    check_disjoint(items)
    return items
