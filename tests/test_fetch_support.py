"""Helpers for the fetch tests (no tests here): objects and manifests put with plain boto3.

``put_program`` uploads files with a full-object CRC64NVME (single PUT) and
writes a manifest for them, pieces as given, exactly in the format
``publish`` writes (:class:`trtet_store.remote.manifest.Manifest`), so that
fetch's own tests do not depend on the publisher; the round trip uses the
real ``publish``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import xxhash
from awscrt.checksums import crc64nvme

from trtet_store.remote.manifest import (
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    manifest_key,
)

MiB = 1 << 20
CHUNK = MiB


def b64crc(data: bytes) -> str:
    return base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()


def piece_entries(data: bytes, sizes: Sequence[int]) -> tuple[PieceEntry, ...]:
    """Pieces of ``data`` of the given sizes (the last takes the rest)."""
    out, pos = [], 0
    sizes = list(sizes)
    for i, n in enumerate(sizes):
        n = len(data) - pos if i == len(sizes) - 1 else n
        piece = data[pos:pos + n]
        chunks = tuple(xxhash.xxh3_64_intdigest(piece[k:k + CHUNK])
                       for k in range(0, len(piece), CHUNK))
        out.append(PieceEntry(pos, n, "file" if n >= MiB else "inline",
                              xxhash.xxh3_128_hexdigest(piece), chunks))
        pos += n
    return tuple(out)


def put_program(client, bucket: str, prefix: str, files: dict[str, tuple[bytes, Sequence[int]]],
                *, manifest: bool = True) -> Manifest | None:
    """Upload ``{name: (bytes, piece sizes)}`` under ``prefix/`` and, last, their manifest.

    The first name is the program. Returns the manifest written.
    """
    entries = []
    for name, (data, sizes) in files.items():
        key = f"{prefix}/{name}"
        resp = client.put_object(Bucket=bucket, Key=key, Body=data,
                                 ChecksumAlgorithm="CRC64NVME")
        etag = resp["ETag"].strip('"')
        part_size = max(5 * MiB, len(data))
        md5 = hashlib.md5(data).hexdigest()  # noqa: S324 - S3's part ETag
        entries.append(ObjectEntry(name, key, len(data), etag, b64crc(data), part_size,
                                   (PartEntry(1, 0, len(data), md5, b64crc(data), md5),),
                                   piece_entries(data, sizes)))
    if not manifest:
        return None
    m = Manifest(program=entries[0].name, chunk_size=CHUNK, objects=tuple(entries))
    client.put_object(Bucket=bucket, Key=manifest_key(entries[0].key), Body=m.to_json())
    return m


def engine_program(seed: int, engines: Sequence[int], header: int = 12345) -> tuple[bytes, list]:
    """A program-like file: a header, then page-aligned 'engines' of random bytes.

    Returns the bytes and the piece sizes (header + padding, engine, padding, ...).
    """
    rnd = __import__("random").Random(seed)
    parts, sizes = [], []
    head = rnd.randbytes(header)
    pad = -len(head) % 4096
    parts += [head, b"\0" * pad]
    sizes += [len(head) + pad]
    for i, n in enumerate(engines):
        eng = engine_bytes(seed * 100 + i, n)
        parts.append(eng)
        sizes.append(n)
        tail = -n % 4096
        if tail:
            parts.append(b"\0" * tail)
            sizes.append(tail)
    return b"".join(parts), sizes


def engine_bytes(seed: int, n: int) -> bytes:
    return __import__("random").Random(seed).randbytes(n)


def files_digest(paths: Sequence[os.PathLike | str]) -> dict[str, str]:
    return {Path(p).name: xxhash.xxh3_128_hexdigest(Path(p).read_bytes()) for p in paths}


def assert_nothing_under(s3, prefix: str) -> None:
    """No object and no unfinished upload under ``prefix``. (Here, not in test_publish.py,
    which imports the TensorRT stub: a module importing it from there is marked executorch
    and runs in both lanes.)"""
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    assert [o["Key"] for o in listed] == []
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []
