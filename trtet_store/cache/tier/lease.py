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

A lease is live while the server keeps seeing it rewritten. A waiter judges
it dead once its age on the server's clock (the answer's Date less its
Last-Modified) passes its ttl, so a lease dead for long is taken over at
once; and, as a bound, once its ETag has stayed the same for its ttl on the
waiter's monotonic clock. Wall clocks of two machines are never compared.
The ttl a lease claims is the bucket's word: it is capped at twice the
waiter's own (:func:`capped_ttl`), so no lease holds a waiter for longer.

**Signed leases.** A holder with a signing key signs every body it writes
(claim, each renewal): ed25519 over :data:`LEASE_DOMAIN`, the bucket and
object key, and the body's fields as canonical JSON (:func:`lease_payload`),
stored as ``"signature": {"key": <key id>, "ed25519": <base64>}``; the same
key API as the pointers' (:mod:`.signing`), over the lease's own fields. A
waiter whose tier has trusted keys is held only by a lease signed by one of
them (:func:`lease_refusal`): any other (unsigned, another key, a signature
that does not verify, too large to read) is ignored, said once at WARNING,
and taken over at once (``If-Match`` its ETag). A signed lease counts as
renewed only when its signed ``(holder, beat)`` moves on (a new holder, or
a higher beat of the same one): old signed bodies replayed by a bucket
writer, even alternated so that the ETag keeps changing, do not renew it,
and it is taken over one ttl after its last real renewal.

Time is read through a :class:`Clock` (``RemoteTier.clock``): tests drive it.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from trtet_store.remote.checksum import crc64nvme
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.jsondoc import Dated, loads
from trtet_store.remote.keys import signature_problem
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.remote.s3 import S3, PreconditionFailed

if TYPE_CHECKING:
    from trtet_store.cache.tier.signing import PublicKey, SigningKey

__all__ = ["LEASE_DOMAIN", "LEASE_SUFFIX", "SYSTEM_CLOCK", "Clock", "Lease", "LeaseWaitTimeout",
           "LeaseWatch", "capped_ttl", "lease_body", "lease_payload", "lease_refusal",
           "parse_lease", "prunable", "put"]

log = logging.getLogger("trtet_store.cache.tier")

LEASE_SUFFIX = ".lease"
#: What a lease's signature covers starts with this (never a pointer's :data:`.signing.DOMAIN`).
LEASE_DOMAIN = b"trtet-store/build-lease-signature/1\n"


class Clock:
    """The clocks a lease's wait reads, and its sleep: the system's (a test's own drives time)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = Clock()


class LeaseWaitTimeout(TimeoutError):
    """:meth:`RemoteTier.claim` waited ``timeout`` seconds on another holder's live lease."""


def put(s3: S3, bucket: str, key: str, body: bytes, *, if_none_match: bool = False,
        if_match: str | None = None) -> str:
    """PutObject of a small JSON body with its CRC64NVME, conditional; the ETag."""
    return s3.put(bucket, key, body, crc64nvme_b64(crc64nvme(body)),
                  if_none_match=if_none_match, if_match=if_match)


def lease_payload(bucket: str, object_key: str, doc: Mapping[str, Any]) -> bytes:
    """What a lease's signature covers: :data:`LEASE_DOMAIN`, where it lies, its fields.

    The bucket and object key bind it to one key's lease (a signed lease of
    another key, or another bucket, verifies nowhere else); the fields are
    the document's own, ``signature`` left out, as canonical JSON.
    """
    fields = {k: v for k, v in doc.items() if k != "signature"}
    return (LEASE_DOMAIN + json.dumps([bucket, object_key], ensure_ascii=True).encode("ascii")
            + b"\n" + json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                 ensure_ascii=True).encode("ascii"))


def lease_body(holder: str, started: float, ttl: float, beat: int, *,
               signing_key: SigningKey | None = None, bucket: str = "",
               object_key: str = "") -> bytes:
    """The lease's JSON (``beat`` makes every renewal's bytes, so its ETag, new).

    With ``signing_key``, signed over :func:`lease_payload` of ``bucket`` and
    ``object_key`` (where it is written).
    """
    doc: dict[str, Any] = {"holder": holder, "host": socket.gethostname(),
                           "pid": os.getpid(), "started": started, "renewed": time.time(),
                           "ttl": ttl, "beat": beat}
    if signing_key is not None:
        sig = signing_key.sign(lease_payload(bucket, object_key, doc))
        doc["signature"] = {"key": signing_key.key_id,
                            "ed25519": base64.b64encode(sig).decode("ascii")}
    return json.dumps(doc, sort_keys=True).encode()


