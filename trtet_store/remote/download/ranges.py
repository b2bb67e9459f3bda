"""Step 4 of a fetch: every range not staged yet, downloaded in parallel (a mixin).

Ranged GETs run on a pool of ``concurrency`` threads, each pinned with
``If-Match`` and checked against the manifest's chunk digests (a bad or cut
short range is fetched again, up to ``attempts`` times), then handed to the
one writer thread (:mod:`.writer`) that stages and journals it. A range
longer than :data:`PIECE_SIZE` is handed over in pieces (on the chunk grid)
as its bytes arrive: each piece is checked against its chunk digests, then
written and journaled with its CRC, and the range's own line follows its
last piece. So a fetch killed or cut off mid-range keeps every whole piece
it checked, a retry of the range asks only for what follows them, and a
resume keeps every journaled range or piece whose staged bytes still check,
whatever its size, and downloads only the gaps. An object downloaded whole
is digested as it arrives; every object's full checksum is still combined
from every byte's CRC (:mod:`.verify`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from trtet_store.io import InOrderDigest, MiB
from trtet_store.remote.checksum import crc_functions
from trtet_store.remote.download.plan import ObjectPlan, ObjectSpec, Range, Run, split_run
from trtet_store.remote.download.staging import Staging
from trtet_store.remote.download.verify import chunks_ok, sha256_ok, staged_ok
from trtet_store.remote.download.writer import RangeWriter
from trtet_store.remote.errors import (
    FetchInterruptedError,
    FetchVerificationError,
    ProgramSignatureError,
)
from trtet_store.remote.s3 import ReadInterrupted, Transient

# The fetch's logger: a range's retry is said as the fetch's own line.
log = logging.getLogger("trtet_store.remote.download.receive")

#: A range longer than this is written and journaled in pieces of at most about this
#: size, ending on the manifest's chunk boundaries, as its bytes arrive and check: what
#: a kill mid-range loses is at most one piece per range in flight.
PIECE_SIZE = 4 * MiB


class _BadPiece(Exception):  # noqa: N818 - a signal inside one GET, never raised further
    """A piece's bytes failed the manifest's chunk digests while its range was read."""


def pieces_of(spec: ObjectSpec, rng: Range) -> list[Range]:
    """``rng`` cut into pieces of at most :data:`PIECE_SIZE` on the chunk grid (``[rng]``
    for a range no longer than one)."""
    if rng.size <= PIECE_SIZE:
        return [rng]
    run = Run(rng.obj, rng.offset, rng.size)
    split_run(spec, rng.obj, rng.run, run, PIECE_SIZE)
    return run.ranges


class RangeDownload:
    """One fetch attempt's download step: :meth:`download` and one range's GET.

    Held by :class:`~.receive._Fetch` for an attempt: it is given what it reads
    (the reader, the bucket, the fetch's settings) and what it reports through
    (``tick`` for progress, ``resumed`` once the resumed bytes are known), and
    keeps its own results: :attr:`in_order` (the objects digested as they
    arrive) and :attr:`range_retries`.
    """

    def __init__(self, reader: Any, bucket: str, *, concurrency: int, range_size: int,
                 attempts: int, sha256: bool, tick: Callable[..., None],
                 resumed: Callable[[int], None], resume_command: Callable[[], str]) -> None:
        self.reader = reader
        self.bucket = bucket
        self.concurrency = concurrency
        self.range_size = range_size
        self.attempts = attempts
        self.sha256 = sha256
        self._tick = tick
        self._resumed = resumed
        self.resume_command = resume_command
        #: Objects digested as they arrive (every byte downloaded by this attempt).
        self.in_order: dict[int, InOrderDigest] = {}
        self.range_retries = 0
        self._mutex = threading.Lock()

    def download(self, plans: list[ObjectPlan], stage: Staging) -> int:
        """Every range not staged yet, in parallel; returns the bytes kept from a resumed fetch."""
        todo: list[tuple[ObjectSpec, Run, Range]] = []
        resumed = 0
        for plan in plans:
            for index, run in enumerate(plan.runs):
                kept, missing = self._replan_run(plan.spec, index, run, stage)
                resumed += sum(r.size for r in kept)
                todo += [(plan.spec, run, rng) for rng in missing]
        self._resumed(resumed)
        for obj, plan in enumerate(plans):
            # Digested as it arrives when every byte of it is downloaded now: the
            # ranges, each checked by a GET thread, are added in offset order.
            spec = plan.spec
            mine = sum(rng.size for s, _, rng in todo if rng.obj == obj)
            if spec.size and mine == spec.size and not plan.reused_bytes:
                checked = sum(p.size for p in spec.pieces) == spec.size
                self.in_order[obj] = InOrderDigest(spec.size, counted=checked,
                                                   sha256=self.sha256)
        self._tick(0)
        if not todo:
            return resumed
        stop = threading.Event()
        # GETs in flight, plus two filled buffers waiting for the writer.
        buffers = min(self.concurrency + 2, len(todo))
        writer = RangeWriter(stage, buffers, self.range_size, stop)
        try:
            with ThreadPoolExecutor(self.concurrency, thread_name_prefix="trtet-fetch") as pool:
                futures = [pool.submit(self._one_range, spec, run, rng, writer, stop)
                           for spec, run, rng in todo]
                try:
                    wait(futures, return_when=FIRST_EXCEPTION)
                except BaseException:
                    # Interrupted (Ctrl-C): the ranges in flight finish or stop at their
                    # next step.
                    stop.set()
                    for f in futures:
                        f.cancel()
                    raise
                failed = [f for f in futures if f.done() and not f.cancelled()
                          and f.exception() is not None]
                if failed:
                    stop.set()
                    for f in futures:
                        f.cancel()
                    wait(futures)
                    raise failed[0].exception()
        finally:
            writer.close()  # writes what was queued; raises a write's failure
        return resumed

    def _replan_run(self, spec: ObjectSpec, index: int, run: Run,
                    stage: Staging) -> tuple[list[Range], list[Range]]:
        """``(kept, to download)``: the run's journaled ranges that still check, and the rest.

        Staged bytes are matched by what they cover, not by the ranges this
        fetch would cut: a resume with another range size keeps every
        journaled range inside the run whose bytes still check (each against
        its own CRC and the manifest's chunk digests, read back from the staged
        file, whatever the journal says), and downloads only the gaps between
        them, cut into ranges of this fetch's size on the same chunk grid.
        ``run.ranges`` becomes the kept and the new ranges, in offset order
        (what the verification combines).
        """
        end = run.offset + run.size
        # By offset, the longest first: a whole range before its own pieces (which it
        # covers), and its pieces when it does not check (or was never journaled).
        journaled = sorted((k for k in stage.done if k[0] == run.obj and run.offset <= k[1]
                            and k[1] + k[2] <= end), key=lambda k: (k[1], -k[2]))
        kept: list[Range] = []
        covered = run.offset
        for obj, offset, size in journaled:
            rng = Range(obj, index, offset, size)
            # Ranges of two earlier attempts may overlap: the first that checks wins.
            if offset < covered and kept:
                stage.forget(rng)
                continue
            if staged_ok(spec, stage, run, rng, stage.done[(obj, offset, size)]):
                kept.append(rng)
                covered = rng.end
            else:
                stage.forget(rng)
        missing: list[Range] = []
        pos = run.offset
        for rng in [*kept, None]:
            stop = end if rng is None else rng.offset
            if stop > pos:
                gap = Run(run.obj, pos, stop - pos)
                split_run(spec, run.obj, index, gap, self.range_size)
                missing += gap.ranges
            if rng is not None:
                pos = rng.end
        run.ranges = sorted([*kept, *missing], key=lambda r: r.offset)
        return kept, missing

    def _one_range(self, spec: ObjectSpec, run: Run, rng: Range, writer: RangeWriter,
                   stop: threading.Event) -> None:
        compute, combine = crc_functions(spec.checksum[0] if spec.checksum else "crc64nvme")
        pieces = pieces_of(spec, rng)
        buf = writer.buffer(rng.size)
        if buf is None:
            return  # the fetch stopped
        handed = queued = False
        # Bytes of the range handed over as checked pieces (a prefix), the next piece's
        # index, and the CRC of those bytes.
        have, nxt, crc = 0, 0, 0

        def checked(view: memoryview, piece: Range) -> int:
            """The CRC of ``piece``'s bytes in ``view``, or _BadPiece."""
            part = view[piece.offset - rng.offset:piece.end - rng.offset]
            if not chunks_ok(spec, piece, part):
                raise _BadPiece
            if not sha256_ok(spec, piece, part):
                # Its xxh3 is the manifest's, its sha256 is not the signed one: no
                # network fault makes that, so it is not fetched again.
                raise ProgramSignatureError(
                    f"s3://{self.bucket}/{spec.key} bytes {piece.offset}-{piece.end - 1}: "
                    "their sha256 is not the one the signed manifest names (their xxh3 "
                    "is): refused, nothing placed")
            return compute(part)

        try:
            with memoryview(buf) as whole:
                view = whole[:rng.size]
                for attempt in range(1, self.attempts + 1):
                    if stop.is_set():
                        return
                    start, got = have, 0

                    def received(n: int, start: int = start) -> None:
                        # Every piece but the last as soon as it is in: checked, then
                        # written and journaled (the range's line comes after the last).
                        nonlocal got, have, nxt, crc, queued
                        self._tick(n, rng.obj)
                        got += n
                        while nxt < len(pieces) - 1 and \
                                pieces[nxt].end - rng.offset <= start + got:
                            piece = pieces[nxt]
                            value = checked(view, piece)
                            crc = combine(crc, value, piece.size) if nxt else value
                            writer.submit(run, piece, buf, value, at=piece.offset - rng.offset,
                                          last=False)
                            queued = True
                            have, nxt = piece.end - rng.offset, nxt + 1

                    try:
                        self.reader.get_range(spec.key, spec.etag, rng.offset + have,
                                              rng.size - have, view[have:], received)
                        last = pieces[-1]
                        value = checked(view, last)
                    except _BadPiece:
                        if attempt < self.attempts:
                            self._retry(spec, rng, "its bytes do not match the manifest's "
                                        "digests", attempt)
                            continue
                        raise FetchVerificationError(
                            f"s3://{self.bucket}/{spec.key} bytes {rng.offset}-{rng.end - 1} "
                            f"did not match the manifest's chunk digests in {self.attempts} "
                            "attempts; nothing local was changed") from None
                    except Transient as exc:
                        # Only a body cut short is retried here; a request botocore's
                        # retries did not get through is an interruption at once.
                        if attempt < self.attempts and isinstance(exc, ReadInterrupted):
                            self._retry(spec, rng, str(exc), attempt)
                            continue
                        raise FetchInterruptedError(
                            f"s3://{self.bucket}/{spec.key} bytes {rng.offset}-"
                            f"{rng.end - 1}: {self.attempts} attempts failed, the last "
                            f"with {exc}", self.resume_command()) from exc
                    crc = combine(crc, value, last.size) if nxt else value
                    digester = self.in_order.get(rng.obj)
                    if digester is not None:
                        digester.add(rng.offset, view, stop)
                    view.release()
                    break
            if len(pieces) == 1:
                writer.submit(run, rng, buf, crc)
            else:
                writer.submit(run, last, buf, value, at=last.offset - rng.offset,
                              then=(rng, crc))
            handed = True
        finally:
            if not handed:
                if queued:
                    writer.release(buf)  # once the pieces queued from it are written
                else:
                    writer.give_back(buf)

    def _retry(self, spec: ObjectSpec, rng: Range, why: str, attempt: int) -> None:
        with self._mutex:
            self.range_retries += 1
        log.info("s3://%s/%s bytes %d-%d: %s; retry %d of %d", self.bucket, spec.key,
                 rng.offset, rng.end - 1, why, attempt, self.attempts - 1)
        time.sleep(min(0.1 * 2 ** (attempt - 1), 2.0))
