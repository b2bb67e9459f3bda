"""The checksums a publish computes as bytes stream: CRC64NVME, MD5, xxh3 piece digests.

- CRC64NVME (awscrt's, the fast one botocore uses too): every part carries
  its own, and the full-object checksum (``ChecksumType=FULL_OBJECT``) is
  the parts' CRCs combined in order (:func:`combine`), so parts can be
  hashed on any thread and a resumed publish needs no second pass.
- MD5: an uploaded part's ETag on real servers, so a resume matches the
  parts ListParts reports against the bytes it would send.
- :class:`PieceDigester`: xxh3-128 of a piece and xxh3-64 of each chunk of
  it, the digests the storage engine seals a blob with; the manifest
  records them, and a piece is checked against its sealed ones as it passes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trtet_store.io import Digester

#: The span of each xxh3-64 chunk digest (the storage engine's default).
CHUNK_SIZE = 1 << 20


def crc64nvme(data: bytes | bytearray | memoryview, previous: int = 0) -> int:
    """CRC64NVME of ``data``, continuing ``previous`` (0 to start)."""
    from awscrt import checksums  # the s3 extra; loaded with the first publish

    return checksums.crc64nvme(data, previous)


def combine(first: int, second: int, second_length: int) -> int:
    """The CRC64NVME of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)``."""
    from awscrt import checksums

    return checksums.combine_crc64nvme(first, second, second_length)


def md5() -> Any:
    """A fresh MD5 hasher (for a part read a window at a time)."""
    return hashlib.md5(usedforsecurity=False)


def md5_hex(data: bytes | bytearray | memoryview) -> str:
    """MD5 of ``data``, hex: what S3 returns as an uploaded part's ETag."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class PieceDigester(Digester):
    """xxh3-128 of a stream and xxh3-64 of each :data:`CHUNK_SIZE` chunk of it:
    the storage engine's own digester, with its default chunk."""

    def __init__(self, chunk_size: int = CHUNK_SIZE) -> None:
        super().__init__(chunk_size)


def digest_bytes(data: bytes | bytearray | memoryview) -> tuple[str, tuple[int, ...]]:
    """:class:`PieceDigester` over ``data`` in one go."""
    d = PieceDigester()
    d.update(data)
    return d.finish()
