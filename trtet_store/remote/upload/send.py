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
"""

from __future__ import annotations

import logging
import os
import posixpath
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtet_store.io import UNSET, MiB, SourceChangedError
from trtet_store.remote import checksum
from trtet_store.remote.errors import (
    ChecksumMismatchError,
    ConflictError,
    KeyExistsError,
    ManifestError,
    OwnedByOtherProgramError,
    RemoteError,
    UploadKeptError,
)
from trtet_store.remote.manifest import (
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    crc64nvme_b64,
    manifest_key,
    named_keys,
    program_key_of,
)
from trtet_store.remote.report import ObjectReport, PublishProgress, PublishReport
from trtet_store.remote.s3 import (
    S3,
    BadDigest,
    NoSuchUpload,
    PreconditionFailed,
    Transient,
)
from trtet_store.remote.upload import delta
from trtet_store.remote.upload.config import (  # noqa: F401 - DEFAULT_CONCURRENCY re-exported
    DEFAULT_CONCURRENCY,
    PublishConfig,
    config_of,
    replace_of,
)
from trtet_store.remote.upload.index import MIN_INDEXED, index_lookup, update_index
from trtet_store.remote.upload.journal import (
    Journal,
    default_dir,
    journal_path,
)
from trtet_store.remote.upload.parts import Part, choose_part_size, plan_parts
from trtet_store.remote.upload.resume_plan import journaled_part_sizes, plan_difference
from trtet_store.remote.upload.source import ObjectSource, Reader, piece_digests
from trtet_store.remote.upload.unfinished import open_uploads
from trtet_store.remote.url import RemoteURL

log = logging.getLogger("trtet_store.remote")


class PartBody:
    """A part's bytes as a seekable file for botocore, read from the part buffer without a copy.

    botocore would take ``bytes``, but a part buffer is a slice of a
    recycled ``bytearray``; this hands out small blocks of it as http.client
    asks, and seeks back to the start when botocore retries.
    """

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = bytes(self._view[self._pos:end])
        self._pos = end
        return out

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._view))[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


#: Sends of one part after the server refused its checksum, before giving up.
BAD_DIGEST_ATTEMPTS = 3
#: Our own attempts at a part after botocore's retries gave up on the network.
PART_ATTEMPTS = 3
_WINDOW = 8 * MiB


@dataclass
class _Counters:
    sent: int = 0
    copied: int = 0
    resumed: int = 0
    unchanged: int = 0
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Object:
    """One object's plan and state during a publish."""

    source: ObjectSource
    key: str
    part_size: int
    parts: list[Part]
    copies: dict[int, delta.CopyFrom]
    base_etag: str | None  # the version replaced (If-Match), None: a new key (If-None-Match)
    upload_id: str | None = None
    listed: dict[int, tuple[str, int]] = field(default_factory=dict)
    journaled_sent: dict[int, tuple[str, int]] = field(default_factory=dict)  # etag, crc
    done: dict[int, tuple[str, int, str]] = field(default_factory=dict)  # etag, crc, md5
    completed: dict[str, Any] | None = None  # the manifest entry, once completed
    report: ObjectReport | None = None
    digests: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # per piece
    unchanged: dict[str, Any] | None = None  # the previous manifest's entry, when identical
    journal_endpoint: str | None = None  # on a resume: the URL its journal was written through

    @property
    def name(self) -> str:
        return self.source.name


