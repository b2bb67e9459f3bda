"""``fetch(url, path)``: a published program (or any object) onto a local disk.

The steps, in order (each a function below or in the module named):

1. **Describe.** Read the manifest beside the program (``<key>.trtet.json``);
   without one, HeadObject describes a plain object. HeadObject of every
   object, pinned by the manifest's ETag, checks that it is still the
   version the manifest names, and that its full-object CRC64NVME is the
   manifest's (:mod:`.describe`). With trusted keys the manifest must be
   signed by one and name every chunk by sha256, before any HEAD; every
   chunk downloaded, resumed from staging or reused from a local file is
   then checked by its sha256 too (:class:`ProgramSignatureError`).
2. **Delta.** Pieces already in local files (the destination's previous
   version, ``reuse=``) are found by their chunk digests
   (:mod:`.reuse`); the rest is planned as runs and ranges
   (:mod:`.plan`).
3. **Neighbours and preflight.** A ``.ptd`` of the program that another
   ``.pte`` of the directory needs is not replaced (ExecuTorch names them by
   tag; :mod:`.program`, opt-in ``replace_needed``). The free space the
   whole fetch needs on the destination's filesystem (downloaded bytes,
   plus what the final write's placements need) is checked before anything
   is created; a disk that fills later anyway is an
   ``InsufficientSpaceError`` too (:mod:`.space`).
4. **Download** (:mod:`.ranges`). Ranged GETs in parallel, each with ``If-Match``, each range
   checked against its chunk digests (a bad one is fetched again), written
   into its run's staged blob and journaled (:mod:`.staging`) by one
   writer thread (:mod:`.writer`); a range longer than a piece (4 MiB) piece by
   piece as its bytes arrive and check. Memory: ``(concurrency + 2) x
   range_size``. A resume keeps every journaled range or piece whose staged
   bytes still check, whatever its size, and downloads only the gaps.
5. **Verify.** The full-object checksum, combined from the ranges' (and the
   reused pieces') CRCs as they streamed, must equal the manifest's and
   HeadObject's (:mod:`.verify`).
6. **Write.** Every file of the program in one ``write_files`` transaction
   (``consume=True``: staged runs are inserted, cloned or moved, reused ranges
   cloned or copied from the old file, which stays intact until the rename).
   Then the previous version's ``.ptd`` files the new manifest no longer
   names are removed, unless a ``.pte`` of the directory needs them. A
   ``.pte`` without a manifest that needs ``.ptd`` files is refused before
   this step (``program_only`` to fetch it alone); both are :mod:`.program`'s
   rules.

A program replaced mid-fetch fails a GET's ``If-Match`` (412): the fetch
starts again against the new manifest (``if_replaced="restart"``, the
default) or raises :class:`ObjectChangedError`; it never mixes versions.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trtet_store.io import (
    STAGING_DIR,
    UNSET,
    ExternalFile,
    InOrderDigest,
    InsufficientSpaceError,
    check_staging_directory,
    free_bytes,
    merge_options,
    recover,
    write_files,
)
from trtet_store.remote.download.describe import describe, wait_for_new_version
from trtet_store.remote.download.options import (
    FetchConfig,
    check_options,
    client_endpoint,
    parse_url,
    resume_command,
)
from trtet_store.remote.download.plan import (
    ObjectPlan,
    ObjectSpec,
    Run,
    plan_object,
)
from trtet_store.remote.download.program import (
    check_ptds_to_write,
    data_files_of,
    refuse_program_without_data,
    remove_stale,
)
from trtet_store.remote.download.ranges import RangeDownload
from trtet_store.remote.download.reader import RETRY_WINDOW, Reader
from trtet_store.remote.download.reuse import candidate_files, find_reusable
from trtet_store.remote.download.space import WRITE_CHUNK, preflight
from trtet_store.remote.download.staging import (
    STAGING_TODO,
    Staging,
    fetch_id,
    fetch_lock_name,
)
from trtet_store.remote.download.verify import check_crc
from trtet_store.remote.errors import (
    FetchInterruptedError,
    FetchVerificationError,
    MissingDataError,
    ObjectChangedError,
    ProgramSignatureError,
)
from trtet_store.remote.filenames import check_destination
from trtet_store.remote.keyconfig import key_files, resolve_trusted
from trtet_store.remote.report import FetchedObject, FetchProgress, FetchReport
from trtet_store.remote.s3 import S3

log = logging.getLogger("trtet_store.remote.download.receive")




# --- the entry point ---------------------------------------------------------------------


def fetch(url: str, path: os.PathLike | str, *, reuse: Sequence[os.PathLike | str] = (),
          client: Any = None, endpoint_url: str | None = None,
          config: FetchConfig | None = None,
          progress: Callable[[FetchProgress], Any] | None = None, if_replaced: str = "restart",
          max_restarts: int = 3, wait_replaced: float = 30.0,
          concurrency: int = UNSET, range_size: int = UNSET, attempts: int = UNSET,
          placements: Sequence[str] | None = None, replace_needed: bool = False,
          program_only: bool = False, names: Sequence[str] | None = None,
          sha256: bool = False, trusted_keys: Any = None) -> FetchReport:
    """Fetch the program published at ``url`` (or a plain object) into ``path``.

    Parameters
    ----------
    url : str
        ``s3://bucket/key``. With a manifest beside it (``key.trtet.json``,
        as ``publish`` writes), the ``.pte`` goes to ``path`` and each
        ``.ptd`` beside it under its published name; without one, the object
        alone goes to ``path``.
    path : path-like
        The local ``.pte`` (or file). Its directory must exist. A previous
        version there is reused where its pieces match, and stays readable,
        unchanged, until the new files are complete and verified.
    reuse : sequence of path-like
        More local files that may hold pieces of this version (an older
        ``.pte``; the ``.ptd`` files of the same names beside it are looked at
        too).
    client : boto3 S3 client or :class:`~trtet_store.remote.s3.S3`, optional
        Default: one made the way boto3 finds credentials, at ``endpoint_url``.
        Every call goes through :class:`~trtet_store.remote.s3.S3` (one error
        vocabulary with publish); request-level retries are the client's.
    config : FetchConfig, optional
        How the bytes come down: ``concurrency``, ``range_size``, ``attempts``
        (see :class:`~trtet_store.FetchConfig`). Those three keywords still
        work; one given beside ``config`` with another value is a ``TypeError``.
    progress : callable, optional
        Called with a :class:`FetchProgress` as bytes arrive or are found.
    if_replaced : {"restart", "error"}
        What to do when the program is replaced while it is fetched.
    max_restarts : int
        How many times to start again against a new version.
    wait_replaced : float
        Seconds to wait for a publish in progress to write its manifest.
    placements : sequence of str, optional
        Limit the final write's placements (as ``write_files``), for benchmarks.
    replace_needed : bool
        Replace a ``.ptd`` of the directory that another ``.pte`` there needs
        (ExecuTorch names ``.ptd`` files by tag, so two programs share names).
        Default: such a fetch is refused before anything is written
        (:class:`~trtet_store.NeededByAnotherError`); fetch into a directory of
        its own instead.
    program_only : bool
        Fetch a ``.pte`` that has no manifest though it reads data from
        ``.ptd`` files (default: :class:`MissingDataError`, naming them).
    names : sequence of str, optional
        The exact file names the manifest must name, in order, for files of
        the caller's own naming (the shared tier's). Default: a program's
        closed set, the program's own name and plain ``.ptd`` names
        (:mod:`trtet_store.remote.filenames`).
    sha256 : bool
        Also take the sha256 of each object digested as it arrives, in that
        same pass (:attr:`FetchedObject.sha256`): what a signed document
        names the bytes by.
    trusted_keys : sequence of path-like or PublicKey, optional
        Fetch only a program whose manifest one of these keys signed
        (``publish(signing_key=...)``): one no trusted key vouches for
        (unsigned, another signer, changed after signing, naming its bytes
        by xxh3 only, or no manifest at all) is refused before any object
        byte is downloaded, and every byte downloaded, resumed or reused is
        checked by the sha256 the signature covers: nothing is placed on a
        mismatch. Default: ``TRTET_TRUSTED_KEYS``, else the config file's
        (as ``fetch_set`` and the shared tier), else unsigned programs are
        fetched as before. ``False``: none looked up (a caller that checks
        the bytes by its own signed document).

    Notes
    -----
    The ``.ptd`` files are written by a rename over their names: a symbolic
    link there is replaced, never written through (``path`` itself is
    followed, as ``write_files`` follows a destination).

    After a fetch of a newer version, the ``.ptd`` files the previous version
    at ``path`` read from and the new manifest no longer names are removed
    (``FetchReport.removed``), unless another ``.pte`` there needs them.

    Returns
    -------
    FetchReport

    Raises
    ------
    TypeError, ValueError
        A bad option (see :func:`check_options`), before any network call.
    ObjectNotFoundError, AccessDeniedError, BucketNotFoundError
        Before anything local changes.
    InsufficientSpaceError
        Before the first byte is downloaded or anything is created; or when
        the disk fills during the fetch (another writer), with what the fetch
        needed and what is free then; local files unchanged.
    NeededByAnotherError
        A ``.ptd`` to be written would replace one another ``.pte`` of the
        directory needs (see ``replace_needed``); nothing written.
    MissingDataError
        A ``.pte`` without a manifest that needs ``.ptd`` files (see
        ``program_only``); nothing written.
    ObjectChangedError
        The program was replaced (``if_replaced="error"``), or kept changing.
    FetchVerificationError
        Bytes that kept failing their digests, or a full-object checksum
        that differs; local files untouched.
    FileNameError, IsADirectoryError
        A manifest naming a file no program may have, the destination's own
        name twice, or a directory at a name it writes: before any byte is
        downloaded, nothing created.
    FetchInterruptedError
        The network kept failing; fetching again continues where it stopped.
    ProgramSignatureError
        (a FetchVerificationError) With trusted keys: no trusted key vouches
        for the manifest (nothing downloaded), or bytes whose sha256 is not
        the signed one (nothing placed, nothing staged kept).
    KeyFileError
        A trusted key (or the config file) that cannot be used.
    """
    if isinstance(reuse, (str, bytes, os.PathLike)):
        raise TypeError("reuse takes a list of paths, e.g. reuse=[old_pte], not one path")
    if if_replaced not in ("restart", "error"):
        raise ValueError(f"if_replaced must be 'restart' or 'error', not {if_replaced!r}")
    cfg = merge_options(FetchConfig, config, "fetch", "config", dict(
        concurrency=concurrency, range_size=range_size, attempts=attempts))
    check_options(max_restarts=max_restarts, wait_replaced=wait_replaced)
    concurrency = cfg.concurrency
    for name, flag in (("replace_needed", replace_needed), ("program_only", program_only)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, not {flag!r}")
    bucket, key = parse_url(url)
    dest = Path(path).absolute()
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"{dest.parent} is not a directory (the destination's "
                                "directory must exist)")
    trusted = None if trusted_keys is False else resolve_trusted(trusted_keys)
    s3 = client if isinstance(client, S3) else S3(endpoint_url, client=client,
                                                   max_connections=concurrency + 2)
    # Our own client: a server that is restarting is waited out (bounded); a client the
    # caller made keeps its own retries.
    reader = Reader(s3, bucket, RETRY_WINDOW if client is None else 0.0)
    job = _Fetch(url, bucket, key, dest, [Path(p).absolute() for p in reuse], reader,
                 concurrency, cfg.range_size, progress, cfg.attempts, placements)
    job.endpoint_url = endpoint_url or client_endpoint(s3.client)
    job.if_replaced = if_replaced
    job.replace_needed, job.program_only = replace_needed, program_only
    job.names = None if names is None else list(names)
    job.sha256 = bool(sha256)
    job.trusted = trusted
    job.trusted_paths = key_files(trusted_keys) if trusted_keys is not False else []
    job.flags = {"replace_needed": replace_needed, "program_only": program_only}
    start = time.monotonic()
    restarts = 0
    seen_version = None
    while True:
        try:
            report = job.run()
            break
        except FetchInterruptedError as exc:
            if exc.resume:
                raise
            # A HEAD or manifest GET that kept failing: the resume command, with
            # every option given, belongs in its message too.
            raise FetchInterruptedError(str(exc), job.resume_command()) from exc
        except ObjectChangedError as exc:
            if if_replaced == "error" or restarts >= max_restarts:
                raise
            restarts += 1
            seen_version = job.version
            log.warning("%s was replaced during the fetch (%s); starting again against the "
                        "new version (restart %d of %d)", url, exc, restarts, max_restarts)
            wait_for_new_version(reader, url, key, seen_version, wait_replaced)
    report.restarts = restarts
    report.retries = reader.retries + job.range_retries
    report.seconds = time.monotonic() - start
    return report


# --- one attempt at one version ------------------------------------------------------------


class _Fetch:
    def __init__(self, url: str, bucket: str, key: str, dest: Path, reuse: list[Path],
                 reader: Reader, concurrency: int, range_size: int,
                 progress: Callable[[FetchProgress], Any] | None, attempts: int,
                 placements: Sequence[str] | None) -> None:
        self.url, self.bucket, self.key, self.dest = url, bucket, key, dest
        self.reuse = reuse
        self.reader = reader
        self.concurrency = concurrency
        self.range_size = range_size
        self.progress = progress
        self.attempts = attempts
        self.placements = placements
        # What the resume command repeats (set by fetch()).
        self.endpoint_url: str | None = None
        self.if_replaced = "restart"
        self.flags: dict[str, bool] = {}
        self.replace_needed = False
        self.program_only = False
        self.names: list[str] | None = None  # the caller's own names (fetch(names=))
        self.from_manifest = False  # set by run(), from describe()
        self.version = ""
        self.range_retries = 0
        self._mutex = threading.Lock()
        self.downloaded = 0
        self.reused = 0
        self.resumed = 0
        self.total = 0
        self.per_object: dict[int, int] = {}
        #: Objects digested as they arrive (every byte downloaded by this attempt).
        self.in_order: dict[int, InOrderDigest] = {}
        #: Whether those digests take the sha256 too (fetch(sha256=True)).
        self.sha256 = False
        #: {key id: PublicKey}: the manifest must be signed by one (fetch(trusted_keys=)).
        self.trusted: dict[str, Any] | None = None
        self.trusted_paths: list[Any] = []  # the given ones, for the resume command

    def local_path(self, i: int, spec: ObjectSpec) -> Path:
        return self.dest if i == 0 else self.dest.parent / spec.name

    # the attempt --------------------------------------------------------------------

    def run(self) -> FetchReport:
        # self.downloaded counts on across restarts: every byte received is reported.
        self.reused = self.resumed = 0
        self.per_object = {}
        # Before anything is read, downloaded or written: a staging directory
        # that is a link, another user's or writable by others is refused.
        check_staging_directory(self.dest.parent / STAGING_DIR, todo=STAGING_TODO)
        interrupted = self._journal_exists()
        if interrupted:
            # An earlier fetch of this destination died or failed. If it died
            # inside its write, finish or undo that write first (the
            # destination's content, and the staged runs, depend on which).
            recover(self.dest.parent)
        self.from_manifest, version, specs, unverified = describe(
            self.reader, self.bucket, self.key, self.dest, self.names, self.trusted)
        self.version = version
        paths = [self.local_path(i, s) for i, s in enumerate(specs)]
        # What needs only the manifest and an lstat is refused before anything is read.
        check_destination(self.dest, [s.name for s in specs], self.url)
        plans = []
        for i, spec in enumerate(specs):
            # (path, follow): names from the manifest are read without following a
            # link (the write replaces one); path and reuse= are the user's, followed.
            names = [(paths[i], i == 0), *((r, True) for r in self.reuse),
                     *((r.parent / spec.name, False) for r in self.reuse)]
            reused = find_reusable(spec, candidate_files(names)) if spec.pieces else []
            plans.append(plan_object(i, spec, reused, self.range_size))
        self.total = sum(s.size for s in specs)
        self.reused = sum(p.reused_bytes for p in plans)
        self._tick(0)
        report = FetchReport(self.url, version, [
            FetchedObject(s.name, s.key, os.fspath(paths[i]), s.size, s.etag,
                          f"{s.checksum[0]}:{s.checksum[1]}" if s.checksum else None)
            for i, s in enumerate(specs)])
        report.verified = unverified is None
        report.unverified_reason = unverified
        if self._up_to_date(plans, paths):
            log.info("%s: %s already holds version %s", self.url, self.dest, version)
            report.up_to_date = True
            self._fill(report, plans, {})
            if interrupted or self._lock_left():
                # An interrupted fetch's staged runs and journal are of no use now; or a
                # fetch killed between removing its journal and its lock files left
                # them: taken and let go, they go. Only the first may fail this fetch:
                # tidying a dead fetch's locks (a live one holds them, a full disk)
                # never fails a destination that is already right.
                try:
                    stage = Staging.open(self.dest, self.url, version, plans)
                except OSError as exc:
                    if interrupted:
                        raise
                    log.info("%s: the lock files a killed fetch left in %s stay (%s)",
                             self.url, self.dest.parent / STAGING_DIR, exc)
                else:
                    stage.remove()
                    stage.close()
            return report
        if self.from_manifest:
            # Before anything is written: a .ptd of this program that another
            # .pte of the directory needs (ExecuTorch names them by tag) is not
            # replaced unless asked (invariant 11).
            check_ptds_to_write(self.dest, [s.name for s in specs[1:]],
                                replace_needed=self.replace_needed)
            # What the version at the destination now reads from .ptd files: those the
            # new manifest no longer names go once the new files are in place.
            old_data = data_files_of(self.dest)
        needed = preflight(self.dest, self.url, version, plans, self.range_size,
                           resuming=interrupted)
        try:
            self._stage_and_write(report, plans, paths, version)
        except InsufficientSpaceError:
            raise
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # Another writer took the space the preflight counted: say so as the
            # preflight would, with what it needed and what is free now.
            raise InsufficientSpaceError(
                needed, free_bytes(self.dest.parent), exc.filename or self.dest,
                f"{self.url}: the disk filled during the fetch ({exc.strerror}); the files "
                "there are unchanged, and what was downloaded is kept for the next fetch") \
                from exc
        if self.from_manifest:
            names = {s.name for s in specs}
            report.removed = remove_stale(self.dest, self.url,
                                          [n for n in old_data if n not in names])
        report.bytes_downloaded = self.downloaded
        return report

    def _stage_and_write(self, report: FetchReport, plans: list[ObjectPlan],
                         paths: list[Path], version: str) -> None:
        """Download into the staging area, verify, and write every file in one transaction."""
        stage = Staging.open(self.dest, self.url, version, plans)
        try:
            try:
                report.bytes_resumed = self.download(plans, stage)
            except ProgramSignatureError:
                stage.discard()  # bytes no signature vouches for: none kept
                raise
            self.resumed = report.bytes_resumed
            self._digests(report, plans)
            self.verify(plans, stage)
            if not self.from_manifest and not self.program_only:
                try:
                    refuse_program_without_data(self.reader, self.url, self.key, self.dest,
                                                plans[0], stage)
                except MissingDataError:
                    stage.discard()  # a refusal leaves nothing behind
                    raise
            blobs = stage.blobs()
            outputs = []
            for i, plan in enumerate(plans):
                pieces: list[Any] = []
                for seg in plan.segments():
                    if isinstance(seg, Run):
                        pieces.append(blobs[(seg.obj, seg.offset, seg.size)])
                    else:
                        pieces.append(ExternalFile(Path(seg.path), seg.size, seg.source_offset,
                                                   seg.file_size, plan.spec.chunk_size,
                                                   seg.chunk_digests))
                outputs.append((paths[i], pieces))
            # The .ptd names are the manifest's: a link there is replaced, never
            # written through; the destination itself is followed (documented).
            report.writes = write_files(outputs, consume=True, chunk_size=WRITE_CHUNK,
                                        placements=self.placements,
                                        follow_links=[i == 0 for i in range(len(outputs))])
            stage.remove()
        finally:
            stage.close()
        self._fill(report, plans, stage.done)

    def _digests(self, report: FetchReport, plans: list[ObjectPlan]) -> None:
        """Each object's digests taken as it arrived (see :attr:`FetchedObject.digest`)."""
        for i, (obj, plan) in enumerate(zip(report.objects, plans, strict=True)):
            digester = self.in_order.get(i)
            obj.digest = digester.digest() if digester is not None else None
            obj.sha256 = digester.sha256() if digester is not None else None
            pieces = plan.spec.pieces
            if obj.digest is not None and len(pieces) == 1 and pieces[0].offset == 0 and \
                    pieces[0].size == plan.spec.size:
                obj.chunk_size, obj.chunk_digests = plan.spec.chunk_size, tuple(pieces[0].chunks)

    def _tick(self, n: int, obj: int = 0) -> None:
        with self._mutex:
            self.downloaded += n
            self.per_object[obj] = self.per_object.get(obj, 0) + n
            done = self.downloaded
        if self.progress is not None:
            self.progress(FetchProgress(min(self.total, done + self.reused + self.resumed),
                                        self.total, done, self.reused, self.resumed))

    def _lock_left(self) -> bool:
        return (self.dest.parent / STAGING_DIR / fetch_lock_name(fetch_id(self.dest))).exists()

    def _journal_exists(self) -> bool:
        return (self.dest.parent / STAGING_DIR / f"fetch-{fetch_id(self.dest)}.journal").exists()

    def _up_to_date(self, plans: list[ObjectPlan], paths: list[Path]) -> bool:
        """Every piece of every object found at its own offset in its own destination file."""
        for i, (plan, p) in enumerate(zip(plans, paths, strict=True)):
            if plan.runs or not plan.spec.pieces and plan.spec.size:
                return False
            try:  # a link at a .ptd name (even to an empty file) is never up to date
                st = os.stat(p) if i == 0 else os.lstat(p)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(st.st_mode) or st.st_size != plan.spec.size:
                return False
            if any(r.path != os.fspath(p) or r.source_offset != r.offset for r in plan.reused):
                return False
            try:
                check_crc(self.bucket, plan, {})
            except FetchVerificationError:
                return False
        return True

    def _fill(self, report: FetchReport, plans: list[ObjectPlan], done: dict) -> None:
        for i, (obj, plan) in enumerate(zip(report.objects, plans, strict=True)):
            obj.bytes_downloaded = self.per_object.get(i, 0)
            obj.bytes_reused = plan.reused_bytes
            obj.reused_from = sorted({r.path for r in plan.reused})
        report.bytes_reused = sum(p.reused_bytes for p in plans)
        for w, obj in zip(report.writes, report.objects, strict=False):
            for rec in w.placements:
                obj.placements[rec.placement] = obj.placements.get(rec.placement, 0) + rec.size
        for w, plan in zip(report.writes, plans, strict=False):
            reused_at = {r.offset for r in plan.reused}
            for rec in w.placements:
                if rec.offset in reused_at:
                    report.reused_by[rec.placement] = report.reused_by.get(rec.placement,
                                                                           0) + rec.size

    def resume_command(self) -> str:
        return resume_command(self.url, self.dest, reuse=self.reuse,
                              endpoint_url=self.endpoint_url, concurrency=self.concurrency,
                              range_size=self.range_size, if_replaced=self.if_replaced,
                              trusted_keys=self.trusted_paths, **self.flags)

    # 4. download: :class:`.ranges.RangeDownload` ---------------------------------------

    def download(self, plans: list[ObjectPlan], stage: Staging) -> int:
        """Every range not staged yet (:class:`.ranges.RangeDownload`); the bytes resumed."""
        ranges = RangeDownload(self.reader, self.bucket, concurrency=self.concurrency,
                               range_size=self.range_size, attempts=self.attempts,
                               sha256=self.sha256, tick=self._tick,
                               resumed=self._set_resumed, resume_command=self.resume_command)
        try:
            return ranges.download(plans, stage)
        finally:
            self.in_order = ranges.in_order
            self.range_retries += ranges.range_retries

    def _set_resumed(self, resumed: int) -> None:
        self.resumed = resumed  # progress counts it from the first tick on

    # 5. verify -------------------------------------------------------------------------

    def verify(self, plans: list[ObjectPlan], stage: Staging) -> None:
        for plan in plans:
            try:
                check_crc(self.bucket, plan, stage.done)
            except FetchVerificationError:
                if not plan.spec.pieces:
                    # No digests say which range is wrong: none of them is kept.
                    stage.discard()
                raise
