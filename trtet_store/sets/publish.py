"""``publish_set(members, url)``: a release of many programs, each distinct file once.

The steps, in order:

1. **Read the sources** (nothing sent): each member's files as
   :func:`~trtet_store.remote.upload.program.sources_of` makes them for
   ``publish`` (saved files, or a program's pieces), digested once here:
   xxh3-128 of the whole file (its blob name), xxh3-64 per MiB (the set
   manifest's ``chunks``), CRC64NVME. Local file pieces are re-planned with
   their piece digests, so a file changed between this pass and its upload
   is refused by the upload (``SourceChangedError``), never published under
   a name that is not its digest.
2. **Blobs**: each distinct file goes to ``<prefix>blobs/<hex>`` through
   :func:`~trtet_store.remote.upload.send.publish_blob` (publish's machinery:
   multipart, per-part and full-object CRC64NVME, the resumable journal,
   conditional Complete, its own ``<hex>.trtet.json``; not the neighbours'
   scan, which a content-addressed key does not need: a constant number of
   requests per blob). A blob the bucket holds already (its manifest names
   one object of the same size and CRC64NVME, and HeadObject agrees) is
   *taken* as it is only when the version we replace names it. Any other
   (one that version lists in ``removing``, a losing publisher's, one a
   killed publish left) may be deleted by a clean-up that read it before
   our commit, at the ETag it read: it is *renewed*, written again in a form
   whose ETag differs (another part count, copied server-side; a blob of
   one part by PutObject), so that delete is refused (:func:`_renew`).
   Two publishers of one blob: the second's conflict finds the first's
   blob present, and takes it.
3. **Commit**: the set manifest (:mod:`.manifest`), last, with
   ``If-None-Match: *`` for a new set or ``If-Match`` of the version read
   in step 1; a refusal is :class:`~trtet_store.remote.errors.ConflictError`
   and the other writer's set stays as it is.
4. **Check and tidy**: every blob the new manifest names is HEADed (one a
   concurrent publish's clean-up removed is sent again); then the replaced
   manifest's blobs that no member names any more are removed, unless the
   set manifest changed since our commit (the newer publish tidies its own
   base). Each goes only as the version listed: its manifest at the
   version read (which must name that ETag), then the object ``If-Match``
   that ETag (:func:`_blob_first`, through :mod:`trtet_store.remote.sweep`);
   a renewed blob refuses both. The new manifest lists them (``removing``)
   before they go: a publish killed between its commit and its clean-up
   leaves them there, and the next publish of the set removes them.

What is left open: ETags are digests of the bytes and the part layout, so
a blob renewed twice may come back to an ETag it had; a clean-up stalled
inside one request while two later publishes renew the same blob could
then delete it.

5. **Prune**: blobs under ``<prefix>blobs/`` that no manifest names (a
   losing publisher's, a killed publish's), not in ``removing`` (step 4's),
   and older than ``gc_grace`` (LastModified against our committed set
   manifest's, both the server's clock; default 24 hours) are removed the
   same conditional way (:func:`_prune`), as git's prune and restic's
   ``prune`` keep what is younger than their grace: a younger blob may be a
   concurrent publisher's upload, named by a commit still to come. An
   older one that a publish under way wants is renewed by it (step 2), so
   the prune's delete, pinned to the ETag it listed, is refused. Nothing is
   pruned once the set manifest is not ours any more.

What is removed when: the replaced version's blobs no member names, right
after the commit (step 4); unnamed blobs, after the commit of a publish
that finds them older than ``gc_grace`` (step 5). A manifest left without
its object (a clean-up killed between its two deletes) goes with step 5.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import replace as replace_config
from datetime import timedelta
from typing import Any

from trtet_store.io import UNSET, Digester, ExternalFile, MiB, SourceChangedError
from trtet_store.remote.checksum import CHUNK_SIZE, crc64nvme
from trtet_store.remote.errors import (
    ConflictError,
    KeyExistsError,
    ManifestError,
    PartSizeError,
    RemoteError,
)
from trtet_store.remote.keyconfig import resolve_signing
from trtet_store.remote.manifest import (
    MANIFEST_SUFFIX,
    MAX_PART_SIZE,
    MIN_PART_SIZE,
    Manifest,
    ObjectEntry,
    PartEntry,
    PieceEntry,
    crc64nvme_b64,
    manifest_key,
)
from trtet_store.remote.s3 import S3, PreconditionFailed
from trtet_store.remote.sweep import Listed, SweepPlan, plan_sweep
from trtet_store.remote.upload.config import PublishConfig, config_of, replace_of
from trtet_store.remote.upload.parts import choose_part_size
from trtet_store.remote.upload.program import sources_of
from trtet_store.remote.upload.send import publish_blob
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.remote.url import RemoteURL
from trtet_store.sets.machine import check_metadata
from trtet_store.sets.manifest import (
    BLOBS,
    METADATA_KEYS,
    SET_KEY,
    SET_MAX_BYTES,
    BlobEntry,
    FileEntry,
    MemberEntry,
    SetManifest,
    blob_key,
    check_member_files,
    member_name_problem,
)
from trtet_store.sets.report import SetPublishReport
from trtet_store.sets.signed import sign_set

log = logging.getLogger("trtet_store.sets")

#: Bytes read at a time by the digest pass.
READ_STEP = 8 * MiB
#: How old a blob no manifest names must be before a publish prunes it (seconds).
DEFAULT_GC_GRACE = 24 * 3600.0
_HEX128 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Member:
    """A member's program with what its engines need (all optional).

    Parameters
    ----------
    source : ExecutorchProgramManager, path-like, or sequence of path-like
        What :func:`trtet_store.publish` takes.
    compute_capability : str, optional
        The GPU its TensorRT engines were built for (``"8.9"``); None: no GPU engine.
    tensorrt, executorch : str, optional
        The versions that built it. ``executorch`` defaults to the installed
        one for a program (not for saved files, whose maker is not known).
    version_compatible : bool
        Engines built ``VERSION_COMPATIBLE`` (run on this TensorRT or later).
    hardware_compatibility : {"ampere_plus"}, optional
        Engines built with ``HardwareCompatibilityLevel.AMPERE_PLUS``.
    """

    source: Any
    compute_capability: str | None = None
    tensorrt: str | None = None
    executorch: str | None = None
    version_compatible: bool = False
    hardware_compatibility: str | None = None

    def metadata(self) -> dict[str, Any]:
        meta = {k: getattr(self, k) for k in METADATA_KEYS}
        return {k: v for k, v in meta.items() if v is not None and v is not False}


@dataclass
class _File:
    """One member file as read: its source, digests, and runtime name."""

    source: ObjectSource
    digest: str
    chunks: tuple[int, ...]
    crc64nvme: str
    sha256: str | None = None  # taken in the same pass when the set is signed

    @property
    def size(self) -> int:
        return self.source.size


def parse_set_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix/`` (the prefix ends in ``/``, or is empty).

    :meth:`RemoteURL.parse_prefix <trtet_store.remote.url.RemoteURL.parse_prefix>`.

    Raises
    ------
    RemoteURLError
        Not ``s3://bucket/...``, or a key segment that is empty, ``.`` or ``..``.
    """
    return RemoteURL.parse_prefix(url)


