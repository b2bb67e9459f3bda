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

This is the one place that builds CRC functions (a fetch's CRC32C and CRC32
for plain objects too: :func:`crc_functions`). awscrt is the ``s3`` extra:
it is imported on the first CRC, never with this module, and its absence
says how to install it.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

from trtet_store.io import Digester, MiB

#: The span of each xxh3-64 chunk digest (the storage engine's default).
CHUNK_SIZE = MiB


def _crt() -> Any:
    """awscrt's ``checksums``, or an ImportError that says how to install it."""
    try:
        from awscrt import checksums
    except ImportError as exc:
        raise ImportError(f"CRC checksums need awscrt ({exc}): install trtet-store[s3] "
                          "(pip install 'trtet-store[s3]')") from exc
    return checksums


def crc64nvme(data: bytes | bytearray | memoryview, previous: int = 0) -> int:
    """CRC64NVME of ``data``, continuing ``previous`` (0 to start)."""
    return _crt().crc64nvme(data, previous)


def combine(first: int, second: int, second_length: int) -> int:
    """The CRC64NVME of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)``."""
    return _crt().combine_crc64nvme(first, second, second_length)


#: The full-object checksums S3 reports that a fetch can check, by their lower-case names.
ALGORITHMS = ("crc64nvme", "crc32c", "crc32")


def crc_functions(algorithm: str) -> tuple[Callable[..., int], Callable[[int, int, int], int]]:
    """``(compute(data, previous=0), combine(crc_a, crc_b, len_b))`` for ``algorithm``.

    Parameters
    ----------
    algorithm : {"crc64nvme", "crc32c", "crc32"}
        As S3 names a full-object checksum (``ChecksumCRC64NVME``...), lower case.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"no CRC named {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    c = _crt()
    return {"crc64nvme": (c.crc64nvme, c.combine_crc64nvme),
            "crc32c": (c.crc32c, c.combine_crc32c),
            "crc32": (c.crc32, c.combine_crc32)}[algorithm]


def b64_to_int(text: str) -> int:
    """A checksum as S3 writes it (base64 of its big-endian bytes) as an int."""
    return int.from_bytes(base64.b64decode(text), "big")


def int_to_b64(value: int, algorithm: str) -> str:
    """The inverse of :func:`b64_to_int` for ``algorithm``'s width (8 bytes or 4)."""
    width = 8 if algorithm == "crc64nvme" else 4
    return base64.b64encode(value.to_bytes(width, "big")).decode()


def md5() -> Any:
    """A fresh MD5 hasher (for a part read a window at a time)."""
    return hashlib.md5(usedforsecurity=False)


def md5_hex(data: bytes | bytearray | memoryview) -> str:
    """MD5 of ``data``, hex: what S3 returns as an uploaded part's ETag."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class PieceDigester(Digester):
    """xxh3-128 of a stream and xxh3-64 of each :data:`CHUNK_SIZE` chunk of it:
    the storage engine's own digester, with its default chunk.

    ``chunk_sha256=True``: the sha256 of each chunk too, from the same
    buffers (:meth:`chunk_sha256`): what a signed manifest names each chunk
    by, so a range fetched, resumed or reused alone is checked by it.
    """

    def __init__(self, chunk_size: int = CHUNK_SIZE, *, chunk_sha256: bool = False) -> None:
        super().__init__(chunk_size)
        self._cshas: list[str] | None = [] if chunk_sha256 else None
        self._csha = hashlib.sha256() if chunk_sha256 else None
        self._csha_fill = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        super().update(data)
        if self._csha is None:
            return
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.chunk_size - self._csha_fill)
            self._csha.update(view[:take])
            self._csha_fill += take
            view = view[take:]
            if self._csha_fill == self.chunk_size:
                self._cshas.append(self._csha.hexdigest())
                self._csha, self._csha_fill = hashlib.sha256(), 0

    def finish(self) -> tuple[str, tuple[int, ...]]:
        if self._csha is not None and self._csha_fill:
            self._cshas.append(self._csha.hexdigest())
            self._csha, self._csha_fill = hashlib.sha256(), 0
        return super().finish()

    def chunk_sha256(self) -> tuple[str, ...] | None:
        """The sha256 hex of each chunk (after :meth:`finish`), or None unless asked for."""
        return tuple(self._cshas) if self._cshas is not None else None
