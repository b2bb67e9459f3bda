"""The set manifest: the one small JSON object that commits a release of many programs.

A set lives under one prefix (``s3://models/llm/v3/``):

- ``<prefix>blobs/<xxh3-128 hex>``: each distinct file once, named by the
  xxh3-128 of its bytes, published as a one-object program by
  :func:`~trtet_store.remote.upload.send.publish_sources` (so it has its own
  ``<hex>.trtet.json`` beside it: parts, CRC64NVME, chunk digests, which
  ``fetch`` follows to download it).
- ``<prefix>trtet-set.json`` (:data:`SET_KEY`): this manifest, written last
  (``If-None-Match: *`` for a new set, ``If-Match`` of the version read on
  a replace). It is the commit point: a blob no committed manifest names is
  not part of the set.

What it records (canonical JSON, sorted keys)::

    {"format": "trtet-store-set", "version": 1, "chunk_size": 1048576,
     "blobs": {"<hex>": {"size": 123, "etag": "...", "crc64nvme": "..."}},
     "members": {"sm89": {"metadata": {"compute_capability": "8.9", ...},
                          "files": [{"name": "model.pte", "blob": "<hex>",
                                     "size": 123, "crc64nvme": "...",
                                     "chunks": [...]}, ...]}},
     "removing": {"<hex>": "<etag>"}}

``removing`` lists the blobs the replaced version named and this one does
not, with the ETag they had: the publish that commits this manifest removes
them right after; one killed before its clean-up leaves the list here, and
the next publish of the set finishes it.

Each member's files are in runtime order (the ``.pte`` first, its ``.ptd``
files beside it under their own names); ``chunks`` are the xxh3-64 of each
``chunk_size`` bytes of the file, so a placed file is checked chunk by chunk
against the release (whatever the local store holds). Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from trtet_store.remote.errors import FileNameError, ManifestError
from trtet_store.remote.filenames import name_problem, plain_name_problem
from trtet_store.remote.jsondoc import loads

FORMAT = "trtet-store-set"
VERSION = 1
#: The manifest's key under the set's prefix.
SET_KEY = "trtet-set.json"
#: Where the blobs live under the set's prefix.
BLOBS = "blobs/"
#: A set manifest names many members; bigger than a program's manifest may be, and still
#: read whole: 16 MiB holds thousands of members (a member of a few files with a chunk
#: digest per MiB is a few KiB). A bigger one is refused before its body is read.
SET_MAX_BYTES = 16 * 1024 * 1024
#: What a member's program file is named with (its ``.ptd`` files: ``DATA_SUFFIX``).
PROGRAM_SUFFIX = ".pte"

_HEX128 = re.compile(r"[0-9a-f]{32}")
#: What a member's metadata may say (others are kept, unread: a later writer's).
METADATA_KEYS = ("compute_capability", "tensorrt", "executorch", "version_compatible",
                   "hardware_compatibility")


def blob_key(prefix: str, digest: str) -> str:
    """The key of the blob ``digest`` under the set's ``prefix`` (ends in ``/`` or is empty)."""
    return f"{prefix}{BLOBS}{digest}"


@dataclass(frozen=True)
class BlobEntry:
    """One distinct file in the bucket: its size, and the version the set was committed with."""

    size: int
    etag: str
    crc64nvme: str

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "etag": self.etag, "crc64nvme": self.crc64nvme}


@dataclass(frozen=True)
class FileEntry:
    """One file of a member, under the runtime's name."""

    name: str
    blob: str  # xxh3-128 hex of the file's bytes
    size: int
    crc64nvme: str
    chunks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "blob": self.blob, "size": self.size,
                "crc64nvme": self.crc64nvme, "chunks": list(self.chunks)}


@dataclass(frozen=True)
class MemberEntry:
    """One program of the set: its files (the ``.pte`` first) and what it needs to run."""

    files: tuple[FileEntry, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"files": [f.to_dict() for f in self.files], "metadata": dict(self.metadata)}

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class SetManifest:
    """A committed set: its members and the distinct blobs they name."""

    members: dict[str, MemberEntry]
    blobs: dict[str, BlobEntry]
    chunk_size: int
    version: int = VERSION
    #: Blobs of the replaced version to remove after this commit, with their ETags.
    removing: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)

    def to_json(self) -> bytes:
        """The canonical JSON bytes (sorted keys, no spaces, one trailing newline)."""
        doc = {"format": FORMAT, "version": self.version, "chunk_size": self.chunk_size,
               "blobs": {k: b.to_dict() for k, b in self.blobs.items()},
               "members": {k: m.to_dict() for k, m in self.members.items()},
               "removing": dict(self.removing)}
        return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> SetManifest:
        """Parse and validate.

        Raises
        ------
        ManifestError
            Not JSON, another format or version, a missing or mistyped field,
            a file naming a blob the manifest does not list (or of another
            size), a member name or file name no program may have.
        """
        if len(data) > SET_MAX_BYTES:
            raise ManifestError(f"set manifest is {len(data)} bytes, more than "
                                f"{SET_MAX_BYTES}")
        try:
            doc = loads(data, "set manifest")
        except ValueError as exc:
            raise ManifestError(str(exc)) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestError("not a trtet-store set manifest (format "
                                f"{doc.get('format') if isinstance(doc, dict) else None!r})")
        if doc.get("version") != VERSION:
            raise ManifestError(f"set manifest version {doc.get('version')!r}; this "
                                f"trtet_store reads version {VERSION}: upgrade trtet_store")
        try:
            blobs = {k: BlobEntry(_int(b, "size"), _str(b, "etag"), _str(b, "crc64nvme"))
                     for k, b in _dict(doc, "blobs").items()}
            members = {}
            for name, m in _dict(doc, "members").items():
                files = tuple(FileEntry(_str(f, "name"), _str(f, "blob"), _int(f, "size"),
                                        _str(f, "crc64nvme"), tuple(_chunks(f)))
                              for f in _list(m, "files"))
                members[name] = MemberEntry(files, dict(_dict(m, "metadata")))
            removing = doc.get("removing", {})
            if not isinstance(removing, dict) or not all(
                    isinstance(v, str) for v in removing.values()):
                raise ManifestError("set manifest field 'removing' is not a map of ETags")
            return cls(members, blobs, _int(doc, "chunk_size"), removing=dict(removing))
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"set manifest is malformed: {exc}") from None


