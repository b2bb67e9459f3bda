"""The one boto3 user of the publisher: the S3 calls it makes, with errors made plain.

:class:`S3` wraps one botocore client (found the way boto3 finds one:
``AWS_*`` variables, profiles, ``AWS_ENDPOINT_URL``; path-style addressing
when an endpoint is given) and exposes exactly the calls a publish needs:
create, upload_part, copy_part, list_parts, complete (conditional), abort,
list_uploads, head, get, put (conditional). Each answers with plain values;
ETags come back without quotes (ListParts quotes them, UploadPartCopy does
not).

Errors: a missing bucket is :class:`BucketNotFoundError`; refused
credentials or signatures are :class:`AccessDeniedError`; a refused
precondition is :class:`PreconditionFailed`; a refused checksum is
:class:`BadDigest`; an upload that is gone is :class:`NoSuchUpload`; a
network failure that botocore's own retries did not get through is
:class:`Transient`. The last four are signals for :mod:`.publish`, which
decides what they mean.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    RemoteError,
)
from trtet_store.remote.manifest import strip_etag

log = logging.getLogger("trtet_store.remote")

_DENIED = {"AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidToken",
           "ExpiredToken", "AllAccessDisabled", "403", "Forbidden"}


class PreconditionFailed(RemoteError):  # noqa: N818 - the server's name for it
    """The server refused an ``If-Match``/``If-None-Match``/``CopySourceIfMatch`` (412)."""


class BadDigest(RemoteError):  # noqa: N818 - the server's name for it
    """The server refused a checksum: the bytes it received are not the ones we hashed."""


class NoSuchUpload(RemoteError):  # noqa: N818 - the server's name for it
    """The multipart upload is gone (completed, aborted, or expired)."""


class Transient(RemoteError):  # noqa: N818 - a signal, not a verdict
    """A connection, timeout or server error that botocore's retries did not get through."""


class Unreachable(Transient, EndpointUnreachableError):  # noqa: N818 - a signal, like Transient
    """No connection to the endpoint at all (botocore's ``EndpointConnectionError``)."""


@dataclass(frozen=True)
class ObjectHead:
    """What HeadObject says about an object."""

    size: int
    etag: str
    crc64nvme: str | None
    checksum_type: str | None


@dataclass(frozen=True)
class OpenUpload:
    """An unfinished multipart upload."""

    key: str
    upload_id: str
    initiated: Any  # datetime