def _fingerprint(objs: list[_Object]) -> list[Any]:
    return [[o.name, o.key, o.source.size, o.part_size,
             [[e.kind, e.size] for e in o.source.extents]] for o in objs]


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
    """
    cfg = config_of(config, "publish_sources", part_size=part_size, concurrency=concurrency,
                    journal_dir=journal_dir, index=index)
    replace = replace_of(replace, if_exists, "publish_sources")
    dest = url if isinstance(url, RemoteURL) else RemoteURL.parse(url)
    jdir = Path(cfg.journal_dir) if cfg.journal_dir is not None else default_dir()
    journal = Journal(journal_path(jdir, dest.bucket, dest.key),
                      {"sources": _local_dirs(sources)})
    journal.lock(str(dest), dest.key)
    try:
        return _publish_locked(sources, dest, journal, endpoint_url=endpoint_url,
                               part_size=cfg.part_size, concurrency=cfg.concurrency,
                               replace=replace, resume=resume, progress=progress,
                               index=cfg.index, client=client)
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
) -> PublishReport:
    """:func:`publish_sources` with its ``journal`` locked."""
    start = time.monotonic()
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

    objs = [_Object(s, k, ps, plan_parts(s.size, ps), {}, None)
            for s, k, ps in zip(sources, keys, sizes, strict=True)]
    state = _resume_state(records, objs) if records and resume else None
    if records and state is None:
        why = "resume=False" if not resume else plan_difference(
            records[0].get("fingerprint"), _fingerprint(objs))
        log.warning("publish %s: an earlier journal's uploads are aborted (%s)", dest, why)
        _abort_journaled(s3, bucket, records)
        journal.remove()

    heads = {k: s3.head(bucket, k) for k in [*keys, mkey]}
    # Another program's object is never ours to replace (see _owners): refused whatever
    # replace says, before anything is created; a journal of ours is given up with it.
    owners = _owners(s3, bucket, dest.key, mkey)
    owned = [k for k in keys if k in owners]
    if owned:
        if state is not None:
            _abort_journaled(s3, bucket, records)
            journal.remove()
        raise _owned_error(bucket, dest, owned, owners)
    completed_etags = {}
    if state is not None:
        completed_etags = {o.key: o.completed["etag"] for o in objs if o.completed}
    existing = [k for k in keys if heads[k] is not None
                and heads[k].etag != completed_etags.get(k)]
    if heads[mkey] is not None:
        existing.append(mkey)
    if existing and not replace and state is None:
        raise KeyExistsError(f"{', '.join(f's3://{bucket}/{k}' for k in existing)} already "
                             "exist; pass replace=True (--replace) to publish a new version",
                             existing[0])

    if state is None:
        manifest_base = heads[mkey].etag if heads[mkey] is not None else None
        for o in objs:
            o.base_etag = heads[o.key].etag if heads[o.key] is not None else None
        previous = _plan_copies(s3, bucket, objs, heads, mkey, index)
        plan = {"endpoint": s3.endpoint_url, "bucket": bucket, "key": dest.key,
                "fingerprint": _fingerprint(objs), "manifest_base": manifest_base,
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

    counters = _Counters()
    total = sum(o.source.size for o in objs)

    def report_progress() -> None:
        if progress is not None:
            with counters.lock:
                p = PublishProgress(counters.sent + counters.copied + counters.resumed
                                    + counters.unchanged, total, counters.sent, counters.copied,
                                    counters.resumed, counters.unchanged)
            progress(p)

    try:
        for o in objs:
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
                _send_object(s3, bucket, o, journal, counters, concurrency, report_progress)
        replacing = [o.key for o in objs if o.completed is None and o.base_etag is not None]
        if replacing:
            # Sending may have taken hours: a program may have claimed a key since our plan,
            # even at the ETag we planned against (same bytes, same parts: same ETag), which
            # If-Match cannot tell. Asked again before the first Complete, so a refusal
            # leaves nothing of ours visible.
            owners = _owners(s3, bucket, dest.key, mkey)
            owned = [k for k in replacing if k in owners]
            if owned:
                raise _owned_error(bucket, dest, owned, owners)
        for o in objs:
            if o.completed is None:
                _complete_object(s3, bucket, o, journal, mkey, manifest_base)
            elif not o.report.unchanged:
                with counters.lock:
                    counters.resumed += o.source.size
                report_progress()
        entries = tuple(_entry(o.completed) for o in objs)
        manifest = Manifest(program=objs[0].name, chunk_size=checksum.CHUNK_SIZE,
                            objects=entries)
        body = manifest.to_json()
        metag = _put_manifest(s3, bucket, mkey, body, manifest_base)
        journal.append({"t": "committed", "etag": metag})
        _check_still_there(s3, bucket, objs, mkey)
        _remove_replaced(s3, bucket, dest.key, mkey, previous, {o.key for o in objs})
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
    rep = PublishReport(url=str(dest), manifest_key=mkey, manifest_etag=metag,
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


# --- planning -----------------------------------------------------------------------


def _resume_state(records: list[dict], objs: list[_Object]) -> str | None | bool:
    """Load a matching journal into ``objs``; returns the manifest's base ETag, or None.

    Returns ``None`` (start over) when the journal's plan is for other pieces.
    A matching journal with no manifest base returns ``False`` (falsy but
    not None) so callers can tell it from "no journal".
    """
    plan = records[0]
    if plan.get("fingerprint") != _fingerprint(objs):
        return None
    by_name = {o.name: o for o in objs}
    for entry in plan["objects"]:
        o = by_name[entry["name"]]
        o.base_etag = entry["base"]
        o.journal_endpoint = plan.get("endpoint")
        o.copies = {int(n): delta.CopyFrom(*c) for n, c in entry["copies"].items()}
    for r in records[1:]:
        o = by_name.get(r.get("name", ""))
        t = r.get("t")
        if t == "upload" and o is not None:
            if o.completed is not None:
                # Completed by a run before, then sent again (its bytes had changed,
                # see below): the version it replaces is the one that run completed.
                o.base_etag, o.completed, o.report = o.completed["etag"], None, None
            o.upload_id = r["upload_id"]
            o.journaled_sent.clear()
        elif t == "sent" and o is not None:
            o.journaled_sent[int(r["number"])] = (r["etag"], int(r["crc"]))
        elif t == "completed" and o is not None:
            o.completed = r["entry"]
            o.report = ObjectReport(**r["report"])
    for o in objs:
        if o.completed is not None and not _reads_as(o.source, o.completed["crc64nvme"]):
            # Completed by the interrupted run, but its bytes changed since (same size):
            # kept, the manifest would name the old bytes beside the new bytes of the
            # others. It is sent again, replacing the version that run completed.
            log.warning("%s: completed by the interrupted publish, but its bytes changed "
                        "since; it is sent again", o.key)
            o.base_etag, o.completed, o.report = o.completed["etag"], None, None
            o.upload_id = None
            o.journaled_sent.clear()
    return plan.get("manifest_base") or False


def _reads_as(source: ObjectSource, crc_b64: str) -> bool:
    """Whether ``source``'s bytes now have the full-object CRC64NVME ``crc_b64`` (one read)."""
    reader = Reader(source)
    crc = 0
    try:
        window = memoryview(bytearray(min(_WINDOW, max(source.size, 1))))
        while reader.pos < source.size:
            n = min(len(window), source.size - reader.pos)
            reader.read_into(window[:n])
            crc = checksum.crc64nvme(window[:n], crc)
    finally:
        reader.close()
    return crc64nvme_b64(crc) == crc_b64


