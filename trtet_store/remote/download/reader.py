"""The read side of S3 for fetch: what a fetch asks of :class:`~trtet_store.remote.s3.S3`.

Every call goes through :class:`~trtet_store.remote.s3.S3`, which translates
the server's answers once (the same errors a publish gets). What this adds
is the fetch's reading of them:

- no object (or manifest) is :class:`ObjectNotFoundError`, not ``None``;
- a request that failed through botocore's own retries (connection refused,
  reset, 5xx) is tried again with backoff over a bounded time
  (``retry_window``, :data:`RETRY_WINDOW` seconds for a fetch's own client:
  a server restarted within that time is waited out; botocore's standard
  mode spends its 5 attempts in under a second): the policy is
  :func:`~trtet_store.remote.s3.wait_out`, the same for ``fetch_set``, whose
  client applies it to every call. When the window is spent it
  is :class:`FetchInterruptedError` (the fetch adds the command that resumes
  it), except a failure to connect before the server ever answered, which
  is a wrong endpoint or a server down (:class:`EndpointUnreachableError`);
  either message says how many tries over how many seconds;
- a ranged GET is read into the caller's buffer. Its body failing while it
  is read is :class:`~trtet_store.remote.s3.ReadInterrupted`, the one error
  the caller retries by hand (request-level retries are botocore's).

Nothing here imports boto3 or botocore.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from trtet_store.remote.errors import (
    EndpointUnreachableError,
    FetchInterruptedError,
    ObjectNotFoundError,
    RemoteError,
)
from trtet_store.remote.s3 import (  # noqa: F401 - the policy's names, as they were here
    FIRST_DELAY,
    MAX_DELAY,
    RETRY_WINDOW,
    S3,
    ObjectHead,
    Transient,
    backoff,
    wait_out,
)

T = TypeVar("T")


class Reader:
    """HeadObject, GetObject and ListObjectsV2 on one bucket, as a fetch reads them.

    Parameters
    ----------
    s3 : S3
        The client (its retries and timeouts are its own).
    bucket : str
        The bucket every call reads.
    retry_window : float
        Seconds to keep trying a request that failed through the client's own
        retries (0: the client's retries alone, for a client the caller made).
    """

    def __init__(self, s3: S3, bucket: str, retry_window: float = 0.0) -> None:
        if not isinstance(s3, S3):
            raise TypeError(f"Reader needs a trtet_store.remote.s3.S3, not "
                            f"{type(s3).__name__}; wrap a boto3 client with S3(client=...)")
        self.s3 = s3
        self.bucket = bucket
        self.retry_window = retry_window

    def _retrying(self, fn: Callable[[], T]) -> T:
        """``fn()``, tried again with backoff while it fails through botocore's retries.

        A body cut short (:class:`ReadInterrupted`) is the caller's to retry.
        Once :attr:`retry_window` is spent, the last failure is raised with
        the tries and seconds added to its message.
        """
        return wait_out(fn, self.retry_window)

    @property
    def retries(self) -> int:
        """botocore's retries across every call so far."""
        return self.s3.retries

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        try:
            return self._retrying(fn)
        except Transient as exc:
            if isinstance(exc, EndpointUnreachableError) and not self.s3.answered:
                raise  # never answered: a wrong endpoint or a server down, not a blip
            raise FetchInterruptedError(f"{what} s3://{self.bucket}/{key} failed: {exc}") from exc

    def head(self, key: str, etag: str | None = None) -> ObjectHead:
        """HeadObject with the full-object checksums, pinned to ``etag`` (412: changed)."""
        head = self._call("HeadObject", key, lambda: self.s3.head(self.bucket, key, etag))
        if head is None:
            raise ObjectNotFoundError(f"s3://{self.bucket}/{key}: no such object")
        return head

    def get_small(self, key: str) -> tuple[bytes, str]:
        """A whole small object (a manifest) and its ETag, quotes stripped."""
        got = self._call("GetObject", key, lambda: self.s3.get(self.bucket, key))
        if got is None:
            raise ObjectNotFoundError(f"s3://{self.bucket}/{key}: no such object")
        return got

    def get_prefix(self, key: str, size: int) -> bytes:
        """The first ``size`` bytes of ``key`` (fewer for a smaller object)."""
        def get() -> bytes:
            with self.s3.get_range(self.bucket, key, 0, size) as body:
                return body.read()
        return self._call("GetObject", key, get)

    def list_keys(self, prefix: str) -> list[str]:
        """The keys directly under ``prefix`` (``dir/``; not in its subdirectories)."""
        return self._call("ListObjectsV2", prefix,
                          lambda: self.s3.list_keys(self.bucket, prefix, "/"))

    def get_range(self, key: str, etag: str, offset: int, size: int, into: memoryview,
                  received: Callable[[int], None] | None = None) -> None:
        """Read bytes ``[offset, offset + size)`` of ``key`` at version ``etag`` into ``into``.

        One attempt: the caller retries a :class:`~trtet_store.remote.s3.ReadInterrupted`
        (it also checks the bytes). Raises :class:`ObjectChangedError` on 412,
        the translated error on other refusals, and
        :class:`~trtet_store.remote.s3.Transient` when the request failed through
        botocore's retries. A server that answers with other bytes than the
        range asked for is a :class:`RemoteError`.
        """
        opened = self._retrying(
            lambda: self.s3.get_range(self.bucket, key, offset, offset + size, etag))
        with opened as body:
            if body.size != size:
                raise RemoteError(f"s3://{self.bucket}/{key}: asked for bytes {offset}-"
                                  f"{offset + size - 1}, the object ends after {body.size}")
            body.read_into(into, received)
