"""remote/download/describe.py ``_plain``: a plain object is verified only by a FULL_OBJECT
checksum.

A plain object (no manifest) is described by its HEAD. Its checksum is used to verify
the bytes only when it is of the whole object (``ChecksumType`` FULL_OBJECT): a
multipart upload's COMPOSITE checksum (a checksum of the parts' checksums, ``...-2``)
is not the bytes' CRC, so the fetch places the bytes and says they are unverified
(``report.verified`` False, with the reason), rather than failing every time on a
mismatch that is no damage. Real SeaweedFS; the object is a real 2-part upload.
"""

from __future__ import annotations

import base64
import os
import zlib

import pytest

from trtet_store.remote.download.receive import fetch

MiB = 1 << 20


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_describe_plain_does_not_verify_by_a_composite_checksum(s3, here_fs):
    key = "plain/blob.bin"
    parts = [os.urandom(5 * MiB), os.urandom(MiB + 3)]
    up = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key, ChecksumAlgorithm="CRC32",
                                           ChecksumType="COMPOSITE")["UploadId"]
    done = []
    for n, body in enumerate(parts, 1):
        r = s3.client.upload_part(Bucket=s3.bucket, Key=key, UploadId=up, PartNumber=n,
                                  Body=body, ChecksumAlgorithm="CRC32",
                                  ChecksumCRC32=_crc32(body))
        done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": _crc32(body)})
    s3.client.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up,
                                        MultipartUpload={"Parts": done})
    head = s3.client.head_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
    crc = head.get("ChecksumCRC32")
    if not crc or head.get("ChecksumType", "COMPOSITE") != "COMPOSITE":
        pytest.skip(f"the server gives no composite checksum here: {crc!r}, "
                    f"{head.get('ChecksumType')!r}")
    data = b"".join(parts)
    assert crc != _crc32(data)  # the premise: not the bytes' CRC
    report = fetch(f"s3://{s3.bucket}/{key}", here_fs / "blob.bin", client=s3.client)
    assert (here_fs / "blob.bin").read_bytes() == data
    assert not report.verified
    assert "composite multipart checksum" in report.unverified_reason


@pytest.mark.parametrize("algorithm", ["CRC32C", "CRC32", "CRC64NVME"])
def test_describe_plain_verifies_by_each_full_object_checksum(s3, here_fs, algorithm):
    """A single PUT's checksum is of the whole object: each algorithm _plain knows verifies."""
    key = f"plain/{algorithm}.bin"
    data = os.urandom(2 * MiB + 5)
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=data, ChecksumAlgorithm=algorithm)
    head = s3.client.head_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
    if not head.get(f"Checksum{algorithm}"):
        pytest.skip(f"the server keeps no {algorithm} here")
    report = fetch(f"s3://{s3.bucket}/{key}", here_fs / "got.bin", client=s3.client)
    assert (here_fs / "got.bin").read_bytes() == data
    assert report.verified and report.unverified_reason is None, report
