"""The one boto3 user: every S3 call of publish and fetch, with errors translated once.

:class:`S3` wraps one botocore client (found the way boto3 finds one:
``AWS_*`` variables, profiles, ``AWS_ENDPOINT_URL``; path-style addressing
when an endpoint is given; or a client the caller made) and exposes exactly
the calls the two halves need. A publish: create, upload_part, copy_part,
list_parts, complete (conditional), abort, list_uploads, head, get, put
(conditional), delete, list_keys. A fetch: head (pinned with ``If-Match``),
get (the manifest), get_range (a ranged GET pinned with ``If-Match``, as a
:class:`Body`), list_keys. Each answers with plain values; ETags come back
without quotes (ListParts quotes them, UploadPartCopy does not).

Errors: every exception botocore (or the connection under a body) raises
goes through :func:`translate`, once, into one vocabulary, the way
object_store's backends each map into its single ``Error`` enum:

======================================  ==========================================
server or network says                  raised
======================================  ==========================================
NoSuchBucket                            :class:`BucketNotFoundError`
AccessDenied, Forbidden, 403, bad key,  :class:`AccessDeniedError`
signature or token, no credentials
NoSuchUpload                            :class:`NoSuchUpload`
NoSuchKey, NotFound, 404                :class:`ObjectNotFoundError`
PreconditionFailed, 412                 :class:`PreconditionFailed` (an
                                        :class:`ObjectChangedError`)
BadDigest, a checksum mismatch          :class:`BadDigest`
5xx, SlowDown, RequestTimeout...        :class:`Transient`
no connection at all                    :class:`Unreachable` (a :class:`Transient`
                                        and an :class:`EndpointUnreachableError`)
a connection lost while a body is read  :class:`ReadInterrupted` (a :class:`Transient`)
any other refusal                       :class:`RemoteError`
======================================  ==========================================

Request-level retries are botocore's (``standard`` mode), which spend their
5 attempts in about a second. A fetch waits out a server that restarts:
:func:`wait_out` tries a request that failed through botocore's retries
again with backoff for :data:`RETRY_WINDOW` seconds, and says the tries and
seconds when it gives up. It is the one policy of every fetch (``fetch``'s
reader applies it to its client; an :class:`S3` made with ``retry_window``
applies it to every call, as ``fetch_set``'s does). The one retry of a body
cut short while it is read (as s3transfer does), which botocore cannot
retry, belongs to the caller of :class:`Body`.
boto3 is the ``s3`` extra: it is imported on the first :class:`S3`, and its
absence says how to install it.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trtet_store.io import MiB
from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    ManifestError,
    ObjectChangedError,
    ObjectNotFoundError,
    RemoteError,
)
from trtet_store.remote.jsondoc import MANIFEST_MAX_BYTES, Dated
from trtet_store.remote.manifest import strip_etag

log = logging.getLogger("trtet_store.remote")

#: What to do when boto3 (or awscrt) is missing.
INSTALL_HINT = "install trtet-store[s3] (pip install 'trtet-store[s3]')"

# The one vocabulary: the union of what the publisher and the fetcher each knew.
_DENIED = frozenset({"AccessDenied", "Forbidden", "403", "SignatureDoesNotMatch",
                     "InvalidAccessKeyId", "InvalidToken", "ExpiredToken",
                     "AllAccessDisabled"})
_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_CHANGED = frozenset({"PreconditionFailed", "412"})
_BAD_DIGEST = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
                         "XAmzContentSHA256Mismatch"})
_RETRY = frozenset({"500", "502", "503", "504", "InternalError", "ServiceUnavailable",
                    "SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "OperationAborted"})

#: Bytes per read of a response body.
READ_STEP = MiB

#: Seconds a fetch keeps trying a request that failed through botocore's retries
#: (:func:`wait_out`): exponential backoff (:data:`FIRST_DELAY` doubling up to
#: :data:`MAX_DELAY`, with jitter), as botocore's legacy schedule spread over about this long.
RETRY_WINDOW = 20.0
FIRST_DELAY, MAX_DELAY = 0.25, 4.0

T = TypeVar("T")


class PreconditionFailed(ObjectChangedError):  # noqa: N818 - the server's name for it
    """The server refused an ``If-Match``/``If-None-Match``/``CopySourceIfMatch`` (412).

    To a fetch, the object is no longer the version it started from; to a
    publish, another writer got there first (the publish decides what it means).
    """

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message, key)


class BadDigest(RemoteError):  # noqa: N818 - the server's name for it
    """The server refused a checksum: the bytes it received are not the ones we hashed."""


class NoSuchUpload(RemoteError):  # noqa: N818 - the server's name for it
    """The multipart upload is gone (completed, aborted, or expired)."""


class Transient(RemoteError):  # noqa: N818 - a signal, not a verdict
    """A connection, timeout or server error that botocore's retries did not get through."""