def publish_set(
    members: Mapping[str, Any],
    url: str,
    *,
    endpoint_url: str | None = None,
    config: PublishConfig | None = None,
    if_exists: str = "error",
    resume: bool = True,
    client: S3 | None = None,
    gc_grace: float | timedelta = DEFAULT_GC_GRACE,
    signing_key: Any = None,
    dry_run: bool = False,
) -> SetPublishReport:
    """Publish a set of programs under one prefix, each distinct file once.

    Parameters
    ----------
    members : mapping of str to source or Member
        Member name -> what :func:`trtet_store.publish` takes (saved files:
        the ``.pte`` first, its ``.ptd`` files after; or a program), or a
        :class:`Member` with what its engines need. A program's ``.pte`` is
        named ``<member>.pte``; saved files keep their names.
    url : str
        ``s3://bucket/prefix/``: the set's prefix.
    endpoint_url : str, optional
        The S3-compatible server (as ``publish``).
    config : PublishConfig, optional
        How each blob is sent (part size, concurrency, journal directory,
        engine-digest index), as ``publish``.
    if_exists : {"error", "replace"}
        When the set exists: ``"error"`` raises :class:`KeyExistsError`
        (before anything is sent); ``"replace"`` replaces it (``If-Match``).
    resume : bool
        Resume an interrupted upload of a blob from its journal (default).
    client : S3, optional
        The client every call goes through (default: one at ``endpoint_url``).
    gc_grace : float or timedelta
        After the commit, blobs under ``<prefix>blobs/`` that no manifest
        names (a losing publisher's, a killed publish's) and that are older
        than this (seconds, or a timedelta; by the server's clock) are
        removed. Default 24 hours: a younger one may be a concurrent
        publisher's upload, not committed yet. ``0`` only where no other
        publisher of the set is running.
    signing_key : path-like or SigningKey, optional
        Sign the set manifest (:mod:`.signed`): every blob named by sha256
        too, taken in the pass that reads each file. Default:
        ``TRTET_SIGNING_KEY``, else the config file's, else unsigned.
    dry_run : bool
        Read every file and the bucket, send, commit and delete nothing: the
        report's ``removed``, ``pruned`` and ``kept`` are the sweeps' plan
        (ages by this machine's clock, the real run's by the server's).

    Returns
    -------
    SetPublishReport

    Raises
    ------
    TypeError, ValueError, RemoteURLError, FileNameError
        Bad arguments (a member name that is not a plain name, a file name
        no program may have, unreadable metadata); nothing sent.
    KeyExistsError
        The set exists and ``if_exists="error"``; nothing sent.
    ConflictError
        Another publisher committed the set after this one read it; its set
        stays, ours was not committed (the blobs we sent stay, unnamed, until a
        publish prunes them: ``gc_grace``).
    SourceChangedError
        A file changed while it was read or sent.
    UploadKeptError, ChecksumMismatchError
        As ``publish``: publish the set again to resume.
    """
    cfg = config_of(config, "publish_set")
    grace = _grace_of(gc_grace)
    replace = replace_of(UNSET, if_exists, "publish_set")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, not {resume!r}")
    if not isinstance(members, Mapping) or not members:
        raise TypeError("members must be a non-empty mapping of member name -> program")
    bucket, prefix = parse_set_url(url)
    where = f"publish_set s3://{bucket}/{prefix}"
    wanted = {}
    for name, value in members.items():
        why = member_name_problem(name)
        if why is not None:
            raise ValueError(f"{where}: member name {name!r} {why}")
        member = value if isinstance(value, Member) else Member(value)
        meta = member.metadata()
        if "executorch" not in meta and not _is_files(member.source):
            meta["executorch"] = _installed_executorch()
        check_metadata(meta, name)
        wanted[name] = (member.source, meta)

    key = resolve_signing(signing_key)
    s3 = client if client is not None else S3(endpoint_url,
                                              max_connections=cfg.concurrency + 2)
    s3.check_bucket(bucket)
    skey = prefix + SET_KEY
    got = s3.get(bucket, skey, limit=SET_MAX_BYTES)
    base_etag, old = None, None
    if got is not None:
        if not replace:
            raise KeyExistsError(f"the set s3://{bucket}/{skey} exists; pass "
                                 "if_exists='replace' to publish a new version", skey)
        base_etag = got[1]
        try:
            old = SetManifest.from_json(got[0])
        except ManifestError as exc:
            log.warning("%s: the set manifest there cannot be read (%s); its blobs are not "
                        "removed", where, exc)

    # 1. read every file once (nothing sent yet), each member's names held first to the
    # closed set fetch_set holds them to (one rule: check_member_files)
    sources = {name: _sources(source, bucket, prefix, name)
               for name, (source, _) in wanted.items()}
    for name, objs in sources.items():
        check_member_files([s.name for s in objs], f"{where}: member {name!r}")
    files: dict[str, list[tuple[str, _File]]] = {}
    for name, objs in sources.items():
        files[name] = [(s.name, _read(s, sha256=key is not None)) for s in objs]
    distinct: dict[str, _File] = {}
    for entries in files.values():
        for _, f in entries:
            distinct.setdefault(f.digest, f)

    # 2. blobs
    report = SetPublishReport(f"s3://{bucket}/{prefix}", skey, "",
                              {n: [fn for fn, _ in e] for n, e in files.items()})
    report.bytes_files = sum(f.size for e in files.values() for _, f in e)
    report.bytes_distinct = sum(f.size for f in distinct.values())
    if dry_run:  # the plans the clean-up and the prune would execute after the commit
        removing = _to_remove(s3, bucket, prefix, old, set(distinct))
        plan, objects = _prune_plan(s3, bucket, prefix, distinct, removing, grace, None)
        report.dry_run, report.removed = True, sorted(removing)
        report.pruned = [i.key.rpartition("/")[2] for i in plan.doomed if i.key in objects]
        report.kept = {d: why for k, why in plan.kept.items()
                       if k in objects and (d := k.rpartition("/")[2]) not in removing}
        return report
    blobs = _send_blobs(s3, bucket, prefix, distinct, cfg, resume, report, old)

    # 3. commit, with what the replaced version alone named (and what a publish killed
    # before its clean-up left to remove) recorded, so a kill after the commit leaks nothing
    removing = _to_remove(s3, bucket, prefix, old, set(blobs))
    manifest = SetManifest(
        members={n: MemberEntry(tuple(FileEntry(fn, f.digest, f.size, f.crc64nvme, f.chunks)
                                      for fn, f in files[n]), wanted[n][1])
                 for n in wanted},
        blobs=blobs, chunk_size=CHUNK_SIZE, removing=removing)
    body = manifest.to_json()
    if key is not None:
        body = sign_set(body, {d: f.sha256 for d, f in distinct.items()}, key)
    report.manifest_etag = _commit(s3, bucket, skey, body, base_etag)

    # 4. check, then tidy what the replaced version alone named
    _recheck(s3, bucket, prefix, manifest, distinct, cfg, resume)
    report.removed = _remove_unnamed(s3, bucket, prefix, skey, report.manifest_etag,
                                     manifest)
    report.pruned = _prune(s3, bucket, prefix, skey, report.manifest_etag, manifest, grace)
    log.info("published the set s3://%s/%s: %d member(s), %d bytes of files in %d distinct "
             "bytes: %d uploaded, %d copied server-side, %d present already, %d blob(s) "
             "removed, %d pruned", bucket, prefix, len(wanted), report.bytes_files,
             report.bytes_distinct, report.bytes_uploaded, report.bytes_copied,
             report.bytes_present, len(report.removed), len(report.pruned))
    return report


