"""The read side of S3 for fetch: HeadObject, GetObject, ranged GETs pinned by ``If-Match``.

Takes a boto3 client (any S3-compatible endpoint) and turns the server's
answers into :mod:`trtet_store.remote` errors. A ranged GET that fails in a
way worth retrying (a reset connection, a body cut short, a 5xx, a range
whose bytes do not match their digests) is retried with backoff; a
precondition failure (412: the object is no longer the version the fetch
started from) never is.
"""

from __future__ import annotations

import http.client
import logging
import time
from collections.abc import Callable
from typing import Any

from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    FetchInterruptedError,
    ObjectChangedError,
    ObjectNotFoundError,
    RemoteError,
)

log = logging.getLogger("trtet_store.remote.download.receive")

#: Bytes per read of a response body.
READ_STEP = 1 << 20

_DENIED = {"AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403",
           "InvalidToken", "ExpiredToken", "AllAccessDisabled"}
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_CHANGED = {"PreconditionFailed", "412"}
_RETRY = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
          "RequestTimeout", "RequestTimeTooSkewed", "OperationAborted"}


def make_client(endpoint_url: str | None = None, *, max_connections: int = 10) -> Any:
    """A boto3 S3 client from the publisher's factory (:class:`trtet_store.remote.s3.S3`).

    Found the way boto3 finds one (``AWS_*`` variables, profiles); path-style
    addressing with an ``endpoint_url``. botocore's own retries stay on for
    each request; what fails while a body is read is retried here.
    """
    from trtet_store.remote.s3 import S3

    return S3(endpoint_url, max_connections=max_connections).client


