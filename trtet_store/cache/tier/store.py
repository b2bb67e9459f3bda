""":class:`RemoteTier`: entries (a few files and a metadata dict) under opaque keys in a bucket.

Layout under ``s3://BUCKET/PREFIX/``::

    PREFIX<key>.json                     the pointer: the commit point, written last
    PREFIX<key>.lease                    the build lease (see :mod:`.lease`)
    PREFIX<key>/<attempt>/<name>         the files, published by publish_sources
    PREFIX<key>/<attempt>/<first>.trtet.json   that publish's manifest

``<attempt>`` is ``<origin>-<digest16>`` (:func:`.entry.attempt_id`): two
machines never write one attempt directory, and a killed publisher's next
run (same origin, same bytes) resumes its own journal. A *replacement* of a
damaged entry whose attempt directory would be the damaged one's gets a
suffix (``<origin>-<digest16>-r<8 hex>``), so the new files never overwrite
the old ones in place before the pointer moves.

Every write of the pointer is conditional: ``If-None-Match: *`` for a new
entry (the first publisher wins), ``If-Match: <etag>`` for the replacement of
the damaged entry (only that version). A server that ignores either is found
out once before the first write, which it then refuses (:mod:`.probe`).

Files go up with :func:`trtet_store.remote.upload.send.publish_sources`
(multipart, CRC64NVME, journal, resume) and come down with
:func:`trtet_store.remote.download.receive.fetch` (ranged GETs pinned with
``If-Match``, resumable staging), whose checks are followed here by each
file's size and xxh3-128 digest against the pointer's: an attempt's manifest
rewritten consistently with its objects still fails the pointer's digests.
With trusted keys, each file's sha256 (taken by the download in the same
pass as its xxh3, never by reading the file back) must be the signed
pointer's too: the signature vouches for the bytes through sha256, not
through xxh3, which a forger could match. A signing publisher names each
file by sha256, taken in the pass that already reads it: its own digest
pass for a file given without digests, else the upload's (a file handed
over with its xxh3, as the local cache does); only an upload found complete
already (a publisher killed before its pointer) reads each file once for
it, checked against the xxh3 it publishes.
fetch's ``.pte``/``.ptd`` logic does not apply to these names: its neighbour
check only concerns files of the destination directory that exist and that
another ``.pte`` there needs (a download directory holds none), and a
program's needs are read only from a ``.pte`` (an engine file reads as
"unreadable": nothing needed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtet_store.cache.tier.bucket import POINTER_SUFFIX, TierBucket
from trtet_store.cache.tier.entry import (
    DamagedPointer,
    RemoteEntry,
    TierEntryError,
    attempt_id,
    check_key,
    check_origin,
    default_origin,
    file_digests,
    parse_files,
)
from trtet_store.cache.tier.lease import (
    SYSTEM_CLOCK,
    Clock,
    Lease,
    LeaseWaitTimeout,
    put,
)
from trtet_store.cache.tier.outcomes import TierDownload, TierPublish
from trtet_store.cache.tier.probe import require_conditional_writes
from trtet_store.cache.tier.signing import TierSignatureError, refusal, sign_entry
from trtet_store.io import Digests, MiB, SourceChangedError, file_identity
from trtet_store.remote.errors import (
    ConflictError,
    FetchVerificationError,
    KeyExistsError,
    ManifestError,
    ObjectChangedError,
    ObjectNotFoundError,
    RemoteURLError,
)
from trtet_store.remote.jsondoc import POINTER_MAX_BYTES
from trtet_store.remote.keyconfig import resolve_keys
from trtet_store.remote.manifest import MANIFEST_SUFFIX, Manifest
from trtet_store.remote.s3 import S3, PreconditionFailed
from trtet_store.remote.url import RemoteURL

#: The chunk span named with a digest that came without chunk digests (any will do).
_CHUNK = MiB

__all__ = ["LeaseWaitTimeout", "RemoteTier", "TierDownload", "TierPublish"]

log = logging.getLogger("trtet_store.cache.tier")



class RemoteTier:
    """The shared tier: entries under opaque keys in ``s3://bucket/prefix``; leases.

    Parameters
    ----------
    url : str
        ``s3://bucket`` or ``s3://bucket/prefix`` (a trailing ``/`` is optional).
    endpoint_url : str, optional
        The S3 server (default: what boto3 finds, ``AWS_ENDPOINT_URL``...).
    client : boto3 client or :class:`~trtet_store.remote.s3.S3`, optional
        Used as it is for every call, the upload's too.
    origin : str, optional
        This machine's (or cache directory's) id, the start of its attempt
        directories' names. Default: the host name.
    lease_ttl : float
        Seconds a lease of ours stays live without a renewal (renewed every third).
    poll : float
        Seconds between looks while waiting on another holder's lease.
    concurrency : int
        Parts (or ranges) in flight.
    journal_dir : path-like, optional
        The publish journals' folder (default: publish's).
    connect_timeout : float
        Seconds to wait for a connection; with two attempts per call, an
        unreachable server costs seconds, not minutes.
    range_size : int, optional
        Bytes per ranged GET of a download (fetch's default, 32 MiB; at least
        1 MiB). A cut download keeps its complete ranges.
    signing_key : path-like or SigningKey, optional
        An ed25519 private key file: every pointer this tier writes is signed
        (:mod:`.signing`), and every build lease it writes (:mod:`.lease`).
        Default: ``TRTET_SIGNING_KEY``, else the config file's
        (:mod:`trtet_store.remote.keyconfig`), else none.
    trusted_keys : sequence of path-like or PublicKey, optional
        Public key files: :meth:`download` then refuses (``TierSignatureError``,
        before a byte is downloaded) every entry not signed by one of them,
        and every file whose sha256 is not the signed pointer's; and
        :meth:`claim` waits only on a build lease signed by one of them
        (any other lease is ignored, said once at WARNING, and taken over).
        Default: ``TRTET_TRUSTED_KEYS``, else the config file's, else none
        (every entry accepted).

    Attributes
    ----------
    clock : :class:`~trtet_store.cache.tier.lease.Clock`
        The clocks and sleep a :meth:`claim`'s wait uses (the system's; a
        test sets its own to drive time).

    Raises
    ------
    RemoteURLError
        ``url`` is not ``s3://bucket[/prefix]`` (no request is made).
    ValueError, TypeError
        A bad ``lease_ttl``, ``poll``, ``concurrency``, ``origin`` or
        ``connect_timeout``; an unknown keyword (TypeError).
    """

    def __init__(self, url: str, *, endpoint_url: str | None = None, client: Any = None,
                 origin: str | None = None, lease_ttl: float = 300.0, poll: float = 2.0,
                 concurrency: int = 4, journal_dir: os.PathLike | str | None = None,
                 connect_timeout: float = 5.0, range_size: int | None = None,
                 signing_key: Any = None, trusted_keys: Any = None) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str like 's3://bucket/prefix', not {url!r}")
        # RemoteURL checks the bucket and every segment; a dummy last segment makes a
        # bare bucket (or a prefix) a valid object URL to it.
        try:
            parsed = RemoteURL.parse(url.rstrip("/") + "/x")
        except RemoteURLError as exc:
            # Said of the URL given, not of the probe object under it.
            why = str(exc).partition(": ")[2].replace("s3://bucket/key",
                                                      "s3://bucket or s3://bucket/prefix")
            if not url.startswith("s3://") or url.rstrip("/") == "s3:/":
                why = "expected s3://bucket or s3://bucket/prefix"
            raise RemoteURLError(f"{url!r}: {why}") from None
        self.bucket = parsed.bucket
        head = parsed.key[:-1]  # "" or "prefix/"
        self.prefix = head
        self.url = f"s3://{self.bucket}/{head}".rstrip("/") if head else f"s3://{self.bucket}"
        for name, value in (("lease_ttl", lease_ttl), ("poll", poll),
                            ("connect_timeout", connect_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, not {value!r}")
            if not value > 0:  # NaN too
                raise ValueError(f"{name} must be more than 0 seconds, not {value}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, not {concurrency!r}")
        self.origin = check_origin(origin) if origin is not None else default_origin()
        self.lease_ttl = float(lease_ttl)
        self.poll = float(poll)
        self.concurrency = concurrency
        self.journal_dir = journal_dir
        from trtet_store.remote.download.options import DEFAULT_RANGE_SIZE, check_options

        self.range_size = DEFAULT_RANGE_SIZE if range_size is None else range_size
        check_options(concurrency=concurrency, range_size=self.range_size)
        if isinstance(client, S3):
            self.s3 = client
        else:
            # Two attempts a call, a short connect timeout: a server that is down
            # costs seconds (the export goes on locally), not botocore's minutes.
            self.s3 = S3(endpoint_url, client=client, max_connections=concurrency + 2,
                         retries=2, connect_timeout=connect_timeout, read_timeout=60)
        self._told_damaged: set[tuple[str, str]] = set()  # (key, etag) warned about
        self.endpoint_url = endpoint_url or getattr(
            getattr(self.s3.client, "meta", None), "endpoint_url", None)
        #: The key every pointer written here is signed with (None: unsigned).
        #: {key id: PublicKey}: the keys an entry must be signed by (None: any entry).
        self.signing_key, self.trusted_keys = resolve_keys(signing_key, trusted_keys)
        self.clock: Clock = SYSTEM_CLOCK

    def __repr__(self) -> str:
        return f"RemoteTier({self.url!r}, origin={self.origin!r})"

    # --- names -----------------------------------------------------------------------

    def _pointer(self, key: str) -> str:
        return f"{self.prefix}{key}{POINTER_SUFFIX}"

    def _url(self, object_key: str) -> str:
        return f"s3://{self.bucket}/{object_key}"

    @property
    def where(self) -> TierBucket:
        """What claim, probe and prune take of this tier (made now from its attributes)."""
        return TierBucket(self.s3, self.bucket, self.prefix, self.url, self.endpoint_url,
                          self.lease_ttl, self.poll, self.signing_key, self.trusted_keys,
                          self.clock)

    # --- reading ---------------------------------------------------------------------

    def check(self) -> None:
        """Raise unless the bucket is usable.

        Raises
        ------
        EndpointUnreachableError, AccessDeniedError, BucketNotFoundError
        """
        self.s3.check_bucket(self.bucket)

    def read_pointer(self, key: str) -> RemoteEntry | DamagedPointer | None:
        """The pointer of ``key``: its entry, a :class:`DamagedPointer`, or None (none).

        Read only when it is at most :data:`POINTER_MAX_BYTES` (its size is
        checked before its body), parsed with a depth cap.

        Raises
        ------
        RemoteError
            The server could not be asked (unreachable, denied, no bucket).
        """
        check_key(key)
        got = self.s3.get_dated(self.bucket, self._pointer(key), POINTER_MAX_BYTES)
        if got is None:
            return None
        if got.data is None:
            return DamagedPointer(key, got.etag, got.size, f"{got.size} bytes, more than the "
                                  f"{POINTER_MAX_BYTES} a pointer may be; not read")
        try:
            return RemoteEntry.from_json(got.data, got.etag, key)
        except ValueError as exc:
            return DamagedPointer(key, got.etag, got.size, str(exc))

    def lookup(self, key: str) -> RemoteEntry | None:
        """The committed entry of ``key``, or None (none; or a damaged pointer, warned once).

        Raises
        ------
        RemoteError
            The server could not be asked (unreachable, denied, no bucket).
        """
        got = self.read_pointer(key)
        if isinstance(got, DamagedPointer):
            if (got.key, got.etag) not in self._told_damaged:
                self._told_damaged.add((got.key, got.etag))
                log.warning("%s: the pointer of %s cannot be read (%s); taken as no entry, "
                            "the next publish of it replaces it", self.url, key, got.reason)
            return None
        return got

    def listing(self) -> tuple[list[RemoteEntry], list[DamagedPointer]]:
        """Every entry (pointers that parse) and every damaged pointer, in key order."""
        out: list[RemoteEntry] = []
        damaged: list[DamagedPointer] = []
        for k in sorted(self.s3.list_keys(self.bucket, self.prefix)):
            name = k[len(self.prefix):]
            if not name.endswith(POINTER_SUFFIX) or name.endswith(MANIFEST_SUFFIX):
                continue
            key = name[:-len(POINTER_SUFFIX)]
            try:
                check_key(key)
            except ValueError:
                continue
            got = self.read_pointer(key)
            if isinstance(got, DamagedPointer):
                damaged.append(got)
            elif got is not None:
                out.append(got)
        return out, damaged

    def entries(self) -> list[RemoteEntry]:
        """Every entry whose pointer parses, in key order (damaged ones: :meth:`listing`)."""
        return self.listing()[0]

    def signature_problem(self, entry: RemoteEntry) -> str | None:
        """Why this tier's trusted keys refuse ``entry`` (None: accepted, or no trusted keys)."""
        return None if self.trusted_keys is None else refusal(entry, self.trusted_keys)

    def check_signature(self, entry: RemoteEntry) -> None:
        """Raise :class:`TierSignatureError` when :meth:`signature_problem` has a reason."""
        why = self.signature_problem(entry)
        if why is not None:
            raise TierSignatureError(f"{self.url}: entry {entry.key} is refused: {why}; it is "
                                     "not used", entry.key, why)

    def download(self, entry: RemoteEntry, directory: os.PathLike | str, *,
                 progress: Callable[..., Any] | None = None) -> TierDownload:
        """Download ``entry``'s files into ``directory`` (created), checked against the pointer.

        The first file is fetched with its manifest (the others beside it),
        pinned with ``If-Match`` to the versions the manifest names and with
        no restart on a change; then each file's size and xxh3-128 digest must
        be the pointer's. The same directory again continues a cut download
        (and downloads nothing when it is complete).

        With trusted keys, the entry's signature is checked first: the files
        are then checked against the digests that signature covers, their
        sha256 (taken as the bytes arrive) included.

        Raises
        ------
        TierSignatureError
            (a TierEntryError) The trusted keys refuse the entry (not signed,
            another signer, a pointer changed after signing): nothing downloaded.
        TierEntryError
            The entry's files fail a check (replaced, truncated, other bytes,
            a manifest naming other files): its files are removed from
            ``directory``; never served.
        RemoteError
            The network or server failed (a later call resumes).
        """
        if not isinstance(entry, RemoteEntry):
            raise TypeError(f"entry must be a RemoteEntry (from lookup), not {entry!r}")
        self.check_signature(entry)  # before a byte: entry.files below are the signed ones
        # With trusted keys the signature vouches for the bytes by their sha256 only.
        signed = self.trusted_keys is not None
        from trtet_store.remote.download.receive import fetch

        start = time.monotonic()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = [f["name"] for f in entry.files]
        paths = {n: directory / n for n in names}
        url = self._url(f"{self.prefix}{entry.attempt}{names[0]}")
        try:
            report = fetch(url, paths[names[0]], client=self.s3, if_replaced="error",
                           max_restarts=0, concurrency=self.concurrency,
                           range_size=self.range_size, progress=progress, names=names,
                           sha256=signed, trusted_keys=False)  # the pointer vouches
        except (ObjectChangedError, FetchVerificationError, ManifestError,
                ObjectNotFoundError) as exc:
            self._discard(paths)
            raise TierEntryError(f"{self.url}: entry {entry.key} is damaged ({exc}); it is "
                                 "not used", entry.key) from exc
        got = [o.name for o in report.objects]
        if got != names:
            self._discard(paths)
            raise TierEntryError(f"{self.url}: entry {entry.key}'s manifest names {got}, its "
                                 f"pointer {names}; it is not used", entry.key)
        digests = {o.name: _arrived(o, signed) for o in report.objects}
        for f in entry.files:
            # Digested as the bytes arrived (never read back); a file resumed from a
            # cut download, or already complete, is read once here.
            got = digests.get(f["name"]) or file_digests(paths[f["name"]], sha256=signed)
            digests[f["name"]] = got
            size, digest = got.size, got.digest
            if size != f["size"] or digest != f["digest"]:
                self._discard(paths)
                raise TierEntryError(
                    f"{self.url}: entry {entry.key}, file {f['name']}: {size} bytes with "
                    f"xxh3-128 {digest}, the pointer says {f['size']} bytes, {f['digest']}; "
                    "it is not used", entry.key, f["name"])
            if signed and got.sha256 != f.get("sha256"):
                self._discard(paths)
                raise TierEntryError(
                    f"{self.url}: entry {entry.key}, file {f['name']}: sha256 {got.sha256}, "
                    f"the signed pointer says {f.get('sha256')}; it is not used", entry.key,
                    f["name"])
        return TierDownload(paths, report.bytes_downloaded, time.monotonic() - start,
                            {n: d for n, d in digests.items() if d is not None})

    @staticmethod
    def _discard(paths: Mapping[str, Path]) -> None:
        for p in paths.values():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    # --- writing ---------------------------------------------------------------------

    def publish(self, key: str, files: Sequence[tuple[Any, ...]], metadata: Mapping[str, Any],
                *, replace: RemoteEntry | None = None,
                progress: Callable[..., Any] | None = None) -> TierPublish:
        """Publish ``files`` with ``metadata`` as the entry of ``key``; the first writer wins.

        Parameters
        ----------
        key : str
            The entry's key (one S3 key segment).
        files : sequence of (name, path) or (name, path, xxh3-128 digest)
            The entry's files, in order (the first carries the manifest).
        metadata : mapping
            JSON-serialisable; stored in the pointer.
        replace : RemoteEntry, optional
            The damaged entry to replace: the pointer is written with
            ``If-Match`` its ETag, then the old attempt's objects are deleted.
        progress : callable, optional
            publish_sources' progress (a :class:`~trtet_store.remote.report.PublishProgress`).

        Returns
        -------
        TierPublish
            ``published=False`` with a reason when another pointer is there
            (before or after our upload: then our objects are deleted).

        Raises
        ------
        ConditionalWritesUnsupportedError
            The server ignores ``If-None-Match``/``If-Match`` (:mod:`.probe`): nothing sent.
        RemoteError
            The upload failed (unreachable, denied; an interrupted upload is
            kept for the next publish of the same files to resume).
        """
        from trtet_store.remote.upload.config import PublishConfig
        from trtet_store.remote.upload.send import publish_sources
        from trtet_store.remote.upload.source import ObjectSource

        check_key(key)
        parsed = parse_files(files)
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
        try:
            json.dumps(dict(metadata))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata must be JSON-serialisable: {exc}") from None
        if replace is not None and not isinstance(replace, RemoteEntry):
            raise TypeError(f"replace must be the RemoteEntry to replace, not {replace!r}")
        if replace is not None and replace.key != key:
            raise ValueError(f"replace is the entry of {replace.key!r}, not of {key!r}")
        described = []
        signing = self.signing_key is not None
        for name, path, digest, sha in parsed:
            size = path.stat().st_size
            if digest is None:
                got = file_digests(path, sha256=signing)  # one pass for both digests
                size, digest, sha = got.size, got.digest, got.sha256
            one = {"name": name, "size": size, "digest": digest}
            if signing and sha is not None:
                one["sha256"] = sha
            described.append(one)

        current = self.read_pointer(key)
        # A pointer nobody can read is replaced by the next publisher (If-Match its ETag).
        damaged = current if isinstance(current, DamagedPointer) else None
        current = None if damaged is not None else current
        if replace is None and current is not None:
            return TierPublish(key, False, f"already in the shared cache (origin "
                               f"{current.origin}, host {current.host})", 0, current)
        if replace is not None and (current is None or current.etag != replace.etag):
            return TierPublish(key, False, "the entry to replace was replaced or removed "
                               "meanwhile", 0, current)
        require_conditional_writes(self.where)  # before our first write; after a read
        attempt = attempt_id(self.origin, described)
        if replace is not None and replace.attempt == f"{key}/{attempt}/":
            attempt += f"-r{os.urandom(4).hex()}"
        adir = f"{self.prefix}{key}/{attempt}/"
        first = described[0]["name"]
        sources = [ObjectSource.of_file(path, name) for name, path, _, _ in parsed]
        for source in sources:  # a file handed over with its xxh3 only: sha256 from the upload
            source.want_sha256 = signing
        config = PublishConfig(concurrency=self.concurrency, journal_dir=self.journal_dir,
                               index=False)
        sent = 0
        for again in (False, True):
            try:
                report = publish_sources(sources, self._url(adir + first),
                                         endpoint_url=self.endpoint_url, replace=False,
                                         config=config, progress=progress, client=self.s3)
                sent = report.bytes_sent
            except KeyExistsError:
                # Our own attempt directory is already complete: a run killed between
                # its manifest and its pointer. Its objects are committed if they are
                # still the files we mean; else they are removed and sent again (once).
                if self._check_attempt(key, adir, described):
                    break
                if again:
                    raise ConflictError(f"{self._url(adir)}: objects of other bytes keep "
                                        "appearing in our attempt directory", adir) from None
                continue
            except ConflictError as exc:
                # Another publish of this very attempt runs on this machine (its
                # journal is locked): it commits the pointer, not us.
                return TierPublish(key, False, f"not published: {exc}", 0, self.lookup(key))
            break

        if signing:
            _name_by_sha256(described, parsed, sources)
        entry = RemoteEntry(key, "", time.time(), self.origin, socket.gethostname(),
                            f"{key}/{attempt}/", described, dict(metadata))
        if self.signing_key is not None:
            sign_entry(entry, self.signing_key)
        try:
            pinned = replace.etag if replace is not None else getattr(damaged, "etag", None)
            etag = put(self.s3, self.bucket, self._pointer(key), entry.to_json(),
                       if_none_match=pinned is None, if_match=pinned)
        except PreconditionFailed:
            winner = self.lookup(key)
            if winner is None or winner.attempt != entry.attempt:
                self.where.remove_attempt(adir)
            if winner is None:
                why = ("the pointer there is not one this version reads, or was removed "
                       "meanwhile" if replace is None else
                       "the entry to replace was replaced or removed meanwhile")
            else:
                why = (f"another machine published it first (host {winner.host}, origin "
                       f"{winner.origin})")
            log.info("%s: %s: not published: %s; our upload is removed", self.url, key, why)
            return TierPublish(key, False, why, sent, winner)
        entry.etag = etag
        if replace is not None and replace.attempt != entry.attempt:
            self.where.remove_attempt(f"{self.prefix}{replace.attempt}")
        return TierPublish(key, True, None, sent, entry)

    def _check_attempt(self, key: str, adir: str, described: list[dict[str, Any]]) -> bool:
        """Whether our completed attempt directory ``adir`` holds ``described``'s files.

        When it does not (other bytes, a manifest that does not parse or names
        other files, objects of other versions than it names), it is removed,
        so that a publish can send it again.
        """
        first = described[0]["name"]
        got = self.s3.get(self.bucket, adir + first + MANIFEST_SUFFIX)
        ok = got is not None
        if ok:
            try:
                manifest = Manifest.from_json(got[0])
            except ManifestError:
                ok = False
        if ok:
            ok = [o.name for o in manifest.objects] == [d["name"] for d in described]
        if ok:
            for o, d in zip(manifest.objects, described, strict=True):
                head = self.s3.head(self.bucket, o.key)
                # A file is one piece: its xxh3-128 is the file's digest.
                same = len(o.pieces) == 1 and o.pieces[0].xxh3 == d["digest"]
                if o.size != d["size"] or not same or head is None or head.etag != o.etag:
                    ok = False
                    break
        if not ok:
            log.warning("%s: the completed attempt %s does not hold these files as it "
                        "stands; it is removed and sent again", self.url, adir)
            self.where.remove_attempt(adir)
            return False
        log.info("%s: %s: the upload of %s was complete already; committing it", self.url,
                 key, adir)
        return True

    def delete(self, entry: RemoteEntry) -> None:
        """Delete ``entry``: its pointer (``If-Match`` its ETag) first, then its objects.

        Raises
        ------
        ObjectChangedError
            The pointer is another version now (nothing deleted).
        """
        if not isinstance(entry, RemoteEntry):
            raise TypeError(f"entry must be a RemoteEntry, not {entry!r}")
        self.s3.delete(self.bucket, self._pointer(entry.key), if_match=entry.etag)
        self.where.remove_attempt(f"{self.prefix}{entry.attempt}")

    def prune(self, older_than: float, *, dry_run: bool = False,
              kept: dict[str, str] | None = None) -> list[str]:
        """Remove entries, orphan attempt directories and dead leases older than ``older_than`` s.

        An entry goes by its pointer's ``created`` (pointer first, ``If-Match``,
        then its objects). An attempt directory no pointer names (a race's
        loser, a killed publisher) goes when its newest object (or open
        upload) is older; it is looked at once more right before, so an
        attempt a pointer names by then is kept. A lease goes when unchanged
        for longer and for two of its (capped) ttls on the server's clock (a
        live one is renewed every ttl/3): :func:`.lease.prunable`.

        Returns
        -------
        list of str
            What was (or, with ``dry_run``, would be) removed: keys of entries,
            ``<key>/<attempt>/`` of attempt directories, ``<key>.lease``. ``kept``
            (given) gets the entries and leases the sweep kept, named so, and why.
        """
        from trtet_store.cache.tier.prune import prune

        return prune(self.where, older_than, dry_run=dry_run, entries=self.entries,
                     lookup=self.lookup, kept=kept)

    # --- leases ----------------------------------------------------------------------

    def claim(self, key: str, *, timeout: float | None = None,
              on_wait: Callable[[dict[str, Any]], None] | None = None) -> Lease | RemoteEntry:
        """The entry of ``key`` if there is one, else the build lease on it, waiting if needed.

        Loop: an entry -> returned. No lease -> ours (``If-None-Match: *``).
        Another holder's lease -> wait (every ``poll`` s), returning the entry
        as soon as it appears, and taking the lease over (``If-Match`` its
        ETag: of two waiters one wins) once it is dead: older than its ttl on
        the server's clock (the answer's Date less its Last-Modified), or its
        ETag unchanged for its ttl on ours; or claiming it once it is deleted.
        The ttl a lease claims is capped at twice our ``lease_ttl`` (a
        damaged one is ours). The wait is logged at WARNING when it starts
        (holder, until when) and once when it outlasts the lease's ttl. With
        ``trusted_keys``, only a lease signed by one of them is waited on
        (another is ignored, said once, and taken over at once), and a
        signed lease counts as renewed only when its signed beat moves on.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most (default: no limit).
        on_wait : callable, optional
            Called with the other holder's lease dict at each look while waiting.

        Raises
        ------
        LeaseWaitTimeout
            ``timeout`` passed with another holder's lease still live.
        ConditionalWritesUnsupportedError
            The server ignores ``If-None-Match``/``If-Match`` (:mod:`.probe`): no lease.
        RemoteError
            The server could not be asked.
        """
        from trtet_store.cache.tier.claim import claim

        return claim(self.where, self.lookup, key, timeout=timeout, on_wait=on_wait)