class Unreachable(Transient, EndpointUnreachableError):  # noqa: N818 - a signal, like Transient
    """No connection to the endpoint at all (botocore's ``EndpointConnectionError``)."""


class ReadInterrupted(Transient):  # noqa: N818 - a signal, like Transient
    """The connection failed while a response body was read: worth reading the range again.

    botocore retries a request, never a body it has handed over; this is the
    one failure the caller retries by hand (as s3transfer does).
    """


def _code(exc: BaseException) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    err = response.get("Error", {}) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(err.get("Code", "") or ""), int(status or 0)


def _boto() -> tuple[Any, Any]:
    """boto3 and botocore's ``Config``, or an ImportError that says how to install them."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ImportError(f"S3 needs boto3 and botocore ({exc}): {INSTALL_HINT}") from exc
    return boto3, Config


def translate(exc: BaseException, what: str, bucket: str, key: str | None = None, *,
              etag: str | None = None, endpoint: str | None = None,
              reading: bool = False) -> BaseException:
    """The one error for what botocore (or a body's connection) raised; ``exc`` if none fits.

    Parameters
    ----------
    exc : BaseException
        What a call (or a read of its body) raised.
    what : str
        The call, for the message (``"HeadObject"``).
    bucket, key : str
        Where, for the message (and the key of a :class:`PreconditionFailed`).
    etag : str, optional
        The version the call was pinned to (``If-Match``), for the message.
    endpoint : str, optional
        The server, for the message.
    reading : bool
        The failure came while a body was read: a network failure is then
        :class:`ReadInterrupted`, the one the caller retries by hand.

    Returns
    -------
    BaseException
        An error of the table in this module's docstring, or ``exc`` itself
        for what is not botocore's or the network's (a bug, a KeyboardInterrupt).
    """
    from botocore import exceptions as bx

    url = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    at = f" at {endpoint}" if endpoint else ""
    if isinstance(exc, bx.ClientError):
        code, status = _code(exc)
        said = code or str(status)
        if code == "NoSuchBucket":
            return BucketNotFoundError(f"{what} {url}: the bucket {bucket!r} does not exist{at}")
        if code in _DENIED or status == 403:
            return AccessDeniedError(
                f"{what} {url}{at} was refused: access denied ({said}); check the credentials "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile), their "
                "permissions and the endpoint")
        if code == "NoSuchUpload":  # a 404 too: before the objects' 404
            return NoSuchUpload(f"{what} {url}: the upload is gone")
        if code in _NOT_FOUND or status == 404:
            return ObjectNotFoundError(f"{what} {url}: no such object")
        if code in _CHANGED or status == 412:
            version = f" (ETag {etag})" if etag else ""
            return PreconditionFailed(
                f"{what} {url}: precondition failed: the object is no longer the version "
                f"asked for{version}; it was replaced meanwhile", key or "")
        if code in _BAD_DIGEST:
            return BadDigest(f"{what} {url}: {code}")
        if code == "NotImplemented":  # a 501 that says what it is: a header or call this
            return RemoteError(  # server lacks, the same on every retry
                f"{what} {url}{at} was refused: NotImplemented (this server does not "
                "implement a header or feature the call uses)")
        if code in _RETRY or status >= 500:
            cls = ReadInterrupted if reading else Transient
            return cls(f"{what} {url}: {said}")
        return RemoteError(f"{what} {url}{at} was refused: {said}"
                           + (f" (HTTP {status})" if status and code else ""))
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return AccessDeniedError(
            f"no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, choose "
            f"a profile with AWS_PROFILE, or run where an instance role applies ({exc})")
    if isinstance(exc, bx.EndpointConnectionError):
        # Every attempt failed to connect: say where, not "a network blip". Still a
        # Transient, so a publish whose server went away mid-upload keeps its upload.
        err = EndpointUnreachableError.from_botocore(exc, f"{what} {url}")
        return Unreachable(str(err), err.address)
    if _network(exc, bx):
        cls = ReadInterrupted if reading else Transient
        return cls(f"{what} {url}: {exc!r}")
    return exc


def _network(exc: BaseException, bx: Any) -> bool:
    """Whether ``exc`` is a connection, a timeout or a body cut short (botocore's or below)."""
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError,
                        http.client.HTTPException, ConnectionError, TimeoutError)):
        return True
    with contextlib.suppress(ImportError):
        from urllib3 import exceptions as ux

        if isinstance(exc, (ux.ProtocolError, ux.ReadTimeoutError, ux.IncompleteRead)):
            return True
    name = type(exc).__name__
    return isinstance(exc, bx.BotoCoreError) and ("Connection" in name or "Timeout" in name)


