"""A publish's parts on their way: read in order from the pieces, sent or copied, with retries.

The reader (the calling thread) reads each part's bytes in order straight
from the pieces into one of ``concurrency + 1`` recycled part buffers and
digests every piece as it passes; at most ``concurrency`` parts are in
flight on worker threads, which hash (CRC64NVME, sent with the part),
journal, and send or copy. A refused checksum (BadDigest) is sent again; a
network failure is retried; a part a resume finds on the server is kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from trtet_store.io import SourceChangedError
from trtet_store.remote import checksum
from trtet_store.remote.manifest import crc64nvme_b64
from trtet_store.remote.report import ObjectReport
from trtet_store.remote.s3 import S3, BadDigest, NoSuchUpload, PreconditionFailed, Transient
from trtet_store.remote.upload import delta
from trtet_store.remote.upload.journal import Journal
from trtet_store.remote.upload.parts import Part
from trtet_store.remote.upload.plan import DIGEST_WINDOW, ObjectUpload
from trtet_store.remote.upload.source import ObjectSource, Reader

# The publish's logger, as before the sending left send.py.
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


@dataclass
class Counters:
    """A publish's bytes by how they reached the bucket, and its retries (shared by threads)."""

    sent: int = 0
    copied: int = 0
    resumed: int = 0
    unchanged: int = 0
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def send_object(s3: S3, bucket: str, o: ObjectUpload, journal: Journal, counters: Counters,
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
    window = memoryview(bytearray(min(DIGEST_WINDOW, max(copied, 1))))

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


def _upload_part(s3: S3, bucket: str, o: ObjectUpload, part: Part, buf: bytearray | memoryview,
                 journal: Journal, counters: Counters, report_progress: Callable[[], None]
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


def _copy_part(s3: S3, bucket: str, o: ObjectUpload, part: Part, copy: delta.CopyFrom, crc: int,
               md5: str, journal: Journal, counters: Counters,
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


def _part_done(o: ObjectUpload, part: Part, etag: str, crc: int, md5: str, how: str,
               journal: Journal, counters: Counters,
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