def _name_by_sha256(described: list[dict[str, Any]], parsed: Sequence[tuple[Any, ...]],
                    sources: Sequence[Any]) -> None:
    """Add each file's sha256 to ``described``: the upload's pass took it, else one read.

    A file read once (here or by the upload) must have the xxh3-128 it is
    described with, so the signed sha256 is of the bytes the pointer names.
    """
    for d, (_, path, _, _), source in zip(described, parsed, sources, strict=True):
        if "sha256" in d:
            continue
        if source.sha256 is not None:  # the upload read it whole, in order: no read here
            if source.sha256_xxh3 != d["digest"]:
                raise SourceChangedError(path, f"the upload read bytes with xxh3-128 "
                                         f"{source.sha256_xxh3}, not the {d['digest']} it "
                                         "was published with")
            d["sha256"] = source.sha256
            continue
        got = file_digests(path, sha256=True)  # an upload resumed or found complete
        if got.digest != d["digest"] or got.size != d["size"]:
            raise SourceChangedError(path, f"its xxh3-128 is {got.digest} ({got.size} bytes), "
                                     f"not the {d['digest']} it was published with")
        d["sha256"] = got.sha256


def _arrived(obj: Any, sha256: bool = False) -> Digests | None:
    """A fetched object's digests as its bytes arrived, with its file's identity now; or None.

    ``sha256``: None too when the download did not take the object's sha256.
    """
    if obj.digest is None or (sha256 and obj.sha256 is None):
        return None
    try:
        st = os.stat(obj.path)
    except FileNotFoundError:
        return None
    if st.st_size != obj.size:
        return None
    chunk_size = obj.chunk_size or _CHUNK
    return Digests(obj.digest, obj.size, chunk_size,
                   obj.chunk_digests if obj.chunk_size else None, file_identity(st),
                   obj.sha256)