@dataclass(frozen=True)
class ObjectHead:
    """What HeadObject says about an object (the checksums only with ``ChecksumMode``)."""

    size: int
    etag: str
    crc64nvme: str | None
    checksum_type: str | None
    crc32c: str | None = None
    crc32: str | None = None


@dataclass(frozen=True)
class OpenUpload:
    """An unfinished multipart upload."""

    key: str
    upload_id: str
    initiated: Any  # datetime


class Body:
    """A ranged GET's streaming body: bytes ``[start, start + size)`` of an object.

    A read that fails (a reset connection, a timeout, a body cut short) raises
    :class:`ReadInterrupted`; read the range again (a new :meth:`S3.get_range`).
    Close it (or use it as a context manager) to give the connection back.
    """

    def __init__(self, raw: Any, what: str, bucket: str, key: str, start: int, size: int,
                 etag: str | None, endpoint: str | None) -> None:
        self._raw = raw
        self._where = (what, bucket, key, etag, endpoint)
        self.start = start
        self.size = size

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left for -1); ``b""`` at the end."""
        what, bucket, key, etag, endpoint = self._where
        try:
            return self._raw.read() if n < 0 else self._raw.read(n)
        except Exception as exc:
            err = translate(exc, what, bucket, key, etag=etag, endpoint=endpoint, reading=True)
            if err is exc:
                raise
            raise err from exc

    def read_into(self, into: memoryview, received: Callable[[int], None] | None = None) -> None:
        """Fill ``into`` (exactly :attr:`size` bytes) a :data:`READ_STEP` at a time.

        ``received(n)`` is called after each read. A body that ends early is
        :class:`ReadInterrupted`.
        """
        if len(into) != self.size:
            raise ValueError(f"read_into needs a buffer of {self.size} bytes, not {len(into)}")
        pos = 0
        while pos < self.size:
            data = self.read(min(READ_STEP, self.size - pos))
            if not data:
                what, bucket, key, _, _ = self._where
                raise ReadInterrupted(f"{what} s3://{bucket}/{key}: the body ended after "
                                      f"{pos} of {self.size} bytes")
            into[pos:pos + len(data)] = data
            pos += len(data)
            if received is not None:
                received(len(data))

    def close(self) -> None:
        """Give the connection back (or drop it, when the body was not read to its end)."""
        self._raw.close()

    def __enter__(self) -> Body:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backoff(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` (0-based): doubling, capped, jittered."""
    return min(MAX_DELAY, FIRST_DELAY * 2 ** attempt) * random.uniform(0.5, 1.0)


