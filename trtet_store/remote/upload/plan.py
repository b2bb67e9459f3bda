"""A publish's plan: each object's parts, what a resume keeps, and what is copied server-side.

:class:`ObjectUpload` is one object's plan and state for the whole publish.
A journal of an interrupted publish of the same pieces is loaded into it
(:func:`resume_state`); otherwise the parts lying inside ranges the bucket
already holds (the previous manifest's, the engine-digest index's) are
planned as server-side copies (:func:`plan_copies`, :mod:`.delta`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from trtet_store.io import MiB
from trtet_store.remote import checksum
from trtet_store.remote.errors import ManifestError
from trtet_store.remote.manifest import Manifest, crc64nvme_b64
from trtet_store.remote.report import ObjectReport
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload import delta
from trtet_store.remote.upload.index import MIN_INDEXED, index_lookup
from trtet_store.remote.upload.parts import Part
from trtet_store.remote.upload.source import ObjectSource, Reader, piece_digests

# The publish's logger, as before the plan left send.py.
log = logging.getLogger("trtet_store.remote")

#: Bytes read at a time where they are only digested (a copied part, a resume's check).
DIGEST_WINDOW = 8 * MiB


@dataclass
class ObjectUpload:
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


def fingerprint(objs: list[ObjectUpload]) -> list[Any]:
    """What a journal's plan must match to be resumed: names, keys, sizes, parts, extents."""
    return [[o.name, o.key, o.source.size, o.part_size,
             [[e.kind, e.size] for e in o.source.extents]] for o in objs]


def resume_state(records: list[dict], objs: list[ObjectUpload]) -> str | None | bool:
    """Load a matching journal into ``objs``; returns the manifest's base ETag, or None.

    Returns ``None`` (start over) when the journal's plan is for other pieces.
    A matching journal with no manifest base returns ``False`` (falsy but
    not None) so callers can tell it from "no journal".
    """
    plan = records[0]
    if plan.get("fingerprint") != fingerprint(objs):
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
        window = memoryview(bytearray(min(DIGEST_WINDOW, max(source.size, 1))))
        while reader.pos < source.size:
            n = min(len(window), source.size - reader.pos)
            reader.read_into(window[:n])
            crc = checksum.crc64nvme(window[:n], crc)
    finally:
        reader.close()
    return crc64nvme_b64(crc) == crc_b64


def plan_copies(s3: S3, bucket: str, objs: list[ObjectUpload], heads: dict, mkey: str,
                 index: bool) -> dict[str, str]:
    """Fill each object's ``copies`` from the previous manifest and the index.

    Returns the previous version's objects, ``{key: etag}`` as its manifest
    names them (empty without a readable one): after the new manifest
    commits, those it no longer names are removed
    (:func:`~trtet_store.remote.upload.owners.remove_replaced`).
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
                # Read once, to find it among the candidates (and, for a signed manifest,
                # an object of this one piece is named by sha256 from the same pass).
                digest = piece_digests(e, o.source if len(o.source.extents) == 1 else None)[0]
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
    :func:`~trtet_store.remote.upload.owners.remove_replaced`) or replaced: a copy from it
    would fail, or
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
