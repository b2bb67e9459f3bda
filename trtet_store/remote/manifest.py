"""The manifest: the small JSON object that commits a published program.

A publish writes every data object first (the ``.pte`` and each ``.ptd``),
then this manifest, last, beside the program: the program's key plus
``.trtet.json`` (``models/m.pte`` -> ``models/m.pte.trtet.json``, see
:func:`manifest_key`). The manifest is the commit point: a reader that starts
from it and reads each object with ``If-Match: <etag>`` never mixes versions,
and a data object that no manifest names is not a published program.

What it records, per object (:class:`ObjectEntry`):

- ``name``: the file name (``model.pte``, ``model.ptd``, as ``save_program``
  names them; never a path, never a control character: see
  :mod:`trtet_store.remote.filenames`), and ``key``: the object's full key in the bucket.
- ``size``, ``etag`` (as the server returned it, quotes stripped) and
  ``crc64nvme``: the full-object CRC64NVME, base64 of the 8 big-endian bytes,
  exactly the ``ChecksumCRC64NVME`` that HeadObject (``ChecksumMode=ENABLED``)
  returns for a ``FULL_OBJECT`` checksum.
- ``part_size`` and ``parts`` (:class:`PartEntry`): every multipart part's
  number, offset, size, ETag, CRC64NVME and ``md5`` (hex, or ``""`` where
  the publisher did not compute it: it does only to recognise a resumed
  part). All parts but the last have ``part_size`` bytes. On real servers an
  uploaded part's ETag is its MD5; a part copied server-side (UploadPartCopy)
  has an ETag that is not. A re-publish reads
  them; a reader can fetch part by part and check each CRC.
- ``pieces`` (:class:`PieceEntry`): the file as the storage engine laid it
  out, in order and tiling ``[0, size)`` without gaps: each piece's
  ``offset``, ``size``, ``kind`` (``"inline"``: header/flatbuffer bytes held
  in memory; ``"file"``: a staged blob or a file's range, e.g. a TensorRT
  engine), ``xxh3`` (xxh3-128 of its bytes, hex: what ``Blob.digest`` is) and
  ``chunks`` (xxh3-64 of each ``chunk_size`` bytes of the piece, the last
  chunk short: what ``Blob.chunk_digests`` and ``ExternalFile.chunk_digests``
  are, so a fetched piece can become a verified io piece chunk by chunk).

Signed (``publish(signing_key=...)``): each object also has ``sha256`` (of
the whole object) and each piece ``sha256`` (one per chunk, beside
``chunks``: every range a fetch downloads, resumes or reuses is checked by
them), taken in the pass that reads the bytes for the xxh3 and CRC; and the
top has ``signatures`` (:mod:`trtet_store.remote.signing`, over
:data:`SIGNATURE_DOMAIN`). Unsigned manifests carry none of them; readers
of an older version ignore them.

At the top: ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`; a
reader refuses another), ``program`` (the name of the first object, the
``.pte``), ``chunk_size`` (the span of each piece's ``chunks``) and
``objects``.

Example (one object, abridged)::

    {"format": "trtet-store-manifest", "version": 1, "program": "m.pte",
     "chunk_size": 1048576,
     "objects": [{"name": "m.pte", "key": "models/m.pte", "size": 12582912,
                  "etag": "5d41...-2", "crc64nvme": "AAAAAAAAAAA=",
                  "part_size": 8388608,
                  "parts": [{"number": 1, "offset": 0, "size": 8388608,
                             "etag": "...", "crc64nvme": "...", "md5": "..."}, ...],
                  "pieces": [{"offset": 0, "size": 4096, "kind": "inline",
                              "xxh3": "...", "chunks": [123...]}, ...]}]}

:meth:`Manifest.from_json` checks all of it (types, the tilings, the part
rule, the names) and raises :class:`~trtet_store.remote.errors.ManifestError`;
:meth:`Manifest.to_json` writes it in one canonical form (sorted keys, no
spaces), so equal manifests are equal bytes. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from trtet_store.remote.errors import FileNameError, ManifestError
from trtet_store.remote.filenames import plain_name_problem
from trtet_store.remote.jsondoc import MANIFEST_MAX_BYTES, loads

FORMAT = "trtet-store-manifest"
VERSION = 1
#: What a program manifest's signature covers starts with this.
SIGNATURE_DOMAIN = b"trtet-store/program-manifest-signature/1\n"
#: Appended to the program's key to name its manifest.
MANIFEST_SUFFIX = ".trtet.json"
#: S3's limits, which every manifest's parts satisfy.
MAX_PARTS = 10_000
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_SIZE = 5 * 1024 * 1024 * 1024

_HEX128 = re.compile(r"[0-9a-f]{32}")
_MD5 = re.compile(r"[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 hex digest (64 lower-case hex digits)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def manifest_key(program_key: str) -> str:
    """The manifest's key for the program published at ``program_key``."""
    return program_key + MANIFEST_SUFFIX


