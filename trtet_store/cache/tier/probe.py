"""Whether a server honours the conditional writes the tier's "first writer wins" rests on.

Every pointer and lease write of the tier is conditional (``If-None-Match: *``
to create, ``If-Match: <etag>`` to replace). Some S3-compatible servers
accept those headers and ignore them (moto), let ``If-Match`` create a
missing key (MinIO, once) or invert the check (Ceph's POSIX backend, once):
there the first writer does not win, the last one does, silently.

So before the tier's first write to an endpoint and bucket (a publish, a
lease claim), and after a read there (a missing bucket is said by that read:
some servers, SeaweedFS among them, create a missing bucket on a PutObject),
:func:`require_conditional_writes` probes the server under the tier's
prefix, with keys no entry can have (``<prefix>.trtet-probe/<uuid>/...``: an
entry's key never starts with a dot):

1. a create-only PutObject (``If-None-Match: *``) of a new key must succeed;
2. a second create-only PutObject of that key must be refused (412);
3. an ``If-Match`` PutObject of a missing key must not succeed (412 or 404);
4. an ``If-Match`` PutObject of the existing key with another ETag must be
   refused (412).

Then it deletes what it created (best effort; only its own keys). The
verdict is remembered for the process per ``(endpoint, bucket)``: a failed
probe is :class:`~trtet_store.remote.errors.ConditionalWritesUnsupportedError`
on every later write, without asking again. A probe that could not ask (a
server down, credentials refused) decides nothing: its error is raised and
the next write probes again.
"""

from __future__ import annotations

import logging
import threading
import uuid

from trtet_store.cache.tier.bucket import TierBucket
from trtet_store.cache.tier.lease import put
from trtet_store.remote.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConditionalWritesUnsupportedError,
    ObjectNotFoundError,
    RemoteError,
)
from trtet_store.remote.s3 import S3, PreconditionFailed, Transient

__all__ = ["PROBE_DIR", "forget", "probe", "require_conditional_writes"]

log = logging.getLogger("trtet_store.cache.tier")

#: The folder (under the tier's prefix) of the probe's objects; no entry key starts with ".".
PROBE_DIR = ".trtet-probe/"

# (endpoint, bucket) -> None (honours conditions) or the refusal's message.
_verdicts: dict[tuple[str | None, str], str | None] = {}
# (endpoint, bucket) -> the lock its one probe runs under; _guard guards both dicts.
_probing: dict[tuple[str | None, str], threading.Lock] = {}
_guard = threading.Lock()

# A refusal that says nothing of conditions: the probe could not ask, it decides nothing.
_NOT_A_VERDICT = (Transient, AccessDeniedError, BucketNotFoundError)


def require_conditional_writes(tier: TierBucket) -> None:
    """Return if ``tier``'s server honours conditional writes (probed once per endpoint, bucket).

    Raises
    ------
    ConditionalWritesUnsupportedError
        It does not (found now or earlier in this process): nothing may be
        written to the tier. One line, naming the endpoint, the bucket and
        the condition the server ignored.
    RemoteError
        The probe could not ask (unreachable, denied, no bucket): nothing is
        remembered.
    """
    where = (tier.endpoint_url or tier.s3.endpoint_url, tier.bucket)
    with _guard:
        if where in _verdicts:
            refused = _verdicts[where]
            lock = None
        else:
            refused = None
            lock = _probing.setdefault(where, threading.Lock())
    if lock is not None:
        with lock:  # one probe per (endpoint, bucket); the others wait for its verdict
            with _guard:
                known = where in _verdicts
                refused = _verdicts.get(where)
            if not known:
                refused = probe(tier.s3, tier.bucket, tier.prefix, where[0])
                with _guard:
                    _verdicts[where] = refused
    if refused is not None:
        raise ConditionalWritesUnsupportedError(
            f"{refused}; nothing is published to {tier.url} and no build lease is claimed "
            "there (reads still work): use a server that honours If-None-Match and If-Match "
            "on PutObject", where[0], tier.bucket)


