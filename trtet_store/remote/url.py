"""``s3://bucket/key`` destinations, parsed and refused early (before any request)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from trtet_store.remote.errors import RemoteURLError
from trtet_store.remote.manifest import MANIFEST_SUFFIX

# S3's bucket naming rules (3-63 of lowercase letters, digits, dots, hyphens),
# loosened to underscores and capitals, which some S3-compatible servers allow.
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,62}")


def _split(url: str, example: str, rest: str) -> tuple[str, str]:
    """``(bucket, what follows it)`` of an ``s3://`` URL, its scheme and bucket name checked."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str like 's3://bucket/{example}', "
                        f"not {type(url).__name__}")
    if not url.startswith("s3://"):
        raise RemoteURLError(f"{url!r}: expected s3://bucket/{rest}")
    bucket, _, after = url[len("s3://"):].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise RemoteURLError(f"{url!r}: {bucket!r} is not a bucket name")
    return bucket, after


@dataclass(frozen=True)
class RemoteURL:
    """An object's place: ``bucket`` and ``key`` (the program's key, e.g. ``models/m.pte``)."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> RemoteURL:
        """Parse ``s3://bucket/key``.

        Raises
        ------
        RemoteURLError
            Not ``s3://``, no bucket, a bad bucket name, no key, a key that
            ends in ``/`` (a folder, not a file), a key with ``.``/``..``
            segments or a NUL, or a key ending in ``.trtet.json`` (the name
            of a program's manifest, never of a program).
        """
        bucket, key = _split(url, "model.pte", "key")
        if not key or key.endswith("/"):
            raise RemoteURLError(f"{url!r}: name the program's object, e.g. "
                                 f"s3://{bucket}/{key or ''}model.pte")
        if "\0" in key or any(part in (".", "..", "") for part in key.split("/")):
            raise RemoteURLError(f"{url!r}: the key has an empty, '.' or '..' segment")
        if key.endswith(MANIFEST_SUFFIX):
            # Its manifest would be KEY.trtet.json.trtet.json, and a reader of the program
            # beside it would take this object for that program's manifest.
            program = key[:-len(MANIFEST_SUFFIX)]
            raise RemoteURLError(
                f"{url!r}: keys ending in {MANIFEST_SUFFIX} are the manifests trtet-store "
                f"writes beside each program; name the program's own key"
                + (f", e.g. s3://{bucket}/{program}" if program and not program.endswith("/")
                   else ""))
        return cls(bucket, key)

    @staticmethod
    def parse_prefix(url: str) -> tuple[str, str]:
        """``(bucket, prefix)`` of ``s3://bucket/prefix/``: a folder, not an object.

        The prefix ends in ``/`` (one or more trailing ``/`` are read as one,
        and none is added), or is empty for the bucket's root.

        Raises
        ------
        RemoteURLError
            Not ``s3://``, a bad bucket name, or a segment that is empty,
            ``.`` or ``..`` (or a NUL).
        """
        bucket, prefix = _split(url, "models/v3/", "prefix/")
        prefix = prefix.rstrip("/")
        if prefix and ("\0" in prefix or any(part in (".", "..", "")
                                             for part in prefix.split("/"))):
            raise RemoteURLError(f"{url!r}: the prefix has an empty, '.' or '..' segment")
        return bucket, f"{prefix}/" if prefix else ""

    @property
    def name(self) -> str:
        """The object's file name (the key's last segment)."""
        return posixpath.basename(self.key)

    def sibling(self, name: str) -> str:
        """The key of ``name`` beside this object (``models/m.pte`` -> ``models/<name>``)."""
        if not name or "/" in name or name in (".", ".."):
            raise RemoteURLError(f"{name!r} is not a plain file name")
        head = posixpath.dirname(self.key)
        return f"{head}/{name}" if head else name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"