def _plan_copies(s3: S3, bucket: str, objs: list[_Object], heads: dict, mkey: str,
                 index: bool) -> dict[str, str]:
    """Fill each object's ``copies`` from the previous manifest and the index.

    Returns the previous version's objects, ``{key: etag}`` as its manifest
    names them (empty without a readable one): after the new manifest
    commits, those it no longer names are removed (:func:`_remove_replaced`).
    """
    cands: delta.Candidates = {}
    previous: dict[str, dict[str, Any]] = {}
    if heads.get(mkey) is not None:
        got = s3.get(bucket, mkey)
        if got is not None:
            try:
                old = Manifest.from_json(got[0])
                delta.candidates_from_manifest(old, cands)
                previous = {e.key: e.to_dict() for e in old.objects}
            except ManifestError as exc:
                log.warning("the previous manifest s3://%s/%s cannot be read (%s): every "
                            "byte is sent", bucket, mkey, exc)
    if index:
        for o in objs:
            for e in o.source.extents:
                if e.kind == "file" and e.size >= MIN_INDEXED:
                    for where, size, digest in index_lookup(s3, bucket, e):
                        cands.setdefault((size, digest), []).append(where)
    _drop_stale_candidates(s3, bucket, cands, heads)
    old_objects = {k: v["etag"] for k, v in previous.items()}
    if not cands:
        return old_objects
    sizes = {size for size, _ in cands}
    for o in objs:
        known: list[tuple[int, int, str | None]] = []
        for e in o.source.extents:
            digest = e.known_digest()
            if digest is None and e.size in sizes:
                digest = piece_digests(e)[0]  # read once, to find it among the candidates
            known.append((e.offset, e.size, digest))
        o.copies = delta.copy_actions(o.parts, delta.segments(known, cands))
        prev = previous.get(o.key)
        if (prev is not None and prev["etag"] == o.base_etag and prev["size"] == o.source.size
                and len(o.copies) == len(o.parts)
                and all(o.copies[p.number] == delta.CopyFrom(o.key, p.offset, o.base_etag)
                        for p in o.parts)
                and [(p["offset"], p["size"], p["xxh3"]) for p in prev["pieces"]] == known):
            o.unchanged = prev
            log.info("%s: identical to the version there (%s); it is kept as it is", o.key,
                     o.base_etag)
        elif o.copies:
            log.info("%s: %d of %d parts copied server-side from bytes already in the bucket",
                     o.key, len(o.copies), len(o.parts))
    return old_objects