def _code(exc: Exception) -> str:
    resp = getattr(exc, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code or status


def _status(exc: Exception) -> str:
    resp = getattr(exc, "response", None) or {}
    return str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a network or server hiccup worth another try."""
    from botocore import exceptions as bx
    from urllib3 import exceptions as ux

    if isinstance(exc, bx.ClientError):
        return _code(exc) in _RETRY or _status(exc).startswith("5")
    return isinstance(exc, (bx.EndpointConnectionError, bx.ConnectionClosedError,
                            bx.ReadTimeoutError, bx.ConnectTimeoutError,
                            bx.ResponseStreamingError, bx.IncompleteReadError,
                            ux.ProtocolError, ux.ReadTimeoutError, http.client.IncompleteRead,
                            ConnectionError, TimeoutError))


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to connect at all (a wrong host or port, a server down)."""
    from botocore import exceptions as bx

    return isinstance(exc, bx.EndpointConnectionError)


def network_text(exc: BaseException, what: str) -> str:
    """A network failure of ``what`` in words: ``host:port`` when no connection was made."""
    if unreachable(exc):
        return str(EndpointUnreachableError.from_botocore(exc, what))
    return f"{what}: {exc!r}"


def translate(exc: Exception, bucket: str, key: str, etag: str | None = None) -> Exception:
    """The remote error that says what ``exc`` (a botocore ClientError) means, or ``exc``."""
    from botocore import exceptions as bx

    if not isinstance(exc, bx.ClientError):
        return exc
    code, url = _code(exc), f"s3://{bucket}/{key}"
    if code == "NoSuchBucket":
        return BucketNotFoundError(f"{url}: the bucket {bucket!r} does not exist")
    if code in _NOT_FOUND or _status(exc) == "404":
        return ObjectNotFoundError(f"{url}: no such object")
    if code in _DENIED or _status(exc) == "403":
        return AccessDeniedError(f"{url}: access denied ({code}): check the credentials "
                                 "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile) "
                                 "and the endpoint")
    if code in _CHANGED or _status(exc) == "412":
        return ObjectChangedError(f"{url}: the object is no longer the version this fetch "
                                  f"started from (ETag {etag}); it was replaced meanwhile",
                                  key)
    return exc


class Reader:
    """HeadObject and GetObject calls on one bucket, with retries and error translation."""

    def __init__(self, client: Any, bucket: str, *, attempts: int = 5,
                 backoff: float = 0.2) -> None:
        self.client = client
        self.bucket = bucket
        self.attempts = attempts
        self.backoff = backoff
        self.retries = 0  # transient failures retried, across all calls
        # Whether any call got an answer: before one, a failure to connect is a wrong
        # endpoint (botocore's own attempts all failed), not a blip worth our retries.
        self.answered = False

    def _call(self, what: str, key: str, etag: str | None, fn: Callable[[], Any]) -> Any:
        for attempt in range(1, self.attempts + 1):
            try:
                out = fn()
                self.answered = True
                return out
            except Exception as exc:  # noqa: BLE001 - sorted into retry / translate below
                if unreachable(exc) and not self.answered:
                    raise EndpointUnreachableError.from_botocore(
                        exc, f"{what} s3://{self.bucket}/{key}") from exc
                if getattr(exc, "response", None):
                    self.answered = True  # the server answered, if with a refusal
                if attempt < self.attempts and transient(exc):
                    self.retries += 1
                    log.info("%s s3://%s/%s failed (%r); retry %d of %d", what, self.bucket,
                             key, exc, attempt, self.attempts - 1)
                    time.sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                err = translate(exc, self.bucket, key, etag)
                if err is exc and transient(exc):
                    raise FetchInterruptedError(
                        f"{what} s3://{self.bucket}/{key} failed {self.attempts} times; the "
                        f"last error: {network_text(exc, what)}") from exc
                if err is exc:
                    raise
                raise err from None
        raise AssertionError("unreachable")

    def head(self, key: str, etag: str | None = None) -> dict:
        """HeadObject with the full-object checksum (ChecksumMode=ENABLED), pinned to ``etag``."""
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "ChecksumMode": "ENABLED"}
        if etag:
            kw["IfMatch"] = etag
        return self._call("HeadObject", key, etag, lambda: self.client.head_object(**kw))

    def get_small(self, key: str) -> tuple[bytes, str]:
        """A whole small object (a manifest) and its ETag, quotes stripped."""
        def get() -> tuple[bytes, str]:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return resp["Body"].read(), resp["ETag"].strip('"')
        return self._call("GetObject", key, None, get)

    def get_prefix(self, key: str, size: int) -> bytes:
        """The first ``size`` bytes of ``key`` (fewer for a smaller object)."""
        def get() -> bytes:
            resp = self.client.get_object(Bucket=self.bucket, Key=key,
                                          Range=f"bytes=0-{size - 1}")
            return resp["Body"].read()
        return self._call("GetObject", key, None, get)

    def list_keys(self, prefix: str) -> list[str]:
        """The keys directly under ``prefix`` (``dir/``; not in its subdirectories)."""
        def listing() -> list[str]:
            keys, token = [], None
            while True:
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                                      "Delimiter": "/"}
                if token:
                    kw["ContinuationToken"] = token
                resp = self.client.list_objects_v2(**kw)
                keys += [o["Key"] for o in resp.get("Contents", [])]
                token = resp.get("NextContinuationToken")
                if not resp.get("IsTruncated") or not token:
                    return keys
        return self._call("ListObjectsV2", prefix, None, listing)

    def get_range(self, key: str, etag: str, offset: int, size: int, into: memoryview,
                  received: Callable[[int], None] | None = None) -> None:
        """Read bytes ``[offset, offset + size)`` of ``key`` at version ``etag`` into ``into``.

        One attempt: the caller retries (it also checks the bytes). Raises
        :class:`ObjectChangedError` on 412, the translated error on other
        refusals, and the network's error on a failure worth retrying
        (see :func:`transient`). A server that answers with other bytes than
        the range asked for (a 200 for the whole object) is an error.
        """
        last = offset + size - 1
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=etag,
                                          Range=f"bytes={offset}-{last}")
        except Exception as exc:
            err = translate(exc, self.bucket, key, etag)
            if err is exc:
                raise
            raise err from None
        content_range = resp.get("ContentRange", "")
        if not content_range.startswith(f"bytes {offset}-{last}/") or \
                resp.get("ContentLength") != size:
            resp["Body"].close()
            raise RemoteError(f"s3://{self.bucket}/{key}: asked for bytes {offset}-{last}, the "
                              f"server answered {content_range or 'the whole object'!r} "
                              f"({resp.get('ContentLength')} bytes)")
        body = resp["Body"]
        pos = 0
        try:
            while pos < size:
                data = body.read(min(READ_STEP, size - pos))
                if not data:
                    raise http.client.IncompleteRead(b"", size - pos)
                into[pos:pos + len(data)] = data
                pos += len(data)
                if received is not None:
                    received(len(data))
        finally:
            body.close()
