"""The TensorRT delegate blob: header and metadata, as Torch-TensorRT's C++ backend reads them.

Little-endian header ``<4sIIIQ8s``: magic (``TR01``, ``TR02`` with aliased
I/O), metadata offset (32), metadata size, engine offset (16-aligned), engine
size, reserved (0x01 then zeros). Metadata is compact JSON whose key order the
C++ parser depends on: the two arrays first, scalars after them, and
``engine_key`` last. With ``engine_key`` set the engine is not in the blob
(engine size 0) but in named data under that key.

Both readers (torch-tensorrt 2.14.0's ``deserialize_engine`` and its C++
backend) accept any 16-aligned engine offset past the metadata. Torch-TensorRT
itself pads to 16; :func:`prefix` pads to a page when asked, so that an engine
in a page-aligned segment starts on a page of the file (what clone and insert
placements need).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from trtet_store.io.units import round_up

MAGIC = b"TR01"
MAGIC_ALIASED_IO = b"TR02"
HEADER_FORMAT = "<4sIIIQ8s"
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)
RESERVED = b"\x01" + b"\x00" * 7
ENGINE_ALIGNMENT = 16
#: Ends the processed bytes of a delegate whose engine is a staged file; the
#: serializer replaces it by the file (see ``trtet_store.export.tensorrt``). It can
#: never be read as a blob: the header's engine size counts the file's bytes.
STAGED_ENGINE_MARKER = b"\0trtet:staged-engine:"


@dataclass(frozen=True)
class IOBinding:
    """One engine input or output, in delegate-argument order."""

    name: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    is_input: bool = True


@dataclass(frozen=True)
class BlobMetadata:
    """What the runtime needs besides the engine bytes."""

    io_bindings: tuple[IOBinding, ...] = ()
    aliased_io: tuple[tuple[str, str, str], ...] = ()  # (output, input, kind)
    hardware_compatible: bool = False
    device_id: int = 0
    serialized_metadata: str = ""
    target_platform: str = ""
    engine_key: str | None = None

    def to_json(self) -> bytes:
        data = {
            "io_bindings": [
                {"name": b.name, "dtype": b.dtype, "shape": list(b.shape), "is_input": b.is_input}
                for b in self.io_bindings
            ],
            "aliased_io": [{"output": o, "input": i, "kind": k} for o, i, k in self.aliased_io],
            "hardware_compatible": self.hardware_compatible,
            "device_id": self.device_id,
            "serialized_metadata": self.serialized_metadata,
            "target_platform": self.target_platform,
        }
        if self.engine_key is not None:
            data["engine_key"] = self.engine_key
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BlobMetadata:
        d = json.loads(raw)
        return cls(
            io_bindings=tuple(IOBinding(b["name"], b.get("dtype", ""), tuple(b.get("shape", ())),
                                        b.get("is_input", True))
                              for b in d.get("io_bindings", [])),
            aliased_io=tuple((a["output"], a["input"], a.get("kind", "kv_cache_update"))
                             for a in d.get("aliased_io", [])),
            hardware_compatible=d.get("hardware_compatible", False),
            device_id=d.get("device_id", 0),
            serialized_metadata=d.get("serialized_metadata", ""),
            target_platform=d.get("target_platform", ""),
            engine_key=d.get("engine_key"),
        )


@dataclass(frozen=True)
class BlobHeader:
    """The fixed 32-byte header."""

    magic: bytes
    metadata_offset: int
    metadata_size: int
    engine_offset: int
    engine_size: int
    reserved: bytes = field(default=RESERVED)

    def to_bytes(self) -> bytes:
        return struct.pack(HEADER_FORMAT, self.magic, self.metadata_offset, self.metadata_size,
                           self.engine_offset, self.engine_size, self.reserved)

    @classmethod
    def from_bytes(cls, raw: bytes) -> BlobHeader:
        if len(raw) < HEADER_SIZE:
            raise ValueError(f"TensorRT blob of {len(raw)} bytes is shorter than its header")
        h = cls(*struct.unpack(HEADER_FORMAT, raw[:HEADER_SIZE]))
        if h.magic not in (MAGIC, MAGIC_ALIASED_IO):
            raise ValueError(f"not a TensorRT delegate blob: magic {h.magic!r}")
        if h.engine_offset % ENGINE_ALIGNMENT:
            raise ValueError(f"engine offset {h.engine_offset} is not 16-byte aligned")
        if h.metadata_offset < HEADER_SIZE or h.metadata_offset + h.metadata_size > h.engine_offset:
            raise ValueError("metadata overlaps the header or the engine")
        return h


def prefix(metadata: BlobMetadata, engine_size: int, *,
           alignment: int = ENGINE_ALIGNMENT) -> bytes:
    """Everything of the delegate blob before the engine: header, metadata, zero padding.

    Parameters
    ----------
    metadata : BlobMetadata
        Serialized as compact JSON right after the header.
    engine_size : int
        Recorded in the header; the engine's bytes follow the prefix.
    alignment : int
        The engine offset is the metadata's end rounded up to this, a multiple
        of 16. 16 gives exactly the bytes of torch-tensorrt's
        ``serialize_engine``; 4096 puts the engine on a page of a page-aligned
        segment.

    Raises
    ------
    ValueError
        If ``alignment`` is not a positive multiple of 16, or ``engine_size`` is negative.
    """
    if alignment <= 0 or alignment % ENGINE_ALIGNMENT:
        raise ValueError(f"engine alignment must be a positive multiple of "
                         f"{ENGINE_ALIGNMENT}, got {alignment}")
    if engine_size < 0:
        raise ValueError(f"engine size must not be negative, got {engine_size}")
    meta = metadata.to_json()
    engine_offset = round_up(HEADER_SIZE + len(meta), alignment)
    header = BlobHeader(MAGIC_ALIASED_IO if metadata.aliased_io else MAGIC, HEADER_SIZE,
                        len(meta), engine_offset, engine_size)
    return header.to_bytes() + meta + b"\0" * (engine_offset - HEADER_SIZE - len(meta))


def encode(metadata: BlobMetadata, engine: bytes = b"", *,
           alignment: int = ENGINE_ALIGNMENT) -> bytes:
    """The whole delegate blob: :func:`prefix`, then ``engine`` (may be empty)."""
    return prefix(metadata, len(engine), alignment=alignment) + engine


def decode(blob: bytes) -> tuple[BlobHeader, BlobMetadata, bytes]:
    """Header, metadata and the engine bytes in the blob (empty when it names an engine key)."""
    h = BlobHeader.from_bytes(blob)
    if h.engine_offset + h.engine_size > len(blob):
        raise ValueError("engine extends past the end of the blob")
    meta = BlobMetadata.from_json(blob[h.metadata_offset:h.metadata_offset + h.metadata_size])
    return h, meta, blob[h.engine_offset:h.engine_offset + h.engine_size]