def program_key_of(key: str) -> str | None:
    """The program's key whose manifest is ``key`` (the inverse of :func:`manifest_key`).

    ``None`` when ``key`` is not a manifest's key.
    """
    if key.endswith(MANIFEST_SUFFIX) and len(key) > len(MANIFEST_SUFFIX) \
            and not key.endswith("/" + MANIFEST_SUFFIX):
        return key[:-len(MANIFEST_SUFFIX)]
    return None


def named_keys(data: bytes | str) -> frozenset[str]:
    """Every object key a manifest names, read leniently.

    Which keys a program owns must be known even from a manifest this
    version cannot fully read (a later format version, a damaged part list):
    a publish that cannot tell would otherwise overwrite them. Only
    ``objects[*].key`` is read.

    Raises
    ------
    ManifestError
        Not JSON, or no ``objects`` list of entries with a string ``key``.
    """
    doc = _parse(data)
    objects = doc.get("objects") if isinstance(doc, dict) else None
    if not isinstance(objects, list) or not all(
            isinstance(o, dict) and isinstance(o.get("key"), str) for o in objects):
        raise ManifestError("manifest has no list of objects with keys")
    return frozenset(o["key"] for o in objects)


def _parse(data: bytes | str) -> Any:
    """The one parse of a manifest's bytes: over :data:`MANIFEST_MAX_BYTES` or nested
    deeper than :data:`~trtet_store.remote.jsondoc.MAX_DEPTH` is a ManifestError."""
    if len(data) > MANIFEST_MAX_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes, more than the "
                            f"{MANIFEST_MAX_BYTES} a manifest may be")
    try:
        return loads(data, "manifest")
    except ValueError as exc:
        raise ManifestError(str(exc)) from None


def crc64nvme_b64(value: int) -> str:
    """A CRC64NVME as S3 writes it: base64 of its 8 big-endian bytes."""
    return base64.b64encode(value.to_bytes(8, "big")).decode("ascii")