def _code(exc: Exception) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    err = response.get("Error", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(err.get("Code", "")), int(status or 0)


class S3:
    """One client, the calls a publish makes.

    Parameters
    ----------
    endpoint_url : str, optional
        The server (MinIO, Ceph, R2, SeaweedFS...). Default: what boto3 finds
        (``AWS_ENDPOINT_URL``, the profile, or AWS).
    max_connections : int
        The client's connection pool: at least the parts in flight.
    retries : int
        botocore's attempts per call (standard mode) before a network error
        is raised as :class:`Transient`.
    """

    def __init__(self, endpoint_url: str | None = None, *, max_connections: int = 10,
                 retries: int = 5, connect_timeout: float = 10, read_timeout: float = 120) -> None:
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = {
            "max_pool_connections": max_connections,
            "retries": {"mode": "standard", "total_max_attempts": retries},
            "connect_timeout": connect_timeout, "read_timeout": read_timeout,
            # We send each part's CRC64NVME ourselves; botocore would hash the body again.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        if endpoint_url is not None:
            options["s3"] = {"addressing_style": "path"}
        session = boto3.session.Session()
        self.client = session.client("s3", endpoint_url=endpoint_url, config=Config(**options))
        self.endpoint_url = self.client.meta.endpoint_url

    # --- errors --------------------------------------------------------------------

    def _call(self, what: str, bucket: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            EndpointConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )

        try:
            return fn(**kwargs)
        except ClientError as exc:
            code, status = _code(exc)
            if code in ("NoSuchBucket",):
                raise BucketNotFoundError(f"bucket {bucket!r} does not exist at "
                                          f"{self.endpoint_url} ({what})") from None
            if code in _DENIED or status == 403:
                raise AccessDeniedError(f"{what} in bucket {bucket!r} at {self.endpoint_url} "
                                        f"was refused: {code or status} (check the "
                                        "credentials and their permissions)") from None
            if code in ("PreconditionFailed", "412") or status == 412:
                raise PreconditionFailed(f"{what}: precondition failed") from None
            if code in ("BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
                        "XAmzContentSHA256Mismatch"):
                raise BadDigest(f"{what}: {code}") from None
            if code == "NoSuchUpload":
                raise NoSuchUpload(f"{what}: the upload is gone") from None
            if status >= 500 or code in ("RequestTimeout", "SlowDown", "InternalError"):
                raise Transient(f"{what}: {code or status}") from exc
            raise
        except NoCredentialsError:
            raise AccessDeniedError("no AWS credentials found (AWS_ACCESS_KEY_ID/"
                                    "AWS_SECRET_ACCESS_KEY, a profile, or an instance "
                                    "role)") from None
        except EndpointConnectionError as exc:
            # Every attempt failed to connect: say where, not "a network blip". Still a
            # Transient, so a publish whose server went away mid-upload keeps its upload.
            err = EndpointUnreachableError.from_botocore(exc, what)
            raise Unreachable(str(err), err.address) from exc
        except (ConnectionError, HTTPClientError) as exc:
            raise Transient(f"{what}: {exc}") from exc
        except BotoCoreError as exc:
            if "Connection" in type(exc).__name__ or "Timeout" in type(exc).__name__:
                raise Transient(f"{what}: {exc}") from exc
            raise

    # --- buckets and objects ---------------------------------------------------------

    def check_bucket(self, bucket: str) -> None:
        """Raise :class:`BucketNotFoundError` or :class:`AccessDeniedError` unless usable."""
        from botocore.exceptions import ClientError

        try:
            self._call("HeadBucket", bucket, self.client.head_bucket, Bucket=bucket)
        except ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in ("404", "NotFound"):
                raise BucketNotFoundError(f"bucket {bucket!r} does not exist at "
                                          f"{self.endpoint_url}") from None
            raise

    def head(self, bucket: str, key: str) -> ObjectHead | None:
        """HeadObject with its checksum (``ChecksumMode=ENABLED``); None if there is none."""
        from botocore.exceptions import ClientError

        try:
            r = self._call("HeadObject", bucket, self.client.head_object, Bucket=bucket,
                           Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return ObjectHead(int(r["ContentLength"]), strip_etag(r["ETag"]),
                          r.get("ChecksumCRC64NVME"), r.get("ChecksumType"))

    def get(self, bucket: str, key: str, if_match: str | None = None,
            limit: int = 256 << 20) -> tuple[bytes, str] | None:
        """The whole of a small object and its ETag; None if there is none."""
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if if_match:
            kwargs["IfMatch"] = if_match
        try:
            r = self._call("GetObject", bucket, self.client.get_object, **kwargs)
        except ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in ("404", "NoSuchKey"):
                return None
            raise
        if int(r["ContentLength"]) > limit:
            r["Body"].close()
            raise RemoteError(f"s3://{bucket}/{key} is {r['ContentLength']} bytes; "
                              f"expected a small object")
        return r["Body"].read(), strip_etag(r["ETag"])

    def put(self, bucket: str, key: str, body: bytes, crc64nvme: str, *,
            if_none_match: bool = False, if_match: str | None = None,
            content_type: str = "application/json") -> str:
        """PutObject with its CRC64NVME, conditional; returns the ETag."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": body,
                                  "ChecksumCRC64NVME": crc64nvme, "ContentType": content_type}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        r = self._call("PutObject", bucket, self.client.put_object, **kwargs)
        return strip_etag(r["ETag"])

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        """DeleteObject; with ``if_match``, only that version (else :class:`PreconditionFailed`).

        A key already gone is not an error; any other refusal is a :class:`RemoteError`
        (a server without conditional deletes answers one, and nothing is deleted).
        """
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if if_match:
            kwargs["IfMatch"] = if_match
        try:
            self._call("DeleteObject", bucket, self.client.delete_object, **kwargs)
        except ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in ("404", "NoSuchKey", "NotFound"):
                return
            raise RemoteError(f"DeleteObject s3://{bucket}/{key} was refused: "
                              f"{code or status}") from None

    def list_keys(self, bucket: str, prefix: str, delimiter: str = "/") -> list[str]:
        """The keys right under ``prefix`` (all pages; not below the next ``delimiter``)."""
        out: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": delimiter}
        while True:
            r = self._call("ListObjectsV2", bucket, self.client.list_objects_v2, **kwargs)
            out += [o["Key"] for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token

    # --- multipart -------------------------------------------------------------------

    def create(self, bucket: str, key: str) -> str:
        """CreateMultipartUpload with a full-object CRC64NVME; returns the upload id."""
        r = self._call("CreateMultipartUpload", bucket, self.client.create_multipart_upload,
                       Bucket=bucket, Key=key, ChecksumAlgorithm="CRC64NVME",
                       ChecksumType="FULL_OBJECT", ContentType="application/octet-stream")
        return r["UploadId"]

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int,
                    body: Any, crc64nvme: str) -> str:
        """UploadPart with the part's CRC64NVME (the server checks it); returns the ETag."""
        r = self._call(f"UploadPart {number}", bucket, self.client.upload_part, Bucket=bucket,
                       Key=key, UploadId=upload_id, PartNumber=number, Body=body,
                       ChecksumAlgorithm="CRC64NVME", ChecksumCRC64NVME=crc64nvme)
        return strip_etag(r["ETag"])

    def copy_part(self, bucket: str, key: str, upload_id: str, number: int, source_key: str,
                  start: int, size: int, if_match: str) -> str:
        """UploadPartCopy of ``[start, start + size)`` of ``source_key``, pinned to ``if_match``.

        A source that is gone (removed since it was planned: a replaced
        version's object) is :class:`PreconditionFailed`, like one that
        changed: either way the caller sends the bytes instead.
        """
        from botocore.exceptions import ClientError

        try:
            r = self._call(f"UploadPartCopy {number}", bucket, self.client.upload_part_copy,
                           Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                           CopySource={"Bucket": bucket, "Key": source_key},
                           CopySourceRange=f"bytes={start}-{start + size - 1}",
                           CopySourceIfMatch=if_match)
        except ClientError as exc:
            code, status = _code(exc)
            if code in ("NoSuchKey", "NotFound") or (status == 404 and code != "NoSuchUpload"):
                raise PreconditionFailed(f"UploadPartCopy {number}: the source {source_key} "
                                         "is gone") from None
            raise
        return strip_etag(r["CopyPartResult"]["ETag"])

    def list_parts(self, bucket: str, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
        """Every part the server holds: ``{number: (etag, size)}`` (all pages)."""
        out: dict[int, tuple[str, int]] = {}
        marker = 0
        while True:
            r = self._call("ListParts", bucket, self.client.list_parts, Bucket=bucket, Key=key,
                           UploadId=upload_id, PartNumberMarker=marker, MaxParts=1000)
            for p in r.get("Parts", []):
                out[int(p["PartNumber"])] = (strip_etag(p["ETag"]), int(p["Size"]))
            if not r.get("IsTruncated"):
                return out
            nxt = int(r.get("NextPartNumberMarker") or 0)
            if nxt <= marker:
                return out
            marker = nxt

    def complete(self, bucket: str, key: str, upload_id: str,
                 parts: list[tuple[int, str, str | None]], crc64nvme: str, *,
                 if_none_match: bool = False, if_match: str | None = None) -> str:
        """CompleteMultipartUpload, conditional, with the full-object CRC64NVME; the ETag.

        ``parts`` are ``(number, etag, part crc64nvme or None)``.
        """
        listed = []
        for number, etag, crc in parts:
            entry: dict[str, Any] = {"PartNumber": number, "ETag": etag}
            if crc:
                entry["ChecksumCRC64NVME"] = crc
            listed.append(entry)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id,
                                  "MultipartUpload": {"Parts": listed},
                                  "ChecksumCRC64NVME": crc64nvme, "ChecksumType": "FULL_OBJECT"}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        r = self._call("CompleteMultipartUpload", bucket,
                       self.client.complete_multipart_upload, **kwargs)
        return strip_etag(r["ETag"])

    def abort(self, bucket: str, key: str, upload_id: str) -> None:
        """AbortMultipartUpload; an upload already gone is not an error."""
        with contextlib.suppress(NoSuchUpload):
            self._call("AbortMultipartUpload", bucket, self.client.abort_multipart_upload,
                       Bucket=bucket, Key=key, UploadId=upload_id)

    def list_uploads(self, bucket: str, prefix: str = "") -> list[OpenUpload]:
        """Every unfinished multipart upload under ``prefix`` (all pages)."""
        out: list[OpenUpload] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            r = self._call("ListMultipartUploads", bucket,
                           self.client.list_multipart_uploads, **kwargs)
            out += [OpenUpload(u["Key"], u["UploadId"], u.get("Initiated"))
                    for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")