def _drop_stale_candidates(s3: S3, bucket: str, cands: delta.Candidates,
                           heads: dict) -> None:
    """Keep only the copy sources still at the version that names them.

    An index entry or an earlier manifest can name an object that was
    removed since (a replaced version's ``.ptd``, see
    :func:`_remove_replaced`) or replaced: a copy from it would fail, or
    fall back, part by part. One HeadObject per source object.
    """
    seen: dict[str, str | None] = {k: (h.etag if h is not None else None)
                                   for k, h in heads.items()}
    for cand_key in list(cands):
        kept = []
        for where in cands[cand_key]:
            if where.key not in seen:
                head = s3.head(bucket, where.key)
                seen[where.key] = head.etag if head is not None else None
            if seen[where.key] == where.etag:
                kept.append(where)
        if kept:
            cands[cand_key] = kept
        else:
            del cands[cand_key]


# --- neighbours: other programs under the same prefix ---------------------------------
#
# ExecuTorch names .ptd files by tag (cpu.ptd), not by program, so two programs published
# side by side under one prefix would share keys. Objects stay beside their program (that
# is where the runtime and fetch look for them); ownership is read from the manifests: a
# key that another program's manifest names (or that is another program's manifest) is
# that program's, and no publish replaces or removes it, --replace or not.


def _owners(s3: S3, bucket: str, key: str, mkey: str) -> dict[str, str]:
    """``{object key: owning program's key}`` from every other manifest beside ``key``.

    Our own manifest (``mkey``) is left out: what it names is ours to
    replace. A manifest names keys in its own directory (the publisher puts
    every object beside its program), so one listing of that directory finds
    every program that could own a key we write. Each manifest is read
    leniently (:func:`~trtet_store.remote.manifest.named_keys`), so one of a
    later format still protects its objects; one that cannot be read at all
    protects only itself, with a warning.
    """
    head = posixpath.dirname(key)
    owners: dict[str, str] = {}
    for k in s3.list_keys(bucket, f"{head}/" if head else ""):
        program = program_key_of(k)
        if program is None or k == mkey:
            continue
        owners[k] = program
        try:
            got = s3.get(bucket, k)
            if got is None:  # removed since the listing
                continue
            named = named_keys(got[0])
        except (ManifestError, RemoteError) as exc:
            log.warning("s3://%s/%s cannot be read (%s); the objects it names are not known "
                        "to this publish", bucket, k, exc)
            continue
        for n in named:
            owners.setdefault(n, program)
    return owners