def crc64nvme_int(text: str) -> int:
    """The inverse of :func:`crc64nvme_b64`; raises ValueError on anything else."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"not base64: {text!r}") from exc
    if len(raw) != 8:
        raise ValueError(f"a CRC64NVME is 8 bytes, {text!r} is {len(raw)}")
    return int.from_bytes(raw, "big")


def strip_etag(etag: str) -> str:
    """An ETag without its quotes (ListParts quotes them, UploadPartCopy does not)."""
    return etag.strip().strip('"')


@dataclass(frozen=True)
class PieceEntry:
    """One piece of an object, at its place (see the module docstring)."""

    offset: int
    size: int
    kind: str  # "inline" or "file"
    xxh3: str  # xxh3-128 of the piece, hex
    chunks: tuple[int, ...]  # xxh3-64 of each chunk_size bytes
    sha256: tuple[str, ...] | None = None  # sha256 hex of each chunk (signed manifests)

    def to_dict(self) -> dict[str, Any]:
        d = {"offset": self.offset, "size": self.size, "kind": self.kind,
             "xxh3": self.xxh3, "chunks": list(self.chunks)}
        if self.sha256 is not None:
            d["sha256"] = list(self.sha256)
        return d


@dataclass(frozen=True)
class PartEntry:
    """One multipart part of an object."""

    number: int  # 1-based
    offset: int
    size: int
    etag: str  # quotes stripped
    crc64nvme: str  # base64, 8 bytes
    md5: str  # hex of the part's bytes, or "" when not computed

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "offset": self.offset, "size": self.size,
                "etag": self.etag, "crc64nvme": self.crc64nvme, "md5": self.md5}


@dataclass(frozen=True)
class ObjectEntry:
    """One published object (the ``.pte`` or a ``.ptd``)."""

    name: str
    key: str
    size: int
    etag: str
    crc64nvme: str
    part_size: int
    parts: tuple[PartEntry, ...]
    pieces: tuple[PieceEntry, ...]
    sha256: str | None = None  # sha256 hex of the whole object (signed manifests)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "key": self.key, "size": self.size, "etag": self.etag,
             "crc64nvme": self.crc64nvme, "part_size": self.part_size,
             "parts": [p.to_dict() for p in self.parts],
             "pieces": [p.to_dict() for p in self.pieces]}
        if self.sha256 is not None:
            d["sha256"] = self.sha256
        return d

    @property
    def sha256_named(self) -> bool:
        """Whether the whole object and every chunk of every piece are named by sha256."""
        return self.sha256 is not None and all(p.sha256 is not None for p in self.pieces)

    def piece_at(self, offset: int) -> PieceEntry:
        """The piece holding byte ``offset``."""
        lo, hi = 0, len(self.pieces)
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.pieces[mid]
            if offset < p.offset:
                hi = mid
            elif offset >= p.offset + p.size:
                lo = mid + 1
            else:
                return p
        raise IndexError(f"{self.name}: no piece holds byte {offset}")


@dataclass(frozen=True)
class Manifest:
    """A published program: its objects, in order (the ``.pte`` first).

    Build it with the constructor (the publisher does) or
    :meth:`from_json`; both validate.
    """

    program: str
    chunk_size: int
    objects: tuple[ObjectEntry, ...]
    version: int = VERSION

    def __post_init__(self) -> None:
        _validate(self)

    def object(self, name: str) -> ObjectEntry:
        """The entry of the object named ``name`` (KeyError if none)."""
        for o in self.objects:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": self.version, "program": self.program,
                "chunk_size": self.chunk_size, "objects": [o.to_dict() for o in self.objects]}

    def to_json(self) -> bytes:
        """The canonical JSON bytes (UTF-8, sorted keys, no spaces, one trailing newline)."""
        return (json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
                + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        """Parse and validate a manifest.

        Raises
        ------
        ManifestError
            Not JSON, another format or version, a missing or mistyped field,
            pieces or parts that do not tile the object, parts that break
            S3's rules, a name that is a path, or two objects of one name.
        """
        return cls.from_dict(_parse(data))

    @classmethod
    def from_dict(cls, doc: Any) -> Manifest:
        """Validate a parsed manifest (see :meth:`from_json`)."""
        if not isinstance(doc, dict):
            raise ManifestError("manifest is not a JSON object")
        if doc.get("format") != FORMAT:
            raise ManifestError(f"not a trtet-store manifest (format {doc.get('format')!r})")
        version = doc.get("version")
        if version != VERSION:
            raise ManifestError(f"manifest version {version!r}; this trtet_store reads "
                                f"version {VERSION}: upgrade trtet_store")
        try:
            objects = tuple(_object(o) for o in _field(doc, "objects", list))
            return cls(program=_field(doc, "program", str),
                       chunk_size=_field(doc, "chunk_size", int), objects=objects,
                       version=version)
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from None


def _field(d: dict, name: str, typ: type) -> Any:
    if name not in d:
        raise ManifestError(f"manifest field {name!r} is missing")
    value = d[name]
    # bool is an int in Python; JSON's true is not a size
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ManifestError(f"manifest field {name!r} is {type(value).__name__}, "
                            f"expected {typ.__name__}")
    return value


def _piece(d: Any) -> PieceEntry:
    chunks = _field(d, "chunks", list)
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**64
               for c in chunks):
        raise ManifestError("a piece's chunk digests must be 64-bit unsigned integers")
    shas = d.get("sha256")
    if shas is not None and not (isinstance(shas, list) and all(is_sha256(h) for h in shas)):
        raise ManifestError("a piece's sha256 must be a list of sha256 hex digests")
    return PieceEntry(_field(d, "offset", int), _field(d, "size", int), _field(d, "kind", str),
                      _field(d, "xxh3", str), tuple(chunks),
                      tuple(shas) if shas is not None else None)


def _part(d: Any) -> PartEntry:
    return PartEntry(_field(d, "number", int), _field(d, "offset", int), _field(d, "size", int),
                     strip_etag(_field(d, "etag", str)), _field(d, "crc64nvme", str),
                     _field(d, "md5", str))


def _object(d: Any) -> ObjectEntry:
    if not isinstance(d, dict):
        raise ManifestError("an object entry is not a JSON object")
    return ObjectEntry(
        name=_field(d, "name", str), key=_field(d, "key", str), size=_field(d, "size", int),
        etag=strip_etag(_field(d, "etag", str)), crc64nvme=_field(d, "crc64nvme", str),
        part_size=_field(d, "part_size", int),
        parts=tuple(_part(p) for p in _field(d, "parts", list)),
        pieces=tuple(_piece(p) for p in _field(d, "pieces", list)),
        sha256=_sha256(d))


def _sha256(d: dict) -> str | None:
    value = d.get("sha256")
    if value is not None and not is_sha256(value):
        raise ManifestError(f"object {d.get('name')!r}: sha256 {value!r} is not a sha256 "
                            "hex digest")
    return value


def _validate(m: Manifest) -> None:
    if m.version != VERSION:
        raise ManifestError(f"manifest version {m.version!r}, expected {VERSION}")
    if m.chunk_size <= 0:
        raise ManifestError(f"chunk_size {m.chunk_size} must be positive")
    if not m.objects:
        raise ManifestError("a manifest names at least one object")
    if m.program != m.objects[0].name:
        raise ManifestError(f"program {m.program!r} is not the first object "
                            f"({m.objects[0].name!r})")
    names = [o.name for o in m.objects]
    if len(set(names)) != len(names):
        raise ManifestError(f"two objects share a name: {names}")
    for o in m.objects:
        _validate_object(o, m.chunk_size)


def _validate_object(o: ObjectEntry, chunk_size: int) -> None:
    what = f"object {o.name!r}"
    why = plain_name_problem(o.name)
    if why is not None:
        raise FileNameError(f"{what}: the name {why}", o.name)
    if not (o.key == o.name or o.key.endswith("/" + o.name)):
        raise ManifestError(f"{what}: key {o.key!r} does not end with its name")
    if o.size < 0:
        raise ManifestError(f"{what}: negative size {o.size}")
    if not o.etag:
        raise ManifestError(f"{what}: empty ETag")
    try:
        crc64nvme_int(o.crc64nvme)
    except ValueError as exc:
        raise ManifestError(f"{what}: crc64nvme {exc}") from None
    if not (MIN_PART_SIZE <= o.part_size <= MAX_PART_SIZE):
        raise ManifestError(f"{what}: part size {o.part_size} outside S3's "
                            f"[{MIN_PART_SIZE}, {MAX_PART_SIZE}]")
    if len(o.parts) > MAX_PARTS:
        raise ManifestError(f"{what}: {len(o.parts)} parts, S3 allows {MAX_PARTS}")
    expected_parts = max(1, -(-o.size // o.part_size))
    if len(o.parts) != expected_parts:
        raise ManifestError(f"{what}: {len(o.parts)} parts for {o.size} bytes in parts of "
                            f"{o.part_size}; expected {expected_parts}")
    pos = 0
    for i, p in enumerate(o.parts):
        last = i == len(o.parts) - 1
        want = o.size - pos if last else o.part_size
        if p.number != i + 1 or p.offset != pos or p.size != want:
            raise ManifestError(f"{what}: part {i + 1} is (number {p.number}, offset "
                                f"{p.offset}, size {p.size}); expected ({i + 1}, {pos}, {want})")
        if not p.etag:
            raise ManifestError(f"{what}: part {p.number} has an empty ETag")
        if p.md5 and not _MD5.fullmatch(p.md5):
            raise ManifestError(f"{what}: part {p.number} md5 {p.md5!r} is not 32 hex digits")
        try:
            crc64nvme_int(p.crc64nvme)
        except ValueError as exc:
            raise ManifestError(f"{what}: part {p.number} crc64nvme {exc}") from None
        pos += p.size
    pos = 0
    for i, piece in enumerate(o.pieces):
        if piece.offset != pos or piece.size < 0:
            raise ManifestError(f"{what}: piece {i} at {piece.offset} (size {piece.size}); "
                                f"expected it at {pos}: pieces must tile the object")
        if piece.kind not in ("inline", "file"):
            raise ManifestError(f"{what}: piece {i} kind {piece.kind!r}")
        if not _HEX128.fullmatch(piece.xxh3):
            raise ManifestError(f"{what}: piece {i} xxh3 {piece.xxh3!r} is not 32 hex digits")
        if len(piece.chunks) != -(-piece.size // chunk_size):
            raise ManifestError(f"{what}: piece {i} has {len(piece.chunks)} chunk digests for "
                                f"{piece.size} bytes in chunks of {chunk_size}")
        if piece.sha256 is not None and len(piece.sha256) != len(piece.chunks):
            raise ManifestError(f"{what}: piece {i} has {len(piece.sha256)} chunk sha256 for "
                                f"{len(piece.chunks)} chunks")
        pos += piece.size
    if pos != o.size:
        raise ManifestError(f"{what}: pieces cover {pos} bytes of {o.size}")
