"""The publish: objects streamed from their pieces into conditional multipart uploads.

One publish, in order:

1. **Refuse early** (nothing is created): a piece not as sealed, a missing
   bucket, refused credentials, a key that another program's manifest names
   (with or without ``replace``: see *Neighbours* below), a key that exists
   without ``replace=True``, a part size that cannot fit.
2. **Plan**: equal-size parts per object; with an earlier version (its
   manifest) or the engine-digest index, the parts lying inside unchanged
   ranges are copied server-side (:mod:`.delta`). The plan, and the ETags
   the conditional writes are planned against, go to the journal first.
3. **Send**: the reader (this thread) reads each part's bytes in order
   straight from the pieces (a part buffer, never a local file) and digests
   every piece as it passes; at most ``concurrency`` parts are in flight on
   worker threads, which hash (CRC64NVME, sent with the part), journal,
   and send or copy. Memory is ``(concurrency + 1) x
   part_size``. A refused checksum (BadDigest) is sent again; a network
   failure is retried; when retries run out the upload is kept for resume.
4. **Complete** each object with its full-object CRC64NVME (the parts'
   CRCs combined), ``If-None-Match: *`` for a new key or ``If-Match`` of
   the version read at plan time, after checking that the manifest is
   still the one planned against; check HeadObject's checksum against ours.
5. **Commit**: the manifest, last, with the same conditions. Then the
   replaced version's objects that the new manifest no longer names are
   removed (only where no other manifest names them, and only at the ETag
   the replaced manifest named). The journal is removed.

**Neighbours.** ExecuTorch names ``.ptd`` files by tag, so two programs
under one prefix share names (``a.pte`` and ``b.pte`` each with a
``cpu.ptd``). Objects stay beside their program (no per-program
namespace: that is where the runtime and ``fetch`` look for them), and a
key belongs to the program whose manifest names it: before writing or
removing key K, the manifests in K's directory (``*.trtet.json``) are read,
and a K that any manifest other than this program's own names is refused
with :class:`~trtet_store.remote.errors.OwnedByOtherProgramError`, which
names the owner and suggests a prefix of its own.

A resumed publish (a journal for the same destination and the same pieces)
re-reads the bytes (to digest them) and asks ListParts what the server
holds: a part whose ETag the journal recorded, with the same CRC64NVME as
the bytes now, is kept; a part stored but not journaled (a kill between the
server's answer and the journal) is kept when its ETag is the MD5 of the
bytes; every other part is sent.

Here: :func:`publish_sources` and its steps, :func:`_plan` (1 and 2),
:func:`_send` (3) and :func:`_commit` (4 and 5), with the Complete and the
manifest's conditional write. Beside it: :mod:`.plan` (each object's plan,
a resume, the server-side copies), :mod:`.transfer` (the parts sent and
copied) and :mod:`.owners` (the neighbours rule).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.io import UNSET, SourceChangedError
from trtet_store.remote import checksum
from trtet_store.remote.errors import (
    ChecksumMismatchError,
    ConflictError,
    KeyExistsError,
    RemoteError,
    UploadKeptError,
)
from trtet_store.remote.manifest import (
    SIGNATURE_DOMAIN,
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    crc64nvme_b64,
    manifest_key,
)
from trtet_store.remote.report import ObjectReport, PublishProgress, PublishReport
from trtet_store.remote.s3 import S3, BadDigest, NoSuchUpload, PreconditionFailed, Transient
from trtet_store.remote.signing import sign_document
from trtet_store.remote.upload.config import (  # noqa: F401 - DEFAULT_CONCURRENCY re-exported
    DEFAULT_CONCURRENCY,
    PublishConfig,
    config_of,
    replace_of,
)
from trtet_store.remote.upload.index import update_index
from trtet_store.remote.upload.journal import Journal, default_dir, journal_path
from trtet_store.remote.upload.owners import owned_error, owners_of
from trtet_store.remote.upload.owners import remove_replaced as _remove_replaced
from trtet_store.remote.upload.parts import choose_part_size, plan_parts
from trtet_store.remote.upload.plan import DIGEST_WINDOW, ObjectUpload, fingerprint, resume_state
from trtet_store.remote.upload.plan import plan_copies as _plan_copies
from trtet_store.remote.upload.resume_plan import journaled_part_sizes, plan_difference
from trtet_store.remote.upload.source import ObjectSource, Reader
from trtet_store.remote.upload.transfer import BAD_DIGEST_ATTEMPTS, Counters, send_object
from trtet_store.remote.upload.unfinished import open_uploads
from trtet_store.remote.url import RemoteURL

# _plan_copies and _remove_replaced: the steps below call them by these names, where tests
# stand in for them (a race planted between two steps).

log = logging.getLogger("trtet_store.remote")


def publish_sources(
    sources: list[ObjectSource],
    url: str | RemoteURL,
    *,
    endpoint_url: str | None = None,
    config: PublishConfig | None = None,
    replace: bool = UNSET,
    if_exists: str = UNSET,
    resume: bool = True,
    progress: Callable[[PublishProgress], Any] | None = None,
    part_size: int | None = UNSET,
    concurrency: int = UNSET,
    journal_dir: os.PathLike | str | None = UNSET,
    index: bool = UNSET,
    client: S3 | None = None,
    signing_key: Any = None,
) -> PublishReport:
    """Publish ``sources`` (the program first) to ``url``; see :func:`trtet_store.publish`.

    ``config``, ``replace``/``if_exists`` and the old keywords ``part_size``,
    ``concurrency``, ``journal_dir``, ``index`` are as for ``publish``.
    ``client``: the :class:`~trtet_store.remote.s3.S3` every call goes through
    (a shared tier's own, with its credentials); default one made at
    ``endpoint_url`` the way boto3 finds credentials.

    The destination's journal is locked for the whole publish, before it is
    read: a second publish of the same key on this machine (a process or a
    thread) raises :class:`ConflictError` at once, having read, sent and
    created nothing, instead of taking the live journal for an interrupted
    one. The lock dies with the process, so a killed publish resumes.

    ``signing_key``: a loaded :class:`~trtet_store.remote.keys.SigningKey`
    (resolved by the caller), or None: the manifest names every object and
    every chunk by sha256 too, taken in the pass that reads the bytes, and
    is signed (:func:`_signed_body`).
    """
    cfg = config_of(config, "publish_sources", part_size=part_size, concurrency=concurrency,
                    journal_dir=journal_dir, index=index)
    replace = replace_of(replace, if_exists, "publish_sources")
    dest = url if isinstance(url, RemoteURL) else RemoteURL.parse(url)
    return _publish(sources, dest, cfg, _Mode(), endpoint_url=endpoint_url, replace=replace,
                    resume=resume, progress=progress, client=client, signing_key=signing_key)


@dataclass(frozen=True)
class _Mode:
    """What a caller inside trtet_store may change about a publish (never a user).

    ``neighbours``: read the manifests beside the key for their owners
    (:mod:`.owners`). ``renew``: an object identical to the version there is
    sent again (copied server-side where it can), never kept as it is.
    """

    neighbours: bool = True
    renew: bool = False


def publish_blob(source: ObjectSource, url: RemoteURL, *, config: PublishConfig,
                 resume: bool, client: S3, renew: bool = False,
                 progress: Callable[[PublishProgress], Any] | None = None) -> PublishReport:
    """Publish one content-addressed object (a set's ``blobs/<xxh3-128 hex>``), replacing.

    As :func:`publish_sources` with ``replace=True``, but without the
    neighbours' scan: a key named by the digest of its bytes has one
    possible manifest, its own (``<hex>.trtet.json``), so no other program
    can own it, and a listing of the folder (one GET per blob beside it)
    per blob would make a set's publish quadratic in its blobs. ``renew``:
    a new version even of the same bytes (see :class:`_Mode`); with another
    ``config.part_size`` than the version there, its ETag differs.
    ``progress`` as for :func:`publish_sources`.
    """
    return _publish([source], url, config, _Mode(neighbours=False, renew=renew),
                    endpoint_url=None, replace=True, resume=resume, progress=progress,
                    client=client)


def _publish(sources: list[ObjectSource], dest: RemoteURL, cfg: PublishConfig, mode: _Mode,
             *, endpoint_url: str | None, replace: bool, resume: bool,
             progress: Callable[[PublishProgress], Any] | None,
             client: S3 | None, signing_key: Any = None) -> PublishReport:
    """Lock the destination's journal, then publish."""
    if signing_key is not None:
        # Every pass that reads an object whole (the upload's, a resume's check) takes
        # its sha256 and each chunk's from the same buffers: no read of its own.
        for s in sources:
            s.want_sha256 = s.want_chunk_sha256 = True
    jdir = Path(cfg.journal_dir) if cfg.journal_dir is not None else default_dir()
    journal = Journal(journal_path(jdir, dest.bucket, dest.key),
                      {"sources": _local_dirs(sources)})
    journal.lock(str(dest), dest.key)
    try:
        return _publish_locked(sources, dest, journal, endpoint_url=endpoint_url,
                               part_size=cfg.part_size, concurrency=cfg.concurrency,
                               replace=replace, resume=resume, progress=progress,
                               index=cfg.index, client=client, mode=mode,
                               signing_key=signing_key)
    finally:
        journal.unlock()


def _local_dirs(sources: Any) -> list[str]:
    """The folders of the local files a publish reads (``recover DIR`` lists its own)."""
    dirs = set()
    for s in sources if isinstance(sources, (list, tuple)) else ():
        for piece in getattr(s, "pieces", ()):
            path = getattr(piece, "path", None)
            if isinstance(path, (str, os.PathLike)):
                dirs.add(os.path.dirname(os.path.abspath(path)))
    return sorted(dirs)


def _publish_locked(
    sources: list[ObjectSource],
    url: str | RemoteURL,
    journal: Journal,
    *,
    endpoint_url: str | None,
    part_size: int | None,
    concurrency: int,
    replace: bool,
    resume: bool,
    progress: Callable[[PublishProgress], Any] | None,
    index: bool,
    client: S3 | None = None,
    mode: _Mode = _Mode(),
    signing_key: Any = None,
) -> PublishReport:
    """:func:`publish_sources` with its ``journal`` locked: plan, send, commit."""
    start = time.monotonic()
    run = _plan(sources, url, journal, endpoint_url=endpoint_url, part_size=part_size,
                concurrency=concurrency, replace=replace, resume=resume, index=index,
                client=client, mode=mode)
    run.signing_key = signing_key
    s3, bucket, dest, objs = run.s3, run.dest.bucket, run.dest, run.objs
    counters = Counters()
    total = sum(o.source.size for o in objs)

    def report_progress() -> None:
        if progress is not None:
            with counters.lock:
                p = PublishProgress(counters.sent + counters.copied + counters.resumed
                                    + counters.unchanged, total, counters.sent, counters.copied,
                                    counters.resumed, counters.unchanged)
            progress(p)

    try:
        _send(run, counters, concurrency, report_progress)
        manifest, metag = _commit(run, counters, report_progress)
    except (SourceChangedError, ConflictError) as exc:
        log.error("publish %s failed (%s); its uploads are aborted, nothing a reader takes "
                  "was published", dest, exc)
        _abort_all(s3, bucket, objs)
        journal.remove()
        raise
    except (Transient, BadDigest) as exc:
        journal.close()
        uid = next((o.upload_id for o in objs if o.upload_id and o.completed is None), "")
        key = next((o.key for o in objs if o.upload_id and o.completed is None), dest.key)
        cls = ChecksumMismatchError if isinstance(exc, BadDigest) else UploadKeptError
        raise cls(f"publishing {dest} stopped: {exc}. The upload is kept: run the same "
                  "publish again (trtet-store publish --resume) to send only what is missing, "
                  "or abort it (--abort)", key, uid, os.fspath(journal.path)) from exc
    except BaseException:
        journal.close()
        raise
    journal.remove()
    if index:
        update_index(s3, bucket, manifest)

    reports = [o.report for o in objs]
    rep = PublishReport(url=str(dest), manifest_key=run.mkey, manifest_etag=metag,
                        objects=reports, bytes_total=total, bytes_sent=counters.sent,
                        bytes_copied=counters.copied, bytes_resumed=counters.resumed,
                        bytes_unchanged=counters.unchanged,
                        parts=sum(len(o.parts) for o in objs),
                        checksum=objs[0].completed["crc64nvme"],
                        seconds=time.monotonic() - start, retries=counters.retries)
    log.info("published %s: %d object(s), %d bytes: %d sent, %d copied server-side, %d "
             "resumed, %d unchanged, in %.1f s", dest, len(objs), total, rep.bytes_sent,
             rep.bytes_copied, rep.bytes_resumed, rep.bytes_unchanged, rep.seconds)
    return rep


@dataclass
class _Run:
    """One publish as planned: where it goes, its objects, the versions it writes against."""

    s3: S3
    dest: RemoteURL
    mkey: str
    objs: list[ObjectUpload]
    journal: Journal
    manifest_base: str | None | bool  # the manifest replaced (If-Match); falsy: a new one
    previous: dict[str, str]  # the replaced version's objects, {key: etag}
    mode: _Mode = _Mode()
    signing_key: Any = None  # a SigningKey: the manifest is signed (_signed_body)


# --- 1 and 2: refuse early, plan -------------------------------------------------------


def _plan(sources: list[ObjectSource], url: str | RemoteURL, journal: Journal, *,
          endpoint_url: str | None, part_size: int | None, concurrency: int, replace: bool,
          resume: bool, index: bool, client: S3 | None, mode: _Mode = _Mode()) -> _Run:
    """Refuse what cannot be published (nothing created), then plan it and journal the plan.

    A journal of the same pieces is resumed (``resume``); another one's
    uploads are aborted. Part sizes, the conditions each write will carry
    and the server-side copies are planned here, before any byte is sent.
    """
    dest = url if isinstance(url, RemoteURL) else RemoteURL.parse(url)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive int, not {concurrency!r}")
    if not sources:
        raise ValueError("nothing to publish")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"two objects would have one name: {names}")
    keys = [dest.key] + [dest.sibling(s.name) for s in sources[1:]]
    mkey = manifest_key(dest.key)
    if mkey in keys:
        raise ValueError(f"an object would be written over the manifest {mkey}")
    for s in sources:
        s.check()  # a staged piece not as sealed: refused before any request
    sizes = [choose_part_size(s.size, part_size) for s in sources]
    records = Journal.read(journal.path)
    if part_size is None and records and resume:  # no size given: a resume takes the journal's
        sizes = journaled_part_sizes(records[0], [(s.name, s.size) for s in sources], sizes)

    s3 = client if client is not None else S3(endpoint_url, max_connections=concurrency + 2)
    bucket = dest.bucket
    s3.check_bucket(bucket)

    objs = [ObjectUpload(s, k, ps, plan_parts(s.size, ps), {}, None)
            for s, k, ps in zip(sources, keys, sizes, strict=True)]
    state = resume_state(records, objs) if records and resume else None
    if records and state is None:
        why = "resume=False" if not resume else plan_difference(
            records[0].get("fingerprint"), fingerprint(objs))
        log.warning("publish %s: an earlier journal's uploads are aborted (%s)", dest, why)
        _abort_journaled(s3, bucket, records)
        journal.remove()

    heads = {k: s3.head(bucket, k) for k in [*keys, mkey]}
    # Another program's object is never ours to replace (see owners_of): refused whatever
    # replace says, before anything is created; a journal of ours is given up with it.
    owners = owners_of(s3, bucket, dest.key, mkey) if mode.neighbours else {}
    owned = [k for k in keys if k in owners]
    if owned:
        if state is not None:
            _abort_journaled(s3, bucket, records)
            journal.remove()
        raise owned_error(bucket, dest, owned, owners)
    completed_etags = {}
    if state is not None:
        completed_etags = {o.key: o.completed["etag"] for o in objs if o.completed}
    existing = [k for k in keys if heads[k] is not None
                and heads[k].etag != completed_etags.get(k)]
    if heads[mkey] is not None:
        existing.append(mkey)
    if existing and not replace and state is None:
        raise KeyExistsError.of(bucket, existing)

    if state is None:
        manifest_base = heads[mkey].etag if heads[mkey] is not None else None
        for o in objs:
            o.base_etag = heads[o.key].etag if heads[o.key] is not None else None
        previous = _plan_copies(s3, bucket, objs, heads, mkey, index)
        if mode.renew:
            for o in objs:
                o.unchanged = None
        plan = {"endpoint": s3.endpoint_url, "bucket": bucket, "key": dest.key,
                "fingerprint": fingerprint(objs), "manifest_base": manifest_base,
                "previous": previous,
                "objects": [{"name": o.name, "key": o.key, "base": o.base_etag,
                             "copies": {str(n): [c.key, c.offset, c.etag]
                                        for n, c in o.copies.items()}} for o in objs]}
        journal.start(plan)
    else:
        manifest_base = state
        previous = records[0].get("previous") or {}
        journal.reopen()
        log.info("publish %s: resuming an interrupted publish (journal %s)", dest, journal.path)

    others = [u for u in open_uploads(s3, bucket, keys)
              if u.upload_id not in {o.upload_id for o in objs}]
    if others:
        log.warning("publish %s: %d other unfinished upload(s) under these keys (another "
                    "publisher, or abandoned: trtet-store publish --abort lists and aborts "
                    "them): %s", dest, len(others),
                    ", ".join(f"{u.key} {u.upload_id}" for u in others))
    return _Run(s3, dest, mkey, objs, journal, manifest_base, previous, mode)


# --- 3: send --------------------------------------------------------------------------------


def _send(run: _Run, counters: Counters, concurrency: int,
          report_progress: Callable[[], None]) -> None:
    """Every object not completed yet: kept as it is when unchanged, else its parts sent."""
    s3, bucket, journal = run.s3, run.dest.bucket, run.journal
    for o in run.objs:
        if o.completed is None and o.unchanged is not None:
            # Byte for byte the object already there: no new version, no copy.
            o.completed = o.unchanged
            o.report = ObjectReport(o.name, o.key, o.source.size, o.unchanged["etag"],
                                    o.unchanged["crc64nvme"], o.part_size, len(o.parts),
                                    unchanged=True)
            journal.append({"t": "completed", "name": o.name, "entry": o.completed,
                            "report": o.report.__dict__})
            with counters.lock:
                counters.unchanged += o.source.size
            report_progress()
            continue
        if o.completed is None:
            send_object(s3, bucket, o, journal, counters, concurrency, report_progress)


# --- 4 and 5: complete and commit ----------------------------------------------------------


def _commit(run: _Run, counters: Counters,
            report_progress: Callable[[], None]) -> tuple[Manifest, str]:
    """Complete every object, write the manifest last, check, remove what it replaced.

    Returns the manifest and its ETag.
    """
    s3, dest, mkey, objs, journal = run.s3, run.dest, run.mkey, run.objs, run.journal
    bucket = dest.bucket
    replacing = [o.key for o in objs if o.completed is None and o.base_etag is not None]
    if replacing and run.mode.neighbours:
        # Sending may have taken hours: a program may have claimed a key since our plan,
        # even at the ETag we planned against (same bytes, same parts: same ETag), which
        # If-Match cannot tell. Asked again before the first Complete, so a refusal
        # leaves nothing of ours visible.
        owners = owners_of(s3, bucket, dest.key, mkey)
        owned = [k for k in replacing if k in owners]
        if owned:
            raise owned_error(bucket, dest, owned, owners)
    for o in objs:
        if o.completed is None:
            _complete_object(s3, bucket, o, journal, mkey, run.manifest_base)
        elif not o.report.unchanged:
            with counters.lock:
                counters.resumed += o.source.size
            report_progress()
    entries = tuple(_entry(o.completed) for o in objs)
    if run.signing_key is not None:
        entries = tuple(_with_sha256(e, o.source) for e, o in zip(entries, objs, strict=True))
    else:  # an unsigned manifest names nothing by sha256 (not even what it kept unchanged)
        entries = tuple(dataclasses.replace(
            e, sha256=None, pieces=tuple(dataclasses.replace(p, sha256=None)
                                         for p in e.pieces)) for e in entries)
    manifest = Manifest(program=objs[0].name, chunk_size=checksum.CHUNK_SIZE,
                        objects=entries)
    body = manifest.to_json()
    if run.signing_key is not None:
        body = sign_document(json.loads(body), run.signing_key, SIGNATURE_DOMAIN)
    metag = _put_manifest(s3, bucket, mkey, body, run.manifest_base)
    journal.append({"t": "committed", "etag": metag})
    _check_still_there(s3, bucket, objs, mkey)
    _remove_replaced(s3, bucket, dest.key, mkey, run.previous, {o.key for o in objs})
    return manifest, metag


# --- completing and committing ------------------------------------------------------------


def _complete_object(s3: S3, bucket: str, o: ObjectUpload, journal: Journal, mkey: str,
                     manifest_base: str | None | bool) -> None:
    """Complete ``o``'s upload, conditional on the version planned against, and check it.

    Two conditions guard another publisher's finished version: the manifest
    is still the one planned against (:func:`_check_manifest_base`: another
    publish of this program that kept this object unchanged leaves its ETag
    as planned, yet its manifest names it), and the Complete carries
    ``If-Match`` of the version read at plan time (``If-None-Match: *`` for
    a new key), so a version committed in between is never overwritten.
    """
    numbers = [p.number for p in o.parts]
    missing = [n for n in numbers if n not in o.done]
    if missing:
        raise RemoteError(f"{o.key}: parts {missing[:5]} were never sent")
    full = o.done[numbers[0]][1]
    for p in o.parts[1:]:
        full = checksum.combine(full, o.done[p.number][1], p.size)
    full_b64 = crc64nvme_b64(full)
    parts = [(n, o.done[n][0], crc64nvme_b64(o.done[n][1])) for n in numbers]
    target = f"s3://{bucket}/{o.key}"
    _check_manifest_base(s3, bucket, mkey, manifest_base, o.key)
    try:
        etag = s3.complete(bucket, o.key, o.upload_id, parts, full_b64,
                           if_none_match=o.base_etag is None, if_match=o.base_etag)
    except (PreconditionFailed, NoSuchUpload) as exc:
        head = s3.head(bucket, o.key)
        if head is not None and head.crc64nvme == full_b64 and head.size == o.source.size \
                and head.etag != o.base_etag:
            # Our own Complete went through and its answer was lost: a retry saw our object.
            etag = head.etag
        elif isinstance(exc, NoSuchUpload):
            raise RemoteError(f"{target}: the upload {o.upload_id} vanished before it was "
                              "completed (aborted by someone else?)") from None
        else:
            what = ("was created" if o.base_etag is None else "changed")
            raise ConflictError(f"{target} {what} by another writer while we published; "
                                "nothing of ours was made visible (publish again, with "
                                "replace=True to replace it)", o.key) from None
    head = s3.head(bucket, o.key)
    if head is not None and head.etag != etag and (head.crc64nvme, head.size) != (
            full_b64, o.source.size):
        # Another object is under the key already: a writer whose conditional Complete the
        # server let through beside ours (SeaweedFS checks If-Match apart from the write),
        # or one that replaced ours since. That is a lost race, not a corrupt upload.
        raise ConflictError(f"{target} was replaced by another writer right after our "
                            "Complete; the manifest was not written, so this publish made "
                            "nothing visible that a reader follows (publish again with "
                            "replace=True to replace it)", o.key)
    if head is None or head.crc64nvme != full_b64 or head.size != o.source.size:
        got = None if head is None else (head.size, head.crc64nvme)
        raise ChecksumMismatchError(
            f"{target}: HeadObject says {got}, we sent {o.source.size} bytes with CRC64NVME "
            f"{full_b64}; the manifest was not written, so the program is not published",
            o.key, o.upload_id or "", os.fspath(journal.path))
    pieces = tuple(PieceEntry(e.offset, e.size, e.kind, d, c)
                   for e, (d, c) in zip(o.source.extents, o.digests, strict=True))
    part_entries = tuple(PartEntry(p.number, p.offset, p.size, o.done[p.number][0],
                                   crc64nvme_b64(o.done[p.number][1]), o.done[p.number][2])
                         for p in o.parts)
    entry = ObjectEntry(o.name, o.key, o.source.size, etag, full_b64, o.part_size,
                        part_entries, pieces)
    o.completed = entry.to_dict()
    o.report.etag, o.report.crc64nvme = etag, full_b64
    journal.append({"t": "completed", "name": o.name, "entry": o.completed,
                    "report": o.report.__dict__})


def _check_manifest_base(s3: S3, bucket: str, mkey: str, base: str | None | bool,
                         key: str) -> None:
    """ConflictError unless the manifest is still the version this publish planned against.

    Checked before each Complete: a publish of this program that finished
    since our plan has committed a manifest naming objects we are about to
    replace, some perhaps at the very ETag we planned against (an object it
    kept unchanged), which ``If-Match`` alone cannot tell. Left open: a
    publish that commits between this HeadObject and our Complete, having
    kept that object unchanged (one request's window); our manifest is then
    refused and the publish fails, but the object we completed stays.
    """
    head = s3.head(bucket, mkey)
    now = head.etag if head is not None else None
    if now != (base or None):
        raise ConflictError(f"s3://{bucket}/{mkey} was {'written' if not base else 'changed'} "
                            "by another publisher after this publish planned; "
                            f"s3://{bucket}/{key} was not completed, so its program stays "
                            "whole (publish again, with replace=True to replace it)", mkey)


def _with_sha256(entry: ObjectEntry, source: ObjectSource) -> ObjectEntry:
    """``entry`` naming its object, and each chunk of each piece, by sha256 (signed manifests).

    Taken by the pass that read the object whole for its upload (or a
    resume's check of it); an object no pass read whole this time (kept
    unchanged in the bucket) is read once here.
    """
    if source.sha256 is None or source.chunk_sha256 is None:
        reader = Reader(source)
        try:
            window = memoryview(bytearray(min(DIGEST_WINDOW, max(source.size, 1))))
            reader.skip_to(window, source.size)
        finally:
            reader.close()
    shas = source.chunk_sha256
    if shas is None or source.sha256 is None or len(shas) != len(entry.pieces):
        raise RemoteError(f"{entry.key}: no sha256 of its bytes was taken; the manifest is "
                          "not signed")
    pieces = tuple(dataclasses.replace(p, sha256=tuple(h))
                   for p, h in zip(entry.pieces, shas, strict=True))
    return dataclasses.replace(entry, pieces=pieces, sha256=source.sha256)


def _entry(d: dict[str, Any]) -> ObjectEntry:
    m = Manifest.from_dict({"format": "trtet-store-manifest", "version": 1,
                            "program": d["name"], "chunk_size": checksum.CHUNK_SIZE,
                            "objects": [d]})
    return m.objects[0]


def _put_manifest(s3: S3, bucket: str, key: str, body: bytes, base: str | None | bool) -> str:
    crc = crc64nvme_b64(checksum.crc64nvme(body))
    base_etag = base or None
    try:
        for attempt in range(BAD_DIGEST_ATTEMPTS):
            try:
                return s3.put(bucket, key, body, crc, if_none_match=base_etag is None,
                              if_match=base_etag)
            except BadDigest:
                log.warning("%s: the server refused the manifest's checksum (attempt %d of "
                            "%d)", key, attempt + 1, BAD_DIGEST_ATTEMPTS)
                if attempt + 1 == BAD_DIGEST_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")
    except PreconditionFailed:
        got = s3.get(bucket, key)
        if got is not None and got[0] == body:  # ours, its answer lost and retried
            return got[1]
        raise ConflictError(f"the manifest s3://{bucket}/{key} was changed by another writer "
                            "while we published; it was not overwritten", key) from None


def _check_still_there(s3: S3, bucket: str, objs: list[ObjectUpload], mkey: str) -> None:
    """Every object still holds the version our manifest names, or a ConflictError.

    Each Complete was conditional and checked right after, but a server that
    checks the condition apart from the write (SeaweedFS) can let another
    publisher's Complete, checked before ours, land after our check. The
    manifest then names versions that are gone: readers refuse it (every
    GET carries its ETag), and this publish must not report success.
    """
    for o in objs:
        head = s3.head(bucket, o.key)
        if head is None or head.etag != o.completed["etag"]:
            raise ConflictError(
                f"s3://{bucket}/{o.key} was replaced by another writer after our Complete; "
                f"the manifest s3://{bucket}/{mkey} we wrote names the version that was "
                "there, so readers refuse it rather than mix versions. Publish again (with "
                "replace=True)", o.key)


# --- aborting ---------------------------------------------------------------------------------


def _abort_all(s3: S3, bucket: str, objs: list[ObjectUpload]) -> None:
    for o in objs:
        if o.upload_id and o.completed is None:
            try:
                s3.abort(bucket, o.key, o.upload_id)
            except (RemoteError, OSError) as exc:
                log.error("could not abort the upload %s of %s: %s", o.upload_id, o.key, exc)


def _abort_journaled(s3: S3, bucket: str, records: list[dict]) -> None:
    keys = {o["name"]: o["key"] for o in records[0].get("objects", [])}
    for r in records:
        if r.get("t") == "upload":
            s3.abort(bucket, keys.get(r["name"], ""), r["upload_id"])