def _owned_error(bucket: str, dest: RemoteURL, owned: list[str],
                 owners: dict[str, str]) -> OwnedByOtherProgramError:
    stem = posixpath.splitext(dest.name)[0] or dest.name
    alone = dest.sibling(stem) + "/" + dest.name
    which = "; ".join(f"{posixpath.basename(k)} belongs to s3://{bucket}/{owners[k]}"
                      for k in owned)
    return OwnedByOtherProgramError(
        f"publishing s3://{bucket}/{dest.key} would replace another program's object: "
        f"{which} (its manifest names it). A publish never replaces another program's "
        "objects, with or without --replace; publish this program under a prefix of its "
        f"own, e.g. s3://{bucket}/{alone}", owned[0], f"s3://{bucket}/{owners[owned[0]]}")


def _remove_replaced(s3: S3, bucket: str, key: str, mkey: str, previous: dict[str, str],
                     kept: set[str]) -> list[str]:
    """Remove the replaced version's objects that the new manifest no longer names.

    Runs after the new manifest is committed and checked. An object goes
    only when it is beside the program, no other program's manifest names
    it (listed again now), and it still has the ETag the replaced manifest
    named (a conditional DeleteObject: a version written since is someone's
    and stays). Best effort: the publish is done; what cannot be removed is
    named in a warning and stays.
    """
    gone = sorted(k for k in previous if k not in kept)
    if not gone:
        return []
    where = posixpath.dirname(key)
    try:
        owners = _owners(s3, bucket, key, mkey)
    except (RemoteError, OSError) as exc:
        log.warning("the replaced version's objects %s are kept: the other programs' "
                    "manifests could not be listed (%s)", ", ".join(gone), exc)
        return []
    removed = []
    for k in gone:
        if posixpath.dirname(k) != where or program_key_of(k) is not None:
            log.warning("s3://%s/%s is kept: the replaced manifest named it, but it is not "
                        "an object beside the program", bucket, k)
            continue
        if k in owners:
            log.info("s3://%s/%s is kept: s3://%s/%s names it too", bucket, k, bucket,
                     owners[k])
            continue
        try:
            s3.delete(bucket, k, if_match=previous[k])
        except PreconditionFailed:
            log.info("s3://%s/%s is kept: it changed since the replaced version", bucket, k)
            continue
        except (RemoteError, OSError) as exc:
            log.warning("s3://%s/%s, which the replaced version had and the new one does "
                        "not, could not be removed (%s); it stays", bucket, k, exc)
            continue
        removed.append(k)
        log.info("removed s3://%s/%s: the replaced version had it, no manifest names it now",
                 bucket, k)
    return removed


# --- sending --------------------------------------------------------------------------