def forget(endpoint: str | None = None, bucket: str | None = None) -> None:
    """Forget remembered verdicts (all, or those of ``endpoint`` and/or ``bucket``).

    For a server upgraded while the process runs, and for tests.
    """
    with _guard:
        for where in list(_verdicts):
            if (endpoint is None or where[0] == endpoint) and \
                    (bucket is None or where[1] == bucket):
                del _verdicts[where]


def probe(s3: S3, bucket: str, prefix: str, endpoint: str | None = None) -> str | None:
    """Probe the server now: None if it honours conditional writes, else why not (a sentence).

    Writes only keys under ``<prefix>.trtet-probe/`` made for this probe,
    and deletes each it created (best effort, logged).

    Raises
    ------
    RemoteError
        The server could not be asked (unreachable, denied, no bucket).
    """
    folder = f"{prefix}{PROBE_DIR}{uuid.uuid4().hex}"
    first, missing = f"{folder}/created", f"{folder}/missing"
    at = f"{endpoint or 'the S3 server'} (bucket {bucket})"
    made: list[str] = [first]  # before the PUT: a reset after the server stored it still deletes it
    try:
        try:
            etag = put(s3, bucket, first, b"trtet-store conditional-write probe 1\n",
                       if_none_match=True)
        except PreconditionFailed:
            made.clear()  # not ours: never deleted
            return (f"{at} does not honour conditional writes: a create-only PutObject "
                    f"(If-None-Match: *) of the new key s3://{bucket}/{first} was refused (412)")
        except _NOT_A_VERDICT:
            raise
        except RemoteError as exc:  # the header itself refused (NotImplemented, ...)
            made.clear()
            return (f"{at} does not honour conditional writes: a create-only PutObject "
                    f"(If-None-Match: *) of s3://{bucket}/{first} was refused otherwise ({exc})")
        why = _refused(s3, bucket, first, b"trtet-store conditional-write probe 2\n",
                       made, if_none_match=True)
        if why is not None:
            return (f"{at} does not honour conditional writes: a second create-only "
                    f"PutObject (If-None-Match: *) of s3://{bucket}/{first} {why}, not "
                    "refused with 412")
        why = _refused(s3, bucket, missing, b"trtet-store conditional-write probe 3\n",
                       made, if_match=etag, missing_ok=True)
        if why is not None:
            return (f"{at} does not honour conditional writes: a PutObject If-Match: {etag} "
                    f"of the missing key s3://{bucket}/{missing} {why}, not refused")
        why = _refused(s3, bucket, first, b"trtet-store conditional-write probe 4\n",
                       made, if_match="0" * 32)
        if why is not None:
            return (f"{at} does not honour conditional writes: a PutObject If-Match: "
                    f"{'0' * 32} (not its ETag) of s3://{bucket}/{first} {why}, not refused "
                    "with 412")
        log.debug("%s honours conditional writes (probed under s3://%s/%s)", at, bucket, folder)
        return None
    finally:
        for key in made:
            try:
                s3.delete(bucket, key)
            except RemoteError as exc:
                log.warning("could not delete the probe object s3://%s/%s (%s); it is ours "
                            "alone and may be deleted by hand", bucket, key, exc)


def _refused(s3: S3, bucket: str, key: str, body: bytes, made: list[str], *,
             if_none_match: bool = False, if_match: str | None = None,
             missing_ok: bool = False) -> str | None:
    """None if the conditional PutObject was refused as it must be, else what happened.

    A new ``key`` joins ``made`` before the PUT (a reset after the server stored it
    still has it deleted) and leaves it when the server refused the PUT (nothing made).
    """
    added = key not in made
    if added:
        made.append(key)
    try:
        put(s3, bucket, key, body, if_none_match=if_none_match, if_match=if_match)
    except PreconditionFailed:
        why = None
    except ObjectNotFoundError:
        if not missing_ok:
            raise
        why = None  # AWS answers a missing key's If-Match with 404 NoSuchKey
    except _NOT_A_VERDICT:
        raise
    except RemoteError as exc:  # a refusal of the header itself (NotImplemented...)
        why = f"was refused otherwise ({exc})"
    else:
        return "succeeded"
    if added:
        made.remove(key)
    return why