def wait_out(fn: Callable[[], T], window: float) -> T:
    """``fn()``, tried again with backoff while it fails through botocore's retries.

    A fetch's one retry policy: a server restarted within ``window`` seconds
    is waited out. A body cut short (:class:`ReadInterrupted`) is the
    caller's to retry; a refusal is raised at once. Once ``window`` is spent,
    the last failure is raised with the tries and seconds added to its
    message (``... (gave up after 9 tries over 18.2 s)``); ``window`` 0 is
    botocore's retries alone.
    """
    start = time.monotonic()
    tries = 0
    while True:
        try:
            return fn()
        except ReadInterrupted:
            raise
        except Transient as exc:
            tries += 1
            delay = backoff(tries - 1)
            spent = time.monotonic() - start
            if spent + delay > window:
                if window <= 0:
                    raise
                said = f"{exc} (gave up after {tries} tries over {spent:.1f} s)"
                if isinstance(exc, Unreachable):
                    raise Unreachable(said, exc.address) from exc
                raise type(exc)(said) from exc
            log.info("%s; trying again in %.1f s (try %d)", exc, delay, tries + 1)
            time.sleep(delay)


class S3:
    """One client, the calls a publish and a fetch make.

    Parameters
    ----------
    endpoint_url : str, optional
        The server (MinIO, Ceph, R2, SeaweedFS...). Default: what boto3 finds
        (``AWS_ENDPOINT_URL``, the profile, or AWS).
    max_connections : int
        The client's connection pool: at least the parts (or ranges) in flight.
    retries : int
        botocore's attempts per call (standard mode) before a network error
        is raised as :class:`Transient`.
    client : botocore S3 client, optional
        A client made by the caller, used as it is (its own retries and
        timeouts); the other options are then ignored.
    retry_window : float
        Seconds every call keeps trying a request that failed through
        botocore's retries (:func:`wait_out`, a fetch's policy); 0 (the
        default): botocore's retries alone.

    Attributes
    ----------
    retries : int
        botocore's retries across every call that got an answer (its
        ``RetryAttempts``), for reports.
    answered : bool
        Whether the server answered any call (with a refusal too): before
        one, a failure to connect is a wrong endpoint, not a blip.
    """

    def __init__(self, endpoint_url: str | None = None, *, max_connections: int = 10,
                 retries: int = 5, connect_timeout: float = 10, read_timeout: float = 120,
                 client: Any = None, retry_window: float = 0.0) -> None:
        if client is None:
            boto3, config = _boto()
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
            client = session.client("s3", endpoint_url=endpoint_url, config=config(**options))
        self.client = client
        self.endpoint_url = getattr(getattr(client, "meta", None), "endpoint_url", endpoint_url)
        self.retries = 0
        self.answered = False
        self.retry_window = retry_window
        self._count = threading.Lock()

    # --- errors --------------------------------------------------------------------

    def _seen(self, response: Any) -> None:
        meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
        with self._count:
            self.answered = True
            self.retries += int(meta.get("RetryAttempts", 0) or 0)

    def _call(self, what: str, bucket: str, fn: Any, *, key: str | None = None,
              etag: str | None = None, **kwargs: Any) -> Any:
        """``fn(**kwargs)``, its failure translated (:func:`translate`); tried again as
        :func:`wait_out` says for :attr:`retry_window` seconds."""
        if self.retry_window > 0:
            return wait_out(lambda: self._call_once(what, bucket, fn, key=key, etag=etag,
                                                    **kwargs), self.retry_window)
        return self._call_once(what, bucket, fn, key=key, etag=etag, **kwargs)

    def _call_once(self, what: str, bucket: str, fn: Any, *, key: str | None = None,
                   etag: str | None = None, **kwargs: Any) -> Any:
        try:
            r = fn(**kwargs)
        except Exception as exc:
            response = getattr(exc, "response", None)
            if response:
                self._seen(response)  # the server answered, if with a refusal
            err = translate(exc, what, bucket, key, etag=etag, endpoint=self.endpoint_url)
            if err is exc:
                raise
            # Keep botocore's error as the cause of network failures (the detail a -v shows);
            # a refusal is said in full by our message.
            raise err from (exc if isinstance(err, Transient) else None)
        self._seen(r)
        return r

    def _on_object(self, what: str, fn: Any, bucket: str, key: str, *,
                   if_match: str | None = None, if_none_match: bool = False,
                   **kwargs: Any) -> Any:
        """``fn`` on one object (Bucket, Key), with ``IfMatch`` / ``IfNoneMatch: *`` when asked."""
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        return self._call(what, bucket, fn, key=key, etag=if_match, Bucket=bucket, Key=key,
                          **kwargs)

    # --- buckets and objects ---------------------------------------------------------

    def check_bucket(self, bucket: str) -> None:
        """Raise :class:`BucketNotFoundError` or :class:`AccessDeniedError` unless usable."""
        try:
            self._call("HeadBucket", bucket, self.client.head_bucket, Bucket=bucket)
        except ObjectNotFoundError:
            # HeadBucket has no body, so no NoSuchBucket code: its 404 is the bucket's.
            raise BucketNotFoundError(f"bucket {bucket!r} does not exist at "
                                      f"{self.endpoint_url}") from None

    def head(self, bucket: str, key: str, if_match: str | None = None) -> ObjectHead | None:
        """HeadObject with its checksums (``ChecksumMode=ENABLED``); None if there is none.

        With ``if_match``, another version is :class:`PreconditionFailed`.
        """
        try:
            r = self._on_object("HeadObject", self.client.head_object, bucket, key,
                                if_match=if_match, ChecksumMode="ENABLED")
        except ObjectNotFoundError:
            return None
        return ObjectHead(int(r["ContentLength"]), strip_etag(r["ETag"]),
                          r.get("ChecksumCRC64NVME"), r.get("ChecksumType"),
                          r.get("ChecksumCRC32C"), r.get("ChecksumCRC32"))

    def get(self, bucket: str, key: str, if_match: str | None = None,
            limit: int = MANIFEST_MAX_BYTES) -> tuple[bytes, str] | None:
        """The whole of a small object (a manifest) and its ETag; None if there is none.

        Over ``limit`` bytes is a ManifestError, raised before the body is read.
        """
        try:
            r = self._on_object("GetObject", self.client.get_object, bucket, key,
                                if_match=if_match)
        except ObjectNotFoundError:
            return None
        if int(r["ContentLength"]) > limit:
            r["Body"].close()
            raise ManifestError(f"s3://{bucket}/{key} is {r['ContentLength']} bytes, more "
                                f"than the {limit} a manifest (or another small object) may "
                                "be; not read")
        with Body(r["Body"], "GetObject", bucket, key, 0, int(r["ContentLength"]), if_match,
                  self.endpoint_url) as body:
            return body.read(), strip_etag(r["ETag"])

    def get_dated(self, bucket: str, key: str, limit: int) -> Dated | None:
        """A small object (a pointer, a lease) with its ETag and dates; None if there is none.

        Its size is checked before its body is read: an object over ``limit``
        bytes comes back with ``data=None`` (the body is not read), so that a
        caller can judge it damaged and still replace it (``If-Match`` its ETag).
        """
        try:
            r = self._call("GetObject", bucket, self.client.get_object, key=key, Bucket=bucket,
                           Key=key)
        except ObjectNotFoundError:
            return None
        size = int(r["ContentLength"])
        etag = strip_etag(r["ETag"])
        modified = r["LastModified"].timestamp() if "LastModified" in r else None
        served = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        server_now = None
        if served:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                server_now = email.utils.parsedate_to_datetime(served).timestamp()
        if size > limit:
            r["Body"].close()
            return Dated(None, etag, size, modified, server_now)
        with Body(r["Body"], "GetObject", bucket, key, 0, size, None,
                  self.endpoint_url) as body:
            return Dated(body.read(), etag, size, modified, server_now)

    def get_range(self, bucket: str, key: str, start: int, end: int,
                  if_match: str | None = None) -> Body:
        """GetObject of bytes ``[start, end)``, pinned to ``if_match``; its streaming body.

        The body holds fewer bytes only where the object ends first (its
        :attr:`Body.size` says how many). Another version is
        :class:`PreconditionFailed`, no object :class:`ObjectNotFoundError`;
        a server that answers with other bytes than those asked for (a 200
        for the whole object) is a :class:`RemoteError`.
        """
        if not 0 <= start < end:
            raise ValueError(f"get_range needs 0 <= start < end, not [{start}, {end})")
        last = end - 1
        r = self._on_object("GetObject", self.client.get_object, bucket, key,
                            if_match=if_match, Range=f"bytes={start}-{last}")
        size = int(r.get("ContentLength", -1))
        answered = str(r.get("ContentRange", ""))
        total = answered.rpartition("/")[2]
        ends = start + size - 1
        if not (answered.startswith(f"bytes {start}-{ends}/") and 0 < size <= end - start
                and (ends == last or total == str(ends + 1))):
            r["Body"].close()
            raise RemoteError(f"s3://{bucket}/{key}: asked for bytes {start}-{last}, the server "
                              f"answered {answered or 'the whole object'!r} ({size} bytes)")
        return Body(r["Body"], "GetObject", bucket, key, start, size, if_match,
                    self.endpoint_url)


    def put(self, bucket: str, key: str, body: bytes, crc64nvme: str, *,
            if_none_match: bool = False, if_match: str | None = None,
            content_type: str = "application/json") -> str:
        """PutObject with its CRC64NVME, conditional; returns the ETag."""
        r = self._on_object("PutObject", self.client.put_object, bucket, key,
                            if_match=if_match, if_none_match=if_none_match, Body=body,
                            ChecksumCRC64NVME=crc64nvme, ContentType=content_type)
        return strip_etag(r["ETag"])

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        """DeleteObject; with ``if_match``, only that version (else :class:`PreconditionFailed`).

        A key already gone is not an error; any other refusal is a :class:`RemoteError`
        (a server without conditional deletes answers one, and nothing is deleted).
        """
        with contextlib.suppress(ObjectNotFoundError):
            self._on_object("DeleteObject", self.client.delete_object, bucket, key,
                            if_match=if_match)

    def list_keys(self, bucket: str, prefix: str, delimiter: str = "/") -> list[str]:
        """The keys right under ``prefix`` (all pages; not below the next ``delimiter``)."""
        out: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": delimiter}
        while True:
            r = self._call("ListObjectsV2", bucket, self.client.list_objects_v2, key=prefix,
                           **kwargs)
            out += [o["Key"] for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token

    def list_dated(self, bucket: str, prefix: str) -> list[tuple[str, int, float]]:
        """Every key under ``prefix`` (all depths, all pages): ``(key, size, LastModified)``.

        LastModified is in seconds since the epoch (the server's clock): what a
        prune compares ages with.
        """
        out: list[tuple[str, int, float]] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            r = self._call("ListObjectsV2", bucket, self.client.list_objects_v2, key=prefix,
                           **kwargs)
            out += [(o["Key"], int(o.get("Size", 0)), o["LastModified"].timestamp())
                    for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token

    def list_etags(self, bucket: str, prefix: str) -> list[tuple[str, float, str]]:
        """Every key under ``prefix`` (all depths, all pages): ``(key, LastModified, ETag)``.

        The date and the ETag come from one answer, so they are of one version:
        what a prune judges by age and then deletes ``If-Match``.
        """
        out: list[tuple[str, float, str]] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            r = self._call("ListObjectsV2", bucket, self.client.list_objects_v2, key=prefix,
                           **kwargs)
            out += [(o["Key"], o["LastModified"].timestamp(), strip_etag(o["ETag"]))
                    for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token

    # --- multipart -------------------------------------------------------------------

    def create(self, bucket: str, key: str) -> str:
        """CreateMultipartUpload with a full-object CRC64NVME; returns the upload id."""
        r = self._call("CreateMultipartUpload", bucket, self.client.create_multipart_upload,
                       key=key, Bucket=bucket, Key=key, ChecksumAlgorithm="CRC64NVME",
                       ChecksumType="FULL_OBJECT", ContentType="application/octet-stream")
        return r["UploadId"]

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int,
                    body: Any, crc64nvme: str) -> str:
        """UploadPart with the part's CRC64NVME (the server checks it); returns the ETag."""
        r = self._call(f"UploadPart {number}", bucket, self.client.upload_part, key=key,
                       Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body,
                       ChecksumAlgorithm="CRC64NVME", ChecksumCRC64NVME=crc64nvme)
        return strip_etag(r["ETag"])

    def copy_part(self, bucket: str, key: str, upload_id: str, number: int, source_key: str,
                  start: int, size: int, if_match: str) -> str:
        """UploadPartCopy of ``[start, start + size)`` of ``source_key``, pinned to ``if_match``.

        A source that is gone (removed since it was planned: a replaced
        version's object) is :class:`PreconditionFailed`, like one that
        changed: either way the caller sends the bytes instead.
        """
        try:
            r = self._call(f"UploadPartCopy {number}", bucket, self.client.upload_part_copy,
                           key=key, etag=if_match, Bucket=bucket, Key=key, UploadId=upload_id,
                           PartNumber=number, CopySource={"Bucket": bucket, "Key": source_key},
                           CopySourceRange=f"bytes={start}-{start + size - 1}",
                           CopySourceIfMatch=if_match)
        except ObjectNotFoundError:
            raise PreconditionFailed(f"UploadPartCopy {number}: the source {source_key} "
                                     "is gone", source_key) from None
        return strip_etag(r["CopyPartResult"]["ETag"])

    def list_parts(self, bucket: str, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
        """Every part the server holds: ``{number: (etag, size)}`` (all pages)."""
        out: dict[int, tuple[str, int]] = {}
        marker = 0
        while True:
            r = self._call("ListParts", bucket, self.client.list_parts, key=key, Bucket=bucket,
                           Key=key,
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
        r = self._on_object("CompleteMultipartUpload", self.client.complete_multipart_upload,
                            bucket, key, if_match=if_match, if_none_match=if_none_match,
                            UploadId=upload_id, MultipartUpload={"Parts": listed},
                            ChecksumCRC64NVME=crc64nvme, ChecksumType="FULL_OBJECT")
        return strip_etag(r["ETag"])

    def abort(self, bucket: str, key: str, upload_id: str) -> None:
        """AbortMultipartUpload; an upload already gone is not an error."""
        with contextlib.suppress(NoSuchUpload):
            self._call("AbortMultipartUpload", bucket, self.client.abort_multipart_upload,
                       key=key, Bucket=bucket, Key=key, UploadId=upload_id)

    def list_uploads(self, bucket: str, prefix: str = "") -> list[OpenUpload]:
        """Every unfinished multipart upload under ``prefix`` (all pages)."""
        out: list[OpenUpload] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            r = self._call("ListMultipartUploads", bucket,
                           self.client.list_multipart_uploads, key=prefix, **kwargs)
            out += [OpenUpload(u["Key"], u["UploadId"], u.get("Initiated"))
                    for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")