def _send_object(s3: S3, bucket: str, o: _Object, journal: Journal, counters: _Counters,
                 concurrency: int, report_progress: Callable[[], None]) -> None:
    """Every part of ``o`` sent, copied or found on the server; fills ``o.done``."""
    if o.upload_id is not None:
        try:
            o.listed = s3.list_parts(bucket, o.key, o.upload_id)
        except NoSuchUpload:
            if o.journal_endpoint and o.journal_endpoint != s3.endpoint_url:
                # The journal is keyed by bucket and key, not by URL: this may be
                # another server than the one that holds the upload. Say where it is.
                log.warning("%s: the journaled upload %s was opened through %s, and %s does "
                            "not know it; starting a new one. If that is another server, "
                            "give it up there: trtet-store publish --abort s3://%s/%s "
                            "--endpoint-url %s", o.key, o.upload_id, o.journal_endpoint,
                            s3.endpoint_url, bucket, o.key, o.journal_endpoint)
            else:
                log.info("%s: the journaled upload %s is gone; starting a new one", o.key,
                         o.upload_id)
            o.upload_id, o.listed = None, {}
            o.journaled_sent.clear()
    if o.upload_id is None:
        o.upload_id = s3.create(bucket, o.key)
        journal.append({"t": "upload", "name": o.name, "upload_id": o.upload_id})
    o.report = ObjectReport(o.name, o.key, o.source.size, "", "", o.part_size, len(o.parts),
                            resumed_upload=bool(o.listed))
    reader = Reader(o.source)
    slots = threading.Semaphore(concurrency)
    # concurrency + 1 part buffers, allocated once and recycled: the reader fills
    # one while the others are sent, so memory is bounded by construction (and
    # the allocator never sees a stream of part-sized allocations to fragment).
    # Each buffer is as large as the largest part it will hold, not the part size: a
    # 160 KiB object published with 5 GiB parts takes 160 KiB, not 5 GiB a buffer.
    sent_parts = [p for p in o.parts if p.number not in o.copies]
    buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    buffer_size = max((p.size for p in sent_parts), default=0)
    for _ in range(min(concurrency + 1, len(sent_parts))):
        buffers.put(bytearray(buffer_size))
    failures: list[BaseException] = []
    lock = threading.Lock()
    # Copied parts pass through this window (their bytes are digested, never sent).
    copied = max((p.size for p in o.parts if p.number in o.copies), default=0)
    window = memoryview(bytearray(min(_WINDOW, max(copied, 1))))

    def run(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - handed to the reader thread
            with lock:
                failures.append(exc)
        finally:
            slots.release()

    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="trtet-publish")
    try:
        for part in o.parts:
            if failures:
                break
            copy = o.copies.get(part.number)
            if copy is not None:
                # The bytes pass through anyway (piece digests, the part's CRC for the
                # full-object checksum), a window at a time; only the copy goes out.
                crc = 0
                while reader.pos < part.end:
                    n = min(len(window), part.end - reader.pos)
                    reader.read_into(window[:n])
                    crc = checksum.crc64nvme(window[:n], crc)
                digest = ""
                slots.acquire()
                pool.submit(run, lambda p=part, c=copy, k=crc, m=digest: _copy_part(
                    s3, bucket, o, p, c, k, m, journal, counters, report_progress))
            else:
                buf = buffers.get()
                view = memoryview(buf)[:part.size]
                reader.read_into(view)
                slots.acquire()

                def upload(p: Part = part, b: bytearray = buf, v: memoryview = view) -> None:
                    try:
                        _upload_part(s3, bucket, o, p, v, journal, counters, report_progress)
                    finally:
                        v.release()
                        buffers.put(b)

                pool.submit(run, upload)
                del buf, view
    finally:
        pool.shutdown(wait=True)
        reader.close()
    if failures:
        raise failures[0]
    o.digests = reader.digests
    for i, e in enumerate(o.source.extents):
        if not e.size:
            continue
        planned = e.known_digest()
        if planned is not None and e.kind == "file" and planned != reader.digests[i][0]:
            raise SourceChangedError(getattr(e.piece, "path", o.name),
                                     "its bytes differ from the digests it was sealed with")


def _upload_part(s3: S3, bucket: str, o: _Object, part: Part, buf: bytearray | memoryview,
                 journal: Journal, counters: _Counters, report_progress: Callable[[], None]
                 ) -> None:
    crc = checksum.crc64nvme(buf)
    md5 = ""  # computed only where a resume needs it to recognise a part
    listed = o.listed.get(part.number)
    if listed is not None and listed[1] == part.size:
        sent = o.journaled_sent.get(part.number)
        ours = sent is not None and listed[0] == sent[0] and sent[1] == crc
        if not ours:  # stored, but killed before its answer was journaled: its MD5 tells
            md5 = checksum.md5_hex(buf)
            ours = listed[0] == md5
        if ours:
            _part_done(o, part, listed[0], crc, md5, "resumed", journal, counters,
                       report_progress)
            return
    journal.append({"t": "part", "name": o.name, "number": part.number, "crc": crc},
                   durable=False)
    crc_b64 = crc64nvme_b64(crc)
    bad, net = 0, 0
    while True:
        try:
            etag = s3.upload_part(bucket, o.key, o.upload_id, part.number, PartBody(buf),
                                  crc_b64)
            break
        except BadDigest:
            bad += 1
            with counters.lock:
                counters.retries += 1
            log.warning("%s part %d: the server refused its checksum (attempt %d of %d)",
                        o.key, part.number, bad, BAD_DIGEST_ATTEMPTS)
            if bad >= BAD_DIGEST_ATTEMPTS:
                raise
        except Transient as exc:
            net += 1
            with counters.lock:
                counters.retries += 1
            log.warning("%s part %d: %s (attempt %d of %d)", o.key, part.number, exc, net,
                        PART_ATTEMPTS)
            if net >= PART_ATTEMPTS:
                raise
            time.sleep(min(2.0 ** net, 10.0))
    _part_done(o, part, etag, crc, md5, "sent", journal, counters, report_progress)


