"""An entry's pointer (``<key>.json``) as :class:`RemoteEntry`, attempt ids, names and digests.

The pointer is the commit point of an entry: a small JSON object written
last, conditionally, naming the attempt directory that holds the files and
each file's size and xxh3-128 digest, and, in a signed pointer, its sha256:
a signature vouches for the bytes through the sha256 (xxh3 is not a
cryptographic digest; it stays for the download's own checks). Nothing here
talks to the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import Digests, file_identity, is_sha256, read_digests
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.jsondoc import loads
from trtet_store.remote.manifest import MANIFEST_SUFFIX
from trtet_store.remote.upload.source import check_regular_file

__all__ = ["FORMAT", "DamagedPointer", "RemoteEntry", "TierEntryError", "attempt_id", "check_key",
           "check_origin", "default_origin", "file_digest", "file_digests", "parse_files"]

#: The pointer's format tag; another one is not read.
FORMAT = "trtet-store/cache-entry/1"

# Keys, origins and file names become one segment of an S3 key each: no "/", no
# leading dot (".", "..", hidden names), printable ASCII only, so that a listing
# with delimiter "/" tells pointers, leases and attempt directories apart.
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")

#: The chunk span a file is digested with (the whole file's xxh3-128 does not depend on it).
_READ = 1 << 20


class TierEntryError(RemoteError):
    """An entry whose files fail their checks (damaged or tampered): never served.

    Attributes
    ----------
    key : str
        The entry's key.
    name : str or None
        The file that failed (None when the entry as a whole did: its manifest).
    """

    def __init__(self, message: str, key: str, name: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.name = name


def _check_segment(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__} ({value!r})")
    if not _SEGMENT.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not usable as one segment of an S3 key: use 1 "
                         "to 200 of letters, digits, '.', '_', '-', not starting with '.' "
                         "or '-'")
    return value


def check_key(key: Any) -> str:
    """``key`` if it can name an entry, else a ValueError (TypeError) saying what is allowed."""
    _check_segment("key", key)
    if key.endswith(MANIFEST_SUFFIX):
        raise ValueError(f"key {key!r} ends in {MANIFEST_SUFFIX}, the suffix of manifests")
    return key


def check_origin(origin: Any) -> str:
    """``origin`` if it can start an attempt directory's name, else a ValueError (TypeError)."""
    return _check_segment("origin", origin)


def default_origin() -> str:
    """The default origin: this host's name, made one key segment."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip(".-") or "host"
    return name[:100]


def file_digest(path: os.PathLike | str) -> tuple[int, str]:
    """``(size, xxh3-128 hex)`` of the file at ``path`` (:func:`trtet_store.io.digest_file`)."""
    got = file_digests(path)
    return got.size, got.digest


def file_digests(path: os.PathLike | str, *, sha256: bool = False) -> Digests:
    """:class:`~trtet_store.io.Digests` of the file at ``path``, read once (1 MiB chunks).

    With the identity of the file as it was opened and read (None when it
    changed meanwhile); ``sha256=True``: with its sha256, from the same pass.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = file_identity(os.fstat(fd))
        got = read_digests(fd, _READ, sha256=sha256)
        after = file_identity(os.fstat(fd))
    finally:
        os.close(fd)
    return Digests(got.digest, got.size, _READ, got.chunk_digests,
                   after if after == before else None, got.sha256)


def parse_files(files: Any) -> list[tuple[str, Path, str | None, str | None]]:
    """``[(name, path, digest or None, sha256 or None)]`` from the caller's files.

    Each is ``(name, path)``, ``(name, path, xxh3-128)`` or ``(name, path,
    xxh3-128, sha256)``: digests a layer that read the bytes already hands on.

    Raises
    ------
    TypeError, ValueError
        Not a sequence of pairs/triples, an empty one, a bad or repeated name.
    FileNotFoundError, NotARegularFileError
        A path with no file, or not a regular file (never opened).
    """
    if isinstance(files, (str, bytes, os.PathLike)) or not isinstance(files, Sequence):
        raise TypeError(f"files must be a sequence of (name, path) pairs, not {files!r}")
    if not files:
        raise ValueError("files is empty: an entry holds at least one file")
    out: list[tuple[str, Path, str | None, str | None]] = []
    for item in files:
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3, 4):
            raise TypeError(f"each file is (name, path), (name, path, digest) or (name, path, "
                            f"digest, sha256), not {item!r}")
        name = _check_segment("file name", item[0])
        if name.endswith(MANIFEST_SUFFIX):
            raise ValueError(f"file name {name!r} ends in {MANIFEST_SUFFIX}, the suffix of "
                             "manifests")
        path = Path(item[1])
        check_regular_file(path)
        digest = item[2] if len(item) >= 3 else None
        if digest is not None and not (isinstance(digest, str)
                                       and re.fullmatch(r"[0-9a-f]{32}", digest)):
            raise ValueError(f"{name}: digest {digest!r} is not an xxh3-128 hex digest")
        sha = item[3] if len(item) == 4 else None
        if sha is not None and (digest is None or not is_sha256(sha)):
            raise ValueError(f"{name}: sha256 {sha!r} is not a sha256 hex digest given with "
                             "the file's xxh3-128")
        out.append((name, path, digest, sha))
    names = [n for n, _, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"two files have one name: {names}")
    return out