def _is_files(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and all(
        isinstance(s, (str, os.PathLike)) for s in source)


def _installed_executorch() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


def _sources(source: Any, bucket: str, prefix: str, member: str) -> list[ObjectSource]:
    """The member's objects, named as the runtime reads them (publish's own rules)."""
    if _is_files(source):
        first = source if isinstance(source, (str, os.PathLike)) else source[0]
        name = os.path.basename(os.fspath(first))
    else:
        name = f"{member}.pte"
    return sources_of(source, RemoteURL(bucket, f"{prefix}{name}"))


def _read(source: ObjectSource, *, sha256: bool = False) -> _File:
    """Digest ``source`` once: the whole file's xxh3-128 and per-MiB xxh3-64, its CRC64NVME.

    Each local file piece is planned again with the chunk digests of its
    bytes now, so the upload refuses it if it changes before it is sent.
    """
    source.check()
    whole = Digester(CHUNK_SIZE, sha256=sha256)
    crc = 0
    buf = memoryview(bytearray(READ_STEP))
    pieces = []
    for e in source.extents:
        own = Digester(CHUNK_SIZE) if isinstance(e.piece, ExternalFile) else None
        pos = 0
        while pos < e.size:
            n = min(READ_STEP, e.size - pos)
            view = buf[:n]
            source.read_at(e.offset + pos, view)
            whole.update(view)
            crc = crc64nvme(view, crc)
            if own is not None:
                own.update(view)
            pos += n
        if own is not None:
            p = e.piece
            pieces.append(ExternalFile(p.path, p.size, p.offset, p.file_size, CHUNK_SIZE,
                                       own.finish()[1]))
        else:
            pieces.append(e.piece)
    digest, chunks = whole.finish()
    return _File(ObjectSource(source.name, pieces), digest, tuple(chunks), crc64nvme_b64(crc),
                 whole.sha256())


# --- 2. blobs --------------------------------------------------------------------------------


def _present(s3: S3, bucket: str, key: str, f: _File) -> BlobEntry | None:
    """The blob at ``key`` when the bucket holds ``f``'s bytes there, committed; else None."""
    got = s3.get(bucket, manifest_key(key))
    if got is None:
        return None
    try:
        m = Manifest.from_json(got[0])
    except ManifestError:
        return None
    o = m.objects[0]
    if len(m.objects) != 1 or o.key != key or o.size != f.size or o.crc64nvme != f.crc64nvme:
        return None
    head = s3.head(bucket, key)
    if head is None or head.etag != o.etag or head.size != f.size or \
            (head.crc64nvme is not None and head.crc64nvme != f.crc64nvme):
        return None
    return BlobEntry(f.size, o.etag, f.crc64nvme)


def _upload(s3: S3, bucket: str, key: str, f: _File, cfg: PublishConfig,
            resume: bool, report: SetPublishReport | None, renew: bool = False) -> BlobEntry:
    """Publish one blob with publish's machinery; a rival's identical blob is taken.

    ``renew``: a new version even of the same bytes (:func:`_renew`); a
    conflict is then the caller's to handle.
    """
    blob = ObjectSource(f.digest, list(f.source.pieces))
    try:
        # Replacing: a key of our digest holding other bytes (or no manifest) is ours to
        # repair; the Complete is still conditional on the version read.
        rep = publish_blob(blob, RemoteURL(bucket, key), client=s3, config=cfg,
                           resume=resume, renew=renew)
    except ConflictError:
        entry = None if renew else _present(s3, bucket, key, f)
        if entry is None:
            raise
        log.info("s3://%s/%s: another publisher sent the same blob meanwhile; taken", bucket,
                 key)
        if report is not None:
            report.bytes_present += f.size
            report.blobs_present.append(f.digest)
        return entry
    if rep.checksum != f.crc64nvme:
        raise RemoteError(f"s3://{bucket}/{key}: published with CRC64NVME {rep.checksum}, "
                          f"its bytes read {f.crc64nvme}")
    if report is not None:
        report.bytes_uploaded += rep.bytes_sent
        report.bytes_copied += rep.bytes_copied
        report.bytes_present += rep.bytes_unchanged
        report.blobs_uploaded.append(f.digest)
    return BlobEntry(f.size, rep.objects[0].etag, f.crc64nvme)


def _send_blobs(s3: S3, bucket: str, prefix: str, distinct: dict[str, _File],
                cfg: PublishConfig, resume: bool, report: SetPublishReport,
                base: SetManifest | None = None) -> dict[str, BlobEntry]:
    """Every distinct file in the bucket: taken, renewed, or published.

    A blob found present is taken as it is only when ``base`` (the version
    we replace) names it. Any other (one ``base`` lists in ``removing``, a
    losing publisher's, one a killed publish left) may be deleted at its
    ETag by a clean-up or a prune that decided before our commit, so it is
    renewed: written again in a form whose ETag differs (:func:`_renew`),
    and such a delete is refused.
    """
    named = base.blobs if base is not None else {}
    removing = base.removing if base is not None else {}
    blobs = {}
    for digest, f in distinct.items():
        key = blob_key(prefix, digest)
        entry = _present(s3, bucket, key, f)
        avoid = {removing[digest]} if digest in removing else set()
        if entry is not None and digest in named:
            report.bytes_present += f.size
            report.blobs_present.append(digest)
        elif entry is not None or avoid:
            entry = _renew(s3, bucket, key, f, cfg, resume, report,
                           avoid | ({entry.etag} if entry is not None else set()))
        else:
            entry = _upload(s3, bucket, key, f, cfg, resume, report)
        blobs[digest] = entry
    return blobs


def _renew(s3: S3, bucket: str, key: str, f: _File, cfg: PublishConfig, resume: bool,
           report: SetPublishReport, avoid: set[str]) -> BlobEntry:
    """Write the blob ``f`` at ``key`` again, with an ETag none of ``avoid``; its entry.

    A delete pinned to an old ETag (``If-Match``) must be refused once we
    name the blob. The same bytes in the same parts give the same ETag
    (S3's and SeaweedFS's are digests of the parts), and a server-side
    self-copy keeps it on SeaweedFS: only another layout changes it. A
    multipart ETag ends in ``-<parts>``, a PutObject's does not; so the blob
    goes up in parts of another count (copied server-side from the version
    there where it is still there), or, for a blob of one part, by
    PutObject with its manifest (:func:`_put_small`). A delete landing in
    between fails our conditional write: tried again, with that ETag
    avoided too.
    """
    for _ in range(3):
        size = _layout_avoiding(f.size, avoid)
        try:
            if size is None:
                entry = _put_small(s3, bucket, key, f, avoid)
                report.bytes_uploaded += f.size
                report.blobs_uploaded.append(f.digest)
            else:
                entry = _upload(s3, bucket, key, f, replace_config(cfg, part_size=size),
                                resume, report, renew=True)
        except ConflictError:
            head = s3.head(bucket, key)
            if head is not None:
                avoid.add(head.etag)
            continue
        if entry.etag not in avoid:
            log.info("s3://%s/%s: renewed (ETag %s, not %s): a clean-up or prune that read "
                     "the old one cannot remove it", bucket, key, entry.etag, sorted(avoid))
            return entry
        avoid.add(entry.etag)
    raise ConflictError(f"s3://{bucket}/{key} is being removed by another publisher's "
                        "clean-up while this one renews it; nothing was committed (publish "
                        "again)", key)


def _layout_avoiding(size: int, avoid: set[str]) -> int | None:
    """A part size whose multipart ETag (``...-<count>``) none of ``avoid`` has; None: none."""
    counts = set()
    for etag in avoid:
        head, dash, tail = etag.rpartition("-")
        if dash and head and tail.isdigit():
            counts.add(int(tail))
    for part in (choose_part_size(size), MIN_PART_SIZE, min(MAX_PART_SIZE,
                                                           max(MIN_PART_SIZE, size))):
        try:
            part = choose_part_size(size, part)
        except PartSizeError:
            continue
        if max(1, -(-size // part)) not in counts:
            return part
    return None


def _put_small(s3: S3, bucket: str, key: str, f: _File, avoid: set[str]) -> BlobEntry:
    """A blob of at most one part, by PutObject (an ETag without ``-1``), then its manifest.

    Each write is conditional on the version read; a change in between is
    a :class:`ConflictError` (the caller tries again).
    """
    if f.size > MIN_PART_SIZE:
        raise ValueError(f"{key}: {f.size} bytes are more than one part")
    body = memoryview(bytearray(f.size))
    f.source.check()
    if f.size:
        f.source.read_at(0, body)
    if crc64nvme_b64(crc64nvme(body)) != f.crc64nvme:
        path = next((p.path for p in f.source.pieces if isinstance(p, ExternalFile)),
                    f.source.name)
        raise SourceChangedError(path, "its bytes changed since they were read")
    mkey = manifest_key(key)
    head = s3.head(bucket, key)
    mhead = s3.head(bucket, mkey)
    try:
        etag = s3.put(bucket, key, bytes(body), f.crc64nvme, if_none_match=head is None,
                      if_match=head.etag if head is not None else None,
                      content_type="application/octet-stream")
        entry = ObjectEntry(f.digest, key, f.size, etag, f.crc64nvme, MIN_PART_SIZE,
                            (PartEntry(1, 0, f.size, etag, f.crc64nvme,
                                       hashlib.md5(body).hexdigest()),),
                            (PieceEntry(0, f.size, "file", f.digest, f.chunks),))
        doc = Manifest(program=f.digest, chunk_size=CHUNK_SIZE, objects=(entry,)).to_json()
        s3.put(bucket, mkey, doc, crc64nvme_b64(crc64nvme(doc)), if_none_match=mhead is None,
               if_match=mhead.etag if mhead is not None else None)
    except PreconditionFailed:
        raise ConflictError(f"s3://{bucket}/{key} changed while it was renewed", key) from None
    now = s3.head(bucket, key)
    if now is None or now.etag != etag:
        raise ConflictError(f"s3://{bucket}/{key} changed right after it was renewed", key)
    return BlobEntry(f.size, etag, f.crc64nvme)


# --- 3. commit, 4. check and tidy --------------------------------------------------------------


def _commit(s3: S3, bucket: str, key: str, body: bytes, base: str | None) -> str:
    """The set manifest, conditional on the version read; its ETag."""
    crc = crc64nvme_b64(crc64nvme(body))
    try:
        etag = s3.put(bucket, key, body, crc, if_none_match=base is None, if_match=base)
    except PreconditionFailed:
        got = s3.get(bucket, key, limit=SET_MAX_BYTES)
        if got is not None and got[0] == body:  # ours: its answer was lost and retried
            return got[1]
        raise ConflictError(f"the set s3://{bucket}/{key} was "
                            f"{'written' if base is None else 'changed'} by another publisher "
                            "after this one read it; it was not overwritten (publish again, "
                            "with if_exists='replace')", key) from None
    # A server that checks the condition apart from the write (SeaweedFS) may let a rival's
    # put land right after ours: what is there now is what readers follow.
    got = s3.get(bucket, key, limit=SET_MAX_BYTES)
    if got is None or got[0] != body:
        raise ConflictError(f"the set s3://{bucket}/{key} was replaced by another publisher "
                            "right after our write; theirs stays", key)
    return etag


def _recheck(s3: S3, bucket: str, prefix: str, manifest: SetManifest,
             distinct: dict[str, _File], cfg: PublishConfig, resume: bool) -> None:
    """Every blob the committed manifest names is there; one removed meanwhile is sent again.

    A publish that replaced the set just before ours removed the blobs its
    base alone named: one of them we found present may be gone.
    """
    for digest, entry in manifest.blobs.items():
        key = blob_key(prefix, digest)
        head = s3.head(bucket, key)
        if head is not None and head.size == entry.size and (
                head.crc64nvme is None or head.crc64nvme == entry.crc64nvme) and \
                s3.head(bucket, manifest_key(key)) is not None:
            continue
        log.warning("s3://%s/%s was removed after it was found present; sending it again",
                    bucket, key)
        _upload(s3, bucket, key, distinct[digest], cfg, resume, None)


def _to_remove(s3: S3, bucket: str, prefix: str, old: SetManifest | None,
               named: set[str]) -> dict[str, str]:
    """``{blob: etag}`` the new manifest will have removed: the replaced version's blobs it
    no longer names, and those a publish killed before its clean-up left, still there."""
    if old is None:
        return {}
    out = {d: b.etag for d, b in old.blobs.items() if d not in named}
    for digest, etag in old.removing.items():
        if digest not in named and digest not in out:
            head = s3.head(bucket, blob_key(prefix, digest))
            if head is not None and head.etag == etag:  # another ETag: renewed, not ours
                out[digest] = etag
    return out


def _remove_unnamed(s3: S3, bucket: str, prefix: str, skey: str, ours: str,
                    new: SetManifest) -> list[str]:
    """The blobs ``new.removing`` lists, removed (each only at the ETag recorded)."""
    if not new.removing:
        return []
    head = s3.head(bucket, skey)
    if head is None or head.etag != ours:
        log.info("s3://%s/%s changed since our commit; the newer publish removes what it "
                 "replaced", bucket, skey)
        return []
    plan = plan_sweep([Listed(blob_key(prefix, d), e) for d, e in new.removing.items()], (), 0)
    return [k.rpartition("/")[2] for k in plan.execute(s3, bucket, first=_blob_first(s3, bucket))]


def _blob_first(s3: S3, bucket: str) -> Callable[[Listed], list[tuple[str, str]] | None]:
    """What the sweep deletes before a blob: its manifest, at the version read now, which must
    name the blob's listed ETag (None: keep the blob).

    A blob renewed since it was listed (:func:`_renew`: a new ETag, a new
    manifest) is never touched. The manifest goes first: a blob manifest a
    reader finds always names an object that is there. A renewal that lands
    between the two writes its manifest against the version we deleted,
    fails, and is tried again (the object stays). A manifest left without its
    object (listed as itself) goes alone.
    """
    def first(item: Listed) -> list[tuple[str, str]] | None:
        if item.key.endswith(MANIFEST_SUFFIX):
            return []
        mkey = manifest_key(item.key)
        got = s3.get(bucket, mkey)
        if got is None:  # None: removed already (by the publish that listed it, killed after)
            return [] if s3.head(bucket, item.key) is not None else None
        if _names(got[0], item.key) != item.etag:
            log.info("s3://%s/%s was written again since it was listed; kept", bucket, item.key)
            return None
        return [(mkey, got[1])]
    return first


def _names(doc: bytes, key: str) -> str | None:
    """The ETag a blob manifest names for ``key``; None when it names no such one object."""
    try:
        m = Manifest.from_json(doc)
    except ManifestError:
        return None
    if len(m.objects) != 1 or m.objects[0].key != key:
        return None
    return m.objects[0].etag


def _grace_of(value: Any) -> float:
    """``gc_grace`` in seconds: a non-negative finite number, or a timedelta."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"gc_grace must be seconds (a number) or a timedelta, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"gc_grace must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def _prune(s3: S3, bucket: str, prefix: str, skey: str, ours: str, new: SetManifest,
           grace: float) -> list[str]:
    """The blobs no manifest names, older than ``grace`` seconds, removed; their digests.

    Ages are by the server's clock: LastModified against our committed set
    manifest's. Kept: what ``new`` names, what it lists in ``removing``
    (the clean-up's), anything younger (a concurrent publisher's upload, or
    a renewal, not committed yet), and everything once the set manifest is
    not ours any more (the newer publish prunes). Each goes as the version
    listed (:func:`_blob_first`): a blob renewed since, to be named by a
    publish under way, refuses the delete. Best effort, like the clean-up.
    """
    try:
        mine = s3.get_dated(bucket, skey, SET_MAX_BYTES)
        if mine is None or mine.etag != ours or mine.modified is None:
            log.info("s3://%s/%s changed since our commit; the newer publish prunes", bucket,
                     skey)
            return []
        plan, objects = _prune_plan(s3, bucket, prefix, new.blobs, new.removing, grace,
                                    mine.modified)
    except RemoteError as exc:
        log.warning("s3://%s/%s%s was not pruned (%s)", bucket, prefix, BLOBS, exc)
        return []
    gone = plan.execute(s3, bucket, first=_blob_first(s3, bucket))
    pruned = [k.rpartition("/")[2] for k in gone if k in objects]
    if pruned:
        log.info("pruned %d blob(s) under s3://%s/%s%s that no manifest names, older than "
                 "%.0f s", len(pruned), bucket, prefix, BLOBS, grace)
    return pruned


def _prune_plan(s3: S3, bucket: str, prefix: str, blobs: Iterable[str], removing: Iterable[str],
                grace: float, now: float | None) -> tuple[SweepPlan, set[str]]:
    """The prune's plan over ``<prefix>blobs/`` (what the set names or the clean-up removes
    kept, said why), and the listed keys that are blobs (not their manifests)."""
    listed = s3.list_etags(bucket, prefix + BLOBS)
    named = {blob_key(prefix, d): "named by the set" for d in blobs}
    named.update({blob_key(prefix, d): "removed by the clean-up" for d in removing})
    named.update({manifest_key(k): why for k, why in named.items()})
    objects = {k for k, _, _ in listed if _HEX128.fullmatch(k.rpartition("/")[2])}
    # A blob's manifest goes with it; one left without its object (a clean-up killed in
    # between) goes alone.
    listing = [Listed(k, etag, modified) for k, modified, etag in listed
               if k in objects or (k.endswith(MANIFEST_SUFFIX) and k[:-len(MANIFEST_SUFFIX)]
                                   not in objects and _HEX128.fullmatch(
                                       k[len(prefix + BLOBS):-len(MANIFEST_SUFFIX)]))]
    return plan_sweep(listing, named, grace, now=now), objects


__all__ = ["Member", "parse_set_url", "publish_set"]