def _copy_part(s3: S3, bucket: str, o: _Object, part: Part, copy: delta.CopyFrom, crc: int,
               md5: str, journal: Journal, counters: _Counters,
               report_progress: Callable[[], None]) -> None:
    sent = o.journaled_sent.get(part.number)
    listed = o.listed.get(part.number)
    if sent is not None and listed is not None and listed == (sent[0], part.size) \
            and sent[1] == crc:
        _part_done(o, part, sent[0], crc, md5, "resumed", journal, counters, report_progress)
        return
    net = 0
    while True:
        try:
            etag = s3.copy_part(bucket, o.key, o.upload_id, part.number, copy.key, copy.offset,
                                part.size, copy.etag)
            break
        except PreconditionFailed:
            # The source changed since it was planned: send the bytes instead.
            log.info("%s part %d: %s changed since it was planned; sending the bytes",
                     o.key, part.number, copy.key)
            buf = bytearray(part.size)
            _read_at(o.source, part.offset, memoryview(buf))
            if checksum.crc64nvme(buf) != crc:
                raise SourceChangedError(o.name, f"part {part.number} read differently "
                                                 "twice") from None
            o.copies.pop(part.number, None)
            _upload_part(s3, bucket, o, part, buf, journal, counters, report_progress)
            return
        except Transient as exc:
            net += 1
            if net >= PART_ATTEMPTS:
                raise
            log.warning("%s part %d copy: %s", o.key, part.number, exc)
            time.sleep(min(2.0 ** net, 10.0))
    _part_done(o, part, etag, crc, md5, "copied", journal, counters, report_progress)


def _part_done(o: _Object, part: Part, etag: str, crc: int, md5: str, how: str,
               journal: Journal, counters: _Counters,
               report_progress: Callable[[], None]) -> None:
    """Record that ``part`` is in the upload, ``how`` (``sent``, ``copied`` or ``resumed``).

    A part sent or copied now is journaled (a resumed one already is); every
    one joins the list Complete names, by its ETag, and is counted.
    """
    if how != "resumed":
        journal.append({"t": "sent", "name": o.name, "number": part.number, "etag": etag,
                        "crc": crc}, durable=False)
    o.done[part.number] = (etag, crc, md5)
    with counters.lock:
        setattr(counters, how, getattr(counters, how) + part.size)
        parts = f"parts_{how}"
        setattr(o.report, parts, getattr(o.report, parts) + 1)
    report_progress()


def _read_at(source: ObjectSource, offset: int, buf: memoryview) -> None:
    """Random-access read of ``source`` (for a copy that fell back to an upload).

    Reads the part's range only (:meth:`ObjectSource.read_at`), not every
    byte before it: a copy failing near the end of a 50 GiB object re-reads
    one part. The caller compares the part's CRC with the first pass.
    """
    source.read_at(offset, buf)


# --- completing and committing ------------------------------------------------------------


def _complete_object(s3: S3, bucket: str, o: _Object, journal: Journal, mkey: str,
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


def _check_still_there(s3: S3, bucket: str, objs: list[_Object], mkey: str) -> None:
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


def _abort_all(s3: S3, bucket: str, objs: list[_Object]) -> None:
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