def lease_refusal(doc: Mapping[str, Any] | None, bucket: str, object_key: str,
                  trusted: Mapping[str, PublicKey]) -> str | None:
    """Why the lease ``doc`` is not vouched for by one of ``trusted`` (by key id), or None.

    ``doc`` None: the lease could not be read (over its size cap, not JSON).
    """
    if doc is None:
        return "it cannot be read (damaged or too large), so it is not signed"
    sig = doc.get("signature")
    if sig is None:
        return "it is not signed"
    return signature_problem(sig, trusted, lease_payload(bucket, object_key, doc))


def parse_lease(data: bytes | None) -> dict[str, Any] | None:
    """The lease's dict, or None when it does not parse (a waiter then uses its own ttl)."""
    if data is None:
        return None
    try:
        doc = loads(data, "the lease")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def capped_ttl(claimed: Any, own: float) -> tuple[float, str | None]:
    """``(ttl, why it is not the claimed one)``: a lease's ttl bounded by the waiter's ``own``.

    A ttl that is not a positive finite number (a damaged lease; ``Infinity``
    and ``NaN`` parse as floats) is ``own``; one over ``2 * own`` is
    ``2 * own``: a bucket writer cannot make a waiter wait longer than that
    for a lease that is not renewed.
    """
    if isinstance(claimed, bool) or not isinstance(claimed, (int, float)) \
            or not math.isfinite(claimed) or claimed <= 0:
        return own, f"its ttl {claimed!r} is not a number of seconds; {own:g} s is used"
    if claimed > 2 * own:
        return 2 * own, f"its ttl {claimed:g} s is capped to {2 * own:g} s"
    return float(claimed), None


def _when(t: Any) -> str:
    """A time (seconds since the epoch) as UTC ``YYYY-MM-DD HH:MM:SS``, or ``"?"``."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return "?"
    try:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "?"


def prunable(dated: Dated, own_ttl: float) -> bool:
    """Whether prune may remove a lease read as ``dated``: unchanged for two of its ttls.

    Its age is the server's (Date less Last-Modified); its ttl is capped
    (:func:`capped_ttl`). A live holder rewrites it every ttl/3, and a
    waiter takes over after one ttl: two leave a holder's renewal that was
    late a margin. A lease with no ttl to read (none of ours: every one
    carries it) goes once the prune's age bound passes. An age the server
    did not give is never prunable.
    """
    ttl, damaged = capped_ttl((parse_lease(dated.data) or {}).get("ttl"), own_ttl)
    if damaged is not None and ttl == own_ttl:
        ttl = 0.0
    return dated.age is not None and dated.age > 2 * ttl


class LeaseWait(NamedTuple):
    """One look at another holder's lease while waiting for its build (``on_wait``).

    Given at each look (every ``poll`` s) while the wait goes on, and once
    more with ``over=True`` when it ends (the entry appeared, the lease was
    taken over, or the wait timed out), so that a progress line can close.
    """

    key: str
    #: The holder's id, host and pid, as its lease says (``"?"`` where it says nothing).
    holder: str
    host: str
    pid: Any
    #: When the holder started its build (its clock, epoch seconds), or None.
    since: float | None
    #: Seconds waited so far, on this machine's monotonic clock.
    waited: float
    over: bool = False

    @classmethod
    def of(cls, key: str, doc: dict[str, Any], waited: float, over: bool = False
           ) -> LeaseWait:
        """The wait as a lease's JSON ``doc`` (:func:`parse_lease`) tells it."""
        since = doc.get("started")
        return cls(key, str(doc.get("holder", "?"))[:32], str(doc.get("host", "?"))[:64],
                   doc.get("pid", "?"),
                   float(since) if isinstance(since, (int, float)) and not isinstance(
                       since, bool) and math.isfinite(since) else None,
                   waited, over)


