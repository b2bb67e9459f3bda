"""Content digests the tests compare sources and outputs by (xxh3-128, as the store)."""

from __future__ import annotations

import os

import xxhash


def digest(data: bytes | bytearray | memoryview) -> str:
    """The xxh3-128 hex digest of ``data``."""
    return xxhash.xxh3_128_hexdigest(data)


def file_digest(path: os.PathLike | str) -> str:
    """The xxh3-128 hex digest of a file's content, read in 8 MiB pieces."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()