def _get(d: Any, name: str, typ: type) -> Any:
    if not isinstance(d, dict) or name not in d:
        raise ManifestError(f"set manifest field {name!r} is missing")
    value = d[name]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ManifestError(f"set manifest field {name!r} is {type(value).__name__}, "
                            f"expected {typ.__name__}")
    return value


def _int(d: Any, name: str) -> int:
    return _get(d, name, int)


def _str(d: Any, name: str) -> str:
    return _get(d, name, str)


def _dict(d: Any, name: str) -> dict:
    return _get(d, name, dict)


def _list(d: Any, name: str) -> list:
    return _get(d, name, list)


def _chunks(f: Any) -> list[int]:
    chunks = _list(f, "chunks")
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**64
               for c in chunks):
        raise ManifestError("a file's chunk digests must be 64-bit unsigned integers")
    return chunks


def member_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a member (a plain, showable name), or None."""
    why = plain_name_problem(name)
    if why is None and isinstance(name, str) and name.startswith("."):
        why = "starts with a dot"
    return why


def member_file_problem(name: object, *, program: bool) -> str | None:
    """Why ``name`` cannot be a set member's file, or None when it can.

    The closed set a member's files are held to, by ``publish_set`` before
    anything is read or sent and by ``fetch_set`` as soon as the manifest is
    read (and by the member record's clean-up): the program is a plain
    ``<name>.pte`` (no leading dot, no path, none of trtet_store's own names);
    every other file a plain ``<tag>.ptd`` name (:func:`name_problem`). So a
    manifest can never have a fetch write ``.bashrc``, ``authorized_keys`` or
    ``../x.ptd``, nor place a ``.ptd`` under the program's name.
    """
    why = name_problem(name, program=program)
    if why is None and program and isinstance(name, str):
        if name.startswith("."):
            why = "starts with a dot (a hidden file, never a program)"
        elif not name.endswith(PROGRAM_SUFFIX) or name == PROGRAM_SUFFIX:
            why = f"is not a {PROGRAM_SUFFIX} name"
    return why


def check_member_files(names: list[str] | tuple[str, ...], where: str) -> None:
    """Refuse a member whose file names (the program first) are not in the closed set.

    Raises
    ------
    FileNameError
        One line: the first name outside the set, quoted, and what a member's
        files may be named.
    """
    if not names:
        raise FileNameError(f"{where} has no files", "")
    for i, name in enumerate(names):
        why = member_file_problem(name, program=i == 0)
        if why is not None:
            what = "the program's name" if i == 0 else "a file name"
            raise FileNameError(
                f"{where}: {what} {name!r} {why}; a set member's files are one plain "
                f"<name>{PROGRAM_SUFFIX} and plain <tag>.ptd names (no leading dot, no path, "
                "no control character)", name if isinstance(name, str) else "")
    if len(set(names)) != len(names):
        raise FileNameError(f"{where} names a file twice: {list(names)!r}",
                            next(n for n in names if list(names).count(n) > 1))


def _validate(m: SetManifest) -> None:
    if m.chunk_size <= 0:
        raise ManifestError(f"chunk_size {m.chunk_size} must be positive")
    if not m.members:
        raise ManifestError("a set names at least one member")
    for digest, b in m.blobs.items():
        if not _HEX128.fullmatch(digest):
            raise ManifestError(f"blob name {digest!r} is not an xxh3-128 hex digest")
        if b.size < 0 or not b.etag:
            raise ManifestError(f"blob {digest}: size {b.size}, etag {b.etag!r}")
    named = set()
    for name, member in m.members.items():
        why = member_name_problem(name)
        if why is not None:
            raise ManifestError(f"member name {name!r} {why}")
        if not member.files:
            raise ManifestError(f"member {name!r} has no files")
        # The runtime's names: a plain <name>.pte, then plain .ptd names: never a path,
        # a dotfile or one of trtet_store's own (the same rule publish_set applies).
        check_member_files([f.name for f in member.files], f"set member {name!r}")
        for f in member.files:
            b = m.blobs.get(f.blob)
            if b is None or b.size != f.size:
                raise ManifestError(f"member {name!r}: {f.name} names blob {f.blob} "
                                    f"({f.size} bytes), which the set does not list as such")
            if len(f.chunks) != -(-f.size // m.chunk_size):
                raise ManifestError(f"member {name!r}: {f.name} has {len(f.chunks)} chunk "
                                    f"digests for {f.size} bytes")
            named.add(f.blob)
    for digest in m.removing:
        if not _HEX128.fullmatch(digest) or digest in m.blobs:
            raise ManifestError(f"blob {digest!r} to remove is no blob name, or one the set "
                                "names")
    unnamed = set(m.blobs) - named
    if unnamed:
        raise ManifestError(f"the set lists blobs no member names: {sorted(unnamed)[:3]}")