class LeaseWatch:
    """A waiter's view of another holder's lease across its looks (:meth:`RemoteTier.claim`).

    Says, at each look, whether the lease is dead (take it over), and logs at
    WARNING the start of the wait (holder, until when) and, once, a wait
    longer than the lease's ttl (holder, since when, until when).

    With ``signed=True`` (the tier has trusted keys; the caller has checked
    the signature) the lease counts as renewed only when its ``(holder,
    beat)`` moves on: a holder not seen before, or a higher beat of the one
    seen; a replayed older body (a new ETag, the same or an older beat) does
    not reset the ttl.
    """

    def __init__(self, where: str, own_ttl: float, deadline: float | None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.where = where
        self.own_ttl = own_ttl
        self.deadline = deadline  # our monotonic clock, or None
        self.clock = clock
        self.began = clock.monotonic()
        self._seen: tuple[Any, float] | None = None  # (what renews it, first seen on our clock)
        self._beats: dict[str, float] = {}  # signed: holder -> the highest beat seen
        self._told_start = False
        self._told_long = False
        self._told: set[str] = set()  # one-line outcomes said once (ignored, oversized)

    def _holder(self, doc: dict[str, Any]) -> str:
        return (f"holder {str(doc.get('holder', '?'))[:32]} (host {str(doc.get('host', '?'))[:64]}"
                f", pid {doc.get('pid', '?')})")

    def _until(self) -> str:
        if self.deadline is None:
            return "while its lease is renewed"
        return (f"until {_when(self.clock.time() + self.deadline - self.clock.monotonic())} "
                "at most")

    def once(self, what: str, message: str, *args: Any) -> None:
        """Log ``message`` at WARNING the first time ``what`` happens in this wait."""
        if what not in self._told:
            self._told.add(what)
            log.warning(message, *args)

    def oversized(self, size: int, limit: int) -> None:
        """The lease object is over ``limit`` bytes: not read, judged as damaged (said once)."""
        self.once("oversized", "%s: the build lease is %d bytes, more than the %d a lease may be; "
                  "not read: judged as a damaged lease (this cache's ttl, %g s, applies)",
                  self.where, size, limit, self.own_ttl)

    def _token(self, doc: dict[str, Any], etag: str, signed: bool) -> Any:
        """What must change for the lease to count as renewed since the last look."""
        if not signed:
            return etag
        holder, beat = str(doc.get("holder", "")), doc.get("beat")
        if isinstance(beat, bool) or not isinstance(beat, (int, float)) \
                or not math.isfinite(beat):
            beat = -math.inf
        last = self._beats.get(holder)
        if last is None or beat > last:
            self._beats[holder] = beat
            return (holder, beat)
        return self._seen[0] if self._seen is not None else (holder, beat)

    def look(self, doc: dict[str, Any], etag: str, age: float | None,
             modified: float | None, *, signed: bool = False) -> tuple[bool, float, float]:
        """``(dead, ttl, unchanged for s on our clock)`` of the lease as read now; logs the wait."""
        ttl, capped = capped_ttl(doc.get("ttl"), self.own_ttl)
        now = self.clock.monotonic()
        token = self._token(doc, etag, signed)
        if self._seen is None or self._seen[0] != token:
            self._seen = (token, now)
        unchanged = now - self._seen[1]
        if (age is not None and age > ttl) or unchanged > ttl:
            return True, ttl, max(unchanged, age or 0.0)
        expires = _when(modified + ttl) if modified is not None else \
            _when(self.clock.time() + ttl - unchanged)
        if not self._told_start:
            self._told_start = True
            log.warning("%s is being built by %s; its lease runs until %s unless renewed%s; "
                        "waiting for its entry %s", self.where, self._holder(doc), expires,
                        f" ({capped})" if capped else "", self._until())
        elif not self._told_long and now - self.began > ttl:
            self._told_long = True
            log.warning("%s: still waiting after %.1f s (more than the lease's ttl, %g s) for "
                        "%s, building since %s, its lease renewed until %s; waiting %s",
                        self.where, now - self.began, ttl, self._holder(doc),
                        _when(doc.get("started")), expires, self._until())
        return False, ttl, unchanged

    def forget(self) -> None:
        """The lease changed hands meanwhile (a lost takeover): judge the next one afresh."""
        self._seen = None


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
                 etag: str, started: float, ttl: float,
                 signing_key: SigningKey | None = None) -> None:
        self.key = key
        self.holder = holder
        self.etag = etag
        self.lost = False
        self.ttl = ttl
        self._s3, self._bucket, self._object = s3, bucket, object_key
        self._started = started
        self._signing_key = signing_key  # each renewal is signed with it, as the claim was
        self._beat = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._released = False
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease-{key[:24]}")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            if not self._renew(stopping=self._stop):
                return

    def renew(self) -> bool:
        """Rewrite the lease now (``If-Match`` our ETag); False once it is lost (or released).

        The renewal thread calls it every ``ttl / 3``. A network blip is
        logged and True (the next beat tries again).
        """
        return self._renew(None)

    def _renew(self, stopping: threading.Event | None) -> bool:
        with self._lock:
            if self._released or self.lost or (stopping is not None and stopping.is_set()):
                return False
            self._beat += 1
            body = lease_body(self.holder, self._started, self.ttl, self._beat,
                              signing_key=self._signing_key, bucket=self._bucket,
                              object_key=self._object)
            try:
                self.etag = put(self._s3, self._bucket, self._object, body, if_match=self.etag)
            except PreconditionFailed:
                self.lost = True
                log.warning("the build lease on %s was taken over or removed by another "
                            "machine (our renewals stopped getting through?); the build "
                            "goes on, its publish is conditional", self.key)
                return False
            except RemoteError as exc:
                # A blip: the next beat tries again; a waiter takes over only after
                # a whole ttl without a change.
                log.info("renewing the build lease on %s failed: %s", self.key, exc)
            return True

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