def attempt_id(origin: str, files: Sequence[dict[str, Any]]) -> str:
    """``<origin>-<digest16>``: first 16 hex of sha256 over the files' (name, size, digest)."""
    canon = json.dumps([[f["name"], f["size"], f["digest"]] for f in files],
                       separators=(",", ":"))
    return f"{origin}-{hashlib.sha256(canon.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class DamagedPointer:
    """A pointer that cannot be read: too large, not JSON, nested too deep, malformed.

    Never served; listed as damaged; the next publish of its key replaces it
    (``If-Match`` its ETag, so only this version).

    Attributes
    ----------
    key, etag : str
    size : int
        The pointer object's size in bytes.
    reason : str
        Why it cannot be read.
    """

    key: str
    etag: str
    size: int
    reason: str


@dataclass
class RemoteEntry:
    """A parsed pointer: an entry committed to the shared tier.

    Attributes
    ----------
    key : str
        The entry's key.
    etag : str
        The pointer object's ETag (what a replacement or a delete is pinned to).
    created : float
        When it was published (the publisher's clock, seconds since the epoch).
    origin, host : str
        Who published it.
    attempt : str
        The directory of its files, relative to the tier's prefix (``<key>/<attempt>/``).
    files : list of dict
        ``{"name", "size", "digest"}`` in publish order (digest: xxh3-128 hex),
        and ``"sha256"`` (hex) in a signed pointer.
    metadata : dict
        The caller's, opaque here.
    signature : dict, list of dict, or None
        ``{"key": <key id>, "ed25519": <base64>}`` over :meth:`record` (see
        :mod:`.signing`), or a list of such (several signers), as read: None
        when the pointer has none. Checked by the tier only when it has
        trusted keys.
    """

    key: str
    etag: str
    created: float
    origin: str
    host: str
    attempt: str
    files: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    signature: Any = None

    def signatures(self) -> list[Any]:
        """The pointer's signatures as a list (one signer's dict, a list of them, or none)."""
        if self.signature is None:
            return []
        return list(self.signature) if isinstance(self.signature, list) else [self.signature]

    @property
    def size(self) -> int:
        """The sum of its files' sizes."""
        return sum(int(f["size"]) for f in self.files)

    def record(self) -> dict[str, Any]:
        """The pointer's fields without its signature: what a signature covers."""
        return {"format": FORMAT, "key": self.key, "created": self.created,
                "origin": self.origin, "host": self.host, "attempt": self.attempt,
                "files": self.files, "metadata": self.metadata}

    def to_json(self) -> bytes:
        """The pointer's bytes (the ETag is the server's, not part of them)."""
        doc = self.record()
        if self.signature is not None:
            doc["signature"] = self.signature
        return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, etag: str, key: str | None = None) -> RemoteEntry:
        """Parse a pointer read with ``etag``; ``key``: the key it must name.

        Raises
        ------
        ValueError
            Not JSON (or nested too deep), another format, a missing or mistyped field, another
            key, or an attempt directory outside the key's.
        """
        doc = loads(data, "the pointer")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"not a cache-entry pointer (format {got!r}, expected {FORMAT!r})")
        want = {"key": str, "created": (int, float), "origin": str, "host": str,
                "attempt": str, "files": list, "metadata": dict}
        for name, typ in want.items():
            if not isinstance(doc.get(name), typ) or isinstance(doc.get(name), bool):
                raise ValueError(f"the pointer's {name!r} is missing or not a "
                                 f"{getattr(typ, '__name__', 'number')}")
        if key is not None and doc["key"] != key:
            raise ValueError(f"the pointer names key {doc['key']!r}, not {key!r}")
        check_key(doc["key"])
        parts = doc["attempt"].split("/")
        if len(parts) != 3 or parts[0] != doc["key"] or parts[2] != "" \
                or not _SEGMENT.fullmatch(parts[1]):
            raise ValueError(f"the pointer's attempt {doc['attempt']!r} is not "
                             f"'{doc['key']}/<attempt>/'")
        files = []
        for f in doc["files"]:
            if not (isinstance(f, dict) and isinstance(f.get("name"), str)
                    and _SEGMENT.fullmatch(f["name"])
                    and isinstance(f.get("size"), int) and not isinstance(f["size"], bool)
                    and f["size"] >= 0 and isinstance(f.get("digest"), str)):
                raise ValueError(f"the pointer's file {f!r} is not "
                                 "{'name', 'size', 'digest'}")
            one = {"name": f["name"], "size": f["size"], "digest": f["digest"]}
            if "sha256" in f:
                if not is_sha256(f["sha256"]):
                    raise ValueError(f"the pointer's file {f['name']!r} has sha256 "
                                     f"{str(f['sha256'])[:80]!r}, not a sha256 hex digest")
                one["sha256"] = f["sha256"]
            files.append(one)
        if not files or len({f["name"] for f in files}) != len(files):
            raise ValueError("the pointer names no file, or one name twice")
        return cls(doc["key"], etag, float(doc["created"]), doc["origin"], doc["host"],
                   doc["attempt"], files, doc["metadata"], doc.get("signature"))
