"""check_neighbours(): refuse a write that would replace a ``.ptd`` another program needs.

ExecuTorch names a ``.ptd`` by its tag, not by its program: two programs
exported with the same tag (``cpu.ptd``, say) each write a ``cpu.ptd``, and
the second one written into a directory replaces the first one's data. The
first ``.pte`` then fails to load (error 0x20), or worse, loads other weights
under the same names. :func:`check_neighbours` is asked before such a write
(``save_program``, ``save``, ``write_tensor_data``, ``compile_and_save``,
``fetch``) and refuses it, before anything is written, when a ``.ptd`` to be
written exists and another ``.pte`` of that directory needs it.

What a ``.pte`` needs is what :meth:`Inspection.wanted_keys` and the
verifier's external-data check (``verify._external_data``) read: its external
tensors (emitter external constants, by fully qualified name), and the keys
its delegate blobs name (a TensorRT ``engine_key``, XNNPACK's weight keys;
looked for verbatim in the first :data:`DELEGATE_SCAN_LIMIT` bytes of each
delegate blob, as the verifier does), less the keys the ``.pte`` holds
itself. A ``.pte`` needs a ``.ptd`` that holds one of those keys.

This module reads the flatbuffers itself, with ``struct``, through the
fields of ``executorch/schema/program.fbs`` and ``flat_tensor.fbs`` it
needs: it imports neither torch nor executorch (``inspect_file`` does,
through ExecuTorch's deserializers, which costs seconds and hundreds of MiB
in a ``fetch``). It reads headers, the flatbuffer regions and delegate blob
heads; never a payload.

A neighbour that cannot be read (not a program, truncated, no permission)
is taken to need every ``.ptd`` of its directory, and the refusal says that
it could not be read and why: refusing a write costs a rename, replacing
data a program needs costs the program.

Neighbours are opened without following a link and without blocking
(:func:`open_neighbour`): in a directory others can write to, a link planted at
a ``.pte``/``.ptd`` name, or a FIFO (whose open would wait forever for a
writer), is a file that cannot be read, under the rule above.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trtet_store.inspector.common import (
    HEAD_BYTES,
    PTD_HEADER_MAGIC,
    PTD_IDENTIFIER,
    PTE_HEADER_MAGIC,
    PTE_IDENTIFIER,
    u32,
    u64,
)
from trtet_store.io.errors import NeededByAnotherError

#: Bytes of each delegate blob searched for the keys it names (as the verifier's
#: ``DELEGATE_SCAN_LIMIT``: XNNPACK's flatbuffer and TensorRT's metadata come first).
DELEGATE_SCAN_LIMIT = 16 << 20

#: Program flatbuffers larger than this are not read whole (an inline delegate
#: of GiBs): the neighbour is then treated as unreadable, conservatively.
FLATBUFFER_READ_LIMIT = 1 << 30

# Field indices (declaration order) of the schema tables read here.
_PROGRAM_EXECUTION_PLAN, _PROGRAM_INLINE_DATA, _PROGRAM_SEGMENTS, _PROGRAM_NAMED_DATA = 1, 3, 4, 7
_PLAN_VALUES, _PLAN_DELEGATES = 2, 7
_EVALUE_TYPE, _EVALUE_VAL = 0, 1
_KERNEL_TYPES_TENSOR = 5  # union KernelTypes: NONE, Null, Int, Bool, Double, Tensor, ...
_TENSOR_EXTRA_INFO = 9
_EXTRA_FQN, _EXTRA_LOCATION = 1, 2
_LOCATION_EXTERNAL = 1  # TensorDataLocation.EXTERNAL
_DELEGATE_PROCESSED = 1
_REF_LOCATION, _REF_INDEX = 0, 1
_DATA_INLINE, _DATA_SEGMENT = 0, 1  # DataLocation
_FLAT_TENSOR_NAMED_DATA = 2
_NAMED_DATA_KEY = 0


class _Unreadable(Exception):
    """A file this module cannot read as a program or tensor data file; says why."""


class _Table:
    """One flatbuffer table in ``buf`` at ``pos``: just the accessors needed here."""

    __slots__ = ("buf", "pos", "vtable", "vsize")

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self.vsize:
            return None
        off = struct.unpack_from("<H", self.buf, self.vtable + slot)[0]
        return self.pos + off if off else None

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._field(index)
        return default if at is None else struct.unpack_from("<" + fmt, self.buf, at)[0]

    def _target(self, index: int) -> int | None:
        at = self._field(index)
        return None if at is None else at + u32(self.buf, at)

    def table(self, index: int) -> _Table | None:
        at = self._target(index)
        return None if at is None else _Table(self.buf, at)

    def string(self, index: int) -> bytes | None:
        at = self._target(index)
        if at is None:
            return None
        n = u32(self.buf, at)
        if at + 4 + n > len(self.buf):
            raise _Unreadable(f"a string runs past the flatbuffer ({len(self.buf)} bytes)")
        return self.buf[at + 4: at + 4 + n]

    def bytes_vector(self, index: int) -> bytes:
        return self.string(index) or b""  # [ubyte] is laid out as a string is

    def tables(self, index: int) -> list[_Table]:
        at = self._target(index)
        if at is None:
            return []
        n = u32(self.buf, at)
        if at + 4 + 4 * n > len(self.buf):
            raise _Unreadable(f"a vector runs past the flatbuffer ({len(self.buf)} bytes)")
        out = []
        for i in range(n):
            e = at + 4 + 4 * i
            out.append(_Table(self.buf, e + u32(self.buf, e)))
        return out


def open_neighbour(path: os.PathLike | str):
    """Open a neighbour for reading: never through a link, never blocking on a FIFO.

    Raises
    ------
    OSError
        It is a symbolic link (``ELOOP``), not a regular file, or cannot be
        opened; its message says which (callers treat it as unreadable).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (not followed)",
                          os.fspath(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file", os.fspath(path))
    return os.fdopen(fd, "rb")


def _root(buf: bytes) -> _Table:
    return _Table(buf, u32(buf, 0))


@dataclass
class ProgramNeeds:
    """What one ``.pte`` reads from ``.ptd`` files, as far as this module reads it.

    Attributes
    ----------
    path : pathlib.Path
        The ``.pte``.
    external_tensors : set of str
        Fully qualified names of tensors it expects in a ``.ptd``.
    delegate_heads : list of bytes
        The first :data:`DELEGATE_SCAN_LIMIT` bytes of each delegate blob, where
        a delegate names the keys it loads.
    own_keys : set of str
        The named-data keys the ``.pte`` holds itself (never looked for outside).
    unreadable : str or None
        Why the file could not be read; then it is taken to need every ``.ptd``.
    """

    path: Path
    external_tensors: set[str] = field(default_factory=set)
    delegate_heads: list[bytes] = field(default_factory=list)
    own_keys: set[str] = field(default_factory=set)
    unreadable: str | None = None

    def needed_of(self, keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` this program reads from outside itself, sorted."""
        out = []
        for key in keys:
            if key in self.own_keys:
                continue
            if key in self.external_tensors or any(key.encode() in h
                                                   for h in self.delegate_heads):
                out.append(key)
        return sorted(out)


def read_program_needs(path: os.PathLike | str) -> ProgramNeeds:
    """What the ``.pte`` at ``path`` reads from ``.ptd`` files; never raises for a bad file.

    A file that cannot be read or parsed comes back with ``unreadable`` set.
    """
    needs = ProgramNeeds(Path(path))
    try:
        _read_program(needs)
    except (_Unreadable, OSError, struct.error, IndexError, UnicodeDecodeError,
            OverflowError) as exc:
        needs.unreadable = (str(exc) if isinstance(exc, _Unreadable)
                            else f"{type(exc).__name__}: {exc}")
    return needs


def _read_program(needs: ProgramNeeds) -> None:
    with open_neighbour(needs.path) as f:
        size = os.fstat(f.fileno()).st_size
        head = os.pread(f.fileno(), HEAD_BYTES, 0)
        if len(head) < 8 or head[4:8] != PTE_IDENTIFIER:
            raise _Unreadable(f"not an ExecuTorch program (bytes 4..8 are {head[4:8]!r}, "
                              f"not {PTE_IDENTIFIER!r})")
        program_size, base = size, 0
        if head[8:12] == PTE_HEADER_MAGIC and len(head) >= 32:
            program_size, base = u64(head, 16), u64(head, 24)
        if not 8 <= program_size <= min(size, FLATBUFFER_READ_LIMIT):
            raise _Unreadable(f"program flatbuffer of {program_size} bytes in a file of {size}")
        buf = os.pread(f.fileno(), program_size, 0)
        if len(buf) != program_size:
            raise _Unreadable("the file is shorter than its header says")
        program = _root(buf)
        needs.own_keys = {(nd.string(_NAMED_DATA_KEY) or b"").decode()
                          for nd in program.tables(_PROGRAM_NAMED_DATA)}
        segments = [(s.scalar(0, "Q"), s.scalar(1, "Q"))
                    for s in program.tables(_PROGRAM_SEGMENTS)]
        inline = program.tables(_PROGRAM_INLINE_DATA)
        for plan in program.tables(_PROGRAM_EXECUTION_PLAN):
            for value in plan.tables(_PLAN_VALUES):
                if value.scalar(_EVALUE_TYPE, "B") != _KERNEL_TYPES_TENSOR:
                    continue
                tensor = value.table(_EVALUE_VAL)
                info = tensor.table(_TENSOR_EXTRA_INFO) if tensor is not None else None
                if info is not None and info.scalar(_EXTRA_LOCATION, "b") == _LOCATION_EXTERNAL:
                    name = info.string(_EXTRA_FQN)
                    if name:
                        needs.external_tensors.add(name.decode())
            for delegate in plan.tables(_PLAN_DELEGATES):
                ref = delegate.table(_DELEGATE_PROCESSED)
                if ref is None:
                    continue
                where, index = ref.scalar(_REF_LOCATION, "b"), ref.scalar(_REF_INDEX, "I")
                if where == _DATA_SEGMENT and index < len(segments):
                    offset, length = segments[index]
                    needs.delegate_heads.append(os.pread(
                        f.fileno(), min(length, DELEGATE_SCAN_LIMIT), base + offset))
                elif where == _DATA_INLINE and index < len(inline):
                    needs.delegate_heads.append(
                        inline[index].bytes_vector(0)[:DELEGATE_SCAN_LIMIT])
                else:
                    raise _Unreadable(f"delegate data {index} (location {where}) is out of range")


def read_ptd_keys(path: os.PathLike | str) -> set[str]:
    """The named-data keys of the ``.ptd`` at ``path``.

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is not a ``.ptd`` this module can read (the message says why).
    """
    with open_neighbour(path) as f:
        head = os.pread(f.fileno(), HEAD_BYTES, 0)
        if len(head) < 32 or head[4:8] != PTD_IDENTIFIER or head[8:12] != PTD_HEADER_MAGIC:
            raise ValueError(f"not an ExecuTorch tensor data file (no {PTD_IDENTIFIER!r} "
                             f"{PTD_HEADER_MAGIC!r} header)")
        end = u64(head, 16) + u64(head, 24)
        if end > min(os.fstat(f.fileno()).st_size, FLATBUFFER_READ_LIMIT):
            raise ValueError(f"its flatbuffer would end at byte {end}, past the file")
        buf = os.pread(f.fileno(), end, 0)
    try:
        return {(nd.string(_NAMED_DATA_KEY) or b"").decode()
                for nd in _root(buf).tables(_FLAT_TENSOR_NAMED_DATA)}
    except (_Unreadable, struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"its flatbuffer does not parse ({exc})") from None


def _same_file(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def check_neighbours(directory: os.PathLike | str, writing: Iterable[str], *,
                     program: os.PathLike | str | None,
                     replace_needed: bool = False) -> None:
    """Refuse writing ``.ptd`` files into ``directory`` that another program there needs.

    Call it before anything is written. For each name in ``writing`` whose
    file exists in ``directory``, every other ``.pte`` of ``directory`` is
    read (headers, flatbuffer, delegate heads; no torch, no executorch);
    if one of them needs a key that file holds, the write is refused.

    Parameters
    ----------
    directory : path-like
        Where the ``.ptd`` files are to be written.
    writing : iterable of str
        Their basenames (``cpu.ptd``).
    program : path-like or None
        The ``.pte`` being written with them (a basename is taken in
        ``directory``): it is replaced as well, so what it needs now does not
        count. None when no ``.pte`` is written (``write_tensor_data``): then
        every ``.pte`` of the directory counts, the program's own earlier
        ``.pte`` too, as nothing tells it from another.
    replace_needed : bool
        Replace them anyway (the opt-in: the other program will then load
        this data, or fail to load).

    Raises
    ------
    NeededByAnotherError
        A ``.ptd`` to be written exists and another ``.pte`` needs it (or
        cannot be read, and so is taken to need it). It names the file, each
        ``.pte`` that needs it and what to do.
    """
    if replace_needed:
        return
    directory = Path(directory)
    own = None
    if program is not None:
        own = Path(program)
        if not own.is_absolute() and own.parent == Path("."):
            own = directory / own
    existing = []
    for name in dict.fromkeys(writing):
        target = directory / name
        if target.is_file():  # a missing one replaces nothing; a directory is the writer's
            existing.append(target)
    if not existing:
        return
    others = [p for p in sorted(directory.glob("*.pte"))
              if p.is_file() and (own is None or not _same_file(p, own))]
    if not others:
        return
    needs = [read_program_needs(p) for p in others]
    for target in existing:
        try:
            keys: set[str] | None = read_ptd_keys(target)
            unreadable_ptd = None
        except (OSError, ValueError) as exc:
            keys, unreadable_ptd = None, str(exc)
        by: list[tuple[Path, str]] = []
        for n in needs:
            if n.unreadable is not None:
                by.append((n.path, f"{n.path.name} could not be read ({n.unreadable}), so it "
                                   f"is taken to need it"))
            elif keys is None:
                if n.external_tensors or n.delegate_heads:
                    by.append((n.path, f"{target.name} could not be read ({unreadable_ptd}) "
                                       f"and {n.path.name} reads data from outside itself, "
                                       "so it is taken to need it"))
            else:
                wanted = n.needed_of(keys)
                if wanted:
                    # Digest keys (XNNPACK's 64 digits, TensorRT's <digest>_trt_engine):
                    # head and tail tell them apart and keep the kind visible.
                    shown = ", ".join(repr(k if len(k) <= 28 else f"{k[:12]}...{k[-12:]}")
                                      for k in wanted[:3])
                    more = f" and {len(wanted) - 3} more" if len(wanted) > 3 else ""
                    by.append((n.path, f"{n.path.name} loads {shown}{more} from it"))
        if by:
            raise NeededByAnotherError(target, [p for p, _ in by], [w for _, w in by],
                                       writer=own)


def trt_engine_key(head: bytes) -> str | None:
    """The ``engine_key`` of a TensorRT delegate blob whose engine is named data, else None.

    Read as the inspector reads it (the blob header, then its metadata); a
    blob that is not TensorRT's, or holds its engine inline, names none. Here
    (not in ``fetch``) because the remote layer reaches the tooling through
    this one module only.
    """
    from trtet_store.export import trt_blob  # pure struct/json, no torch
    from trtet_store.inspector.trt_metadata import check_metadata

    try:
        h = trt_blob.BlobHeader.from_bytes(head)
    except (ValueError, struct.error, IndexError):
        return None
    if h.engine_size or h.metadata_offset + h.metadata_size > len(head):
        return None
    meta, _, _ = check_metadata(head[h.metadata_offset:h.metadata_offset + h.metadata_size],
                                h.magic)
    key = (meta or {}).get("engine_key")
    return key if isinstance(key, str) and key else None


__all__ = ["NeededByAnotherError", "ProgramNeeds", "check_neighbours", "read_program_needs",
           "read_ptd_keys", "trt_engine_key"]
