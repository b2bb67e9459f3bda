"""Build leases: ``PREFIX<key>.lease``, claimed, renewed, taken over and released conditionally.

Every step is one conditional request, and SeaweedFS 4.48 honours each of
them (checked against the test server: a wrong ``If-Match`` on PutObject and
on DeleteObject, ``If-Match`` on a missing key and ``If-None-Match: *`` on an
existing one are all refused with 412):

- **claim**: PutObject ``If-None-Match: *`` (one claimer wins);
- **renew**: PutObject ``If-Match: <own etag>`` every ``ttl / 3`` on a daemon
  thread. The body changes each time (``renewed`` and a beat counter): the
  ETag is the MD5 of the body, and a renewal that kept it would look dead;
- **take over**: PutObject ``If-Match: <stale etag>`` (of two waiters, one wins);
- **release**: DeleteObject ``If-Match: <own etag>`` (never another holder's).

A lease is live while its ETag keeps changing. A waiter judges expiry on
its own monotonic clock: the ETag unchanged for more than the lease's ``ttl``
since the waiter first saw it. Wall clocks of two machines are never compared.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.remote.s3 import S3, PreconditionFailed

__all__ = ["Lease", "lease_body", "parse_lease", "put"]

log = logging.getLogger("trtet_store.remote.tier")


def put(s3: S3, bucket: str, key: str, body: bytes, *, if_none_match: bool = False,
        if_match: str | None = None) -> str:
    """PutObject of a small JSON body with its CRC64NVME, conditional; the ETag."""
    return s3.put(bucket, key, body, crc64nvme_b64(crc64nvme(body)),
                  if_none_match=if_none_match, if_match=if_match)


def lease_body(holder: str, started: float, ttl: float, beat: int) -> bytes:
    """The lease's JSON (``beat`` makes every renewal's bytes, so its ETag, new)."""
    now = time.time()
    return json.dumps({"holder": holder, "host": socket.gethostname(), "pid": os.getpid(),
                       "started": started, "renewed": now, "ttl": ttl, "beat": beat},
                      sort_keys=True).encode()


def parse_lease(data: bytes) -> dict[str, Any] | None:
    """The lease's dict, or None when it does not parse (a waiter then uses its own ttl)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


class Lease:
    """A build lease held on ``key``: renewed on a daemon thread until :meth:`release`.

    Use it as a context manager (released on exit), or call :meth:`release`.

    Attributes
    ----------
    key : str
        The entry's key (the lease object is ``PREFIX<key>.lease``).
    holder : str
        This holder's id (uuid4 hex), in the lease's JSON.
    etag : str
        The lease object's ETag as last written by us.
    lost : bool
        A renewal found the lease replaced or gone (another holder took it
        over after our renewals stopped getting through): logged; the build
        may go on, its publish is still conditional.
    """

    def __init__(self, s3: S3, bucket: str, object_key: str, key: str, holder: str,
                 etag: str, started: float, ttl: float) -> None:
        self.key = key
        self.holder = holder
        self.etag = etag
        self.lost = False
        self.ttl = ttl
        self._s3, self._bucket, self._object = s3, bucket, object_key
        self._started = started
        self._beat = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._released = False
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease-{key[:24]}")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            with self._lock:
                if self._stop.is_set():
                    return
                self._beat += 1
                body = lease_body(self.holder, self._started, self.ttl, self._beat)
                try:
                    self.etag = put(self._s3, self._bucket, self._object, body,
                                    if_match=self.etag)
                except PreconditionFailed:
                    self.lost = True
                    log.warning("the build lease on %s was taken over or removed by another "
                                "machine (our renewals stopped getting through?); the build "
                                "goes on, its publish is conditional", self.key)
                    return
                except RemoteError as exc:
                    # A blip: the next beat tries again; a waiter takes over only after
                    # a whole ttl without a change.
                    log.info("renewing the build lease on %s failed: %s", self.key, exc)

    def _stop_renewing(self) -> None:
        """Stop the renewal thread, leaving the lease object as it is (a killed holder's)."""
        self._stop.set()
        with self._lock:
            pass
        self._thread.join()

    def release(self) -> None:
        """Stop renewing and delete the lease (``If-Match`` our ETag: never another's).

        Idempotent; a lease already taken over or gone is left alone.
        """
        if self._released:
            return
        self._released = True
        self._stop_renewing()
        if self.lost:
            return
        try:
            self._s3.delete(self._bucket, self._object, if_match=self.etag)
        except PreconditionFailed:
            log.info("the build lease on %s had another holder when released", self.key)
        except RemoteError as exc:
            # Its ETag stops changing, so waiters take over after its ttl anyway.
            log.warning("could not release the build lease on %s: %s", self.key, exc)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease(key={self.key!r}, holder={self.holder!r}, lost={self.lost})"


def new_holder() -> str:
    """A fresh holder id."""
    return uuid.uuid4().hex
