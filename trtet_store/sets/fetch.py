"""``fetch_set(url, dest, member=None)``: one member of a set onto this machine.

The steps, in order:

1. **Read the set manifest** and **pick the member**: ``member=`` when
   given (always wins), else the one this machine runs
   (:func:`~trtet_store.sets.machine.pick_member`, on
   :meth:`Machine.detect` unless ``machine=`` is given); none or two
   equally: :class:`~trtet_store.sets.machine.NoMemberFitsError`, listing
   every member and what it needs. Names are checked (the runtime's closed
   set) before anything is downloaded or created.
2. **Download what the store lacks**: each of the member's blobs that the
   local content store (:mod:`.store`) does not hold (nor a member's file it
   references, unchanged: copied from that), with ``fetch``'s
   preflight, ranged GETs, resume and verification, checked against the
   digest that names it; under the blob's lock (:meth:`ContentStore.locked`),
   so two processes filling one store download each blob once.
3. **Place** the member's files under the runtime's names (the ``.pte`` and
   its ``.ptd`` files side by side) in one ``write_files`` transaction: its
   preflight, journal and atomic rename; every file changes or none. Each
   blob is the set's bytes by its seal (the store checked it and recorded
   its identity; one ``stat``), else it is read once and refused if changed
   (:meth:`ContentStore.check`): the placement reads nothing again. From the store by
   reflink where the filesystem can; without reflinks (ext4) a blob this fetch brought
   is moved into place and the store keeps a reference to the placed file (a later
   member copies from it while its identity holds), others copied; with ``link=True``,
   hard links to the store's read-only (0444) blobs (:mod:`.place`). The
   member record (:mod:`.record`: which files, with which digests) goes in
   with them, for ``verify``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtet_store.io import (
    UNSET,
    Digests,
    InsufficientSpaceError,
    NeededByAnotherError,
    digest_file,
    free_bytes,
    merge_options,
)
from trtet_store.remote.download.options import FetchConfig
from trtet_store.remote.download.program import check_ptds_to_write
from trtet_store.remote.errors import (
    EndpointUnreachableError,
    FetchInterruptedError,
    FetchVerificationError,
    ObjectNotFoundError,
)
from trtet_store.remote.keyconfig import key_files, resolve_trusted
from trtet_store.remote.s3 import RETRY_WINDOW, S3, Transient
from trtet_store.sets.machine import Machine, pick_member
from trtet_store.sets.manifest import SET_KEY, SET_MAX_BYTES, SetManifest, blob_key
from trtet_store.sets.place import place_files, reflinks
from trtet_store.sets.publish import parse_set_url
from trtet_store.sets.record import RECORD, read_record, record_bytes, remove_unlisted
from trtet_store.sets.report import SetFetchReport
from trtet_store.sets.signed import check_blobs, read_signed_set
from trtet_store.sets.store import MOVING_DIR, STORE_DIR, ContentStore

log = logging.getLogger("trtet_store.sets")


def read_set(s3: S3, bucket: str, prefix: str) -> tuple[SetManifest, str]:
    """The committed set manifest under ``prefix`` and its ETag.

    Raises
    ------
    ObjectNotFoundError
        No set there.
    ManifestError
        One this version cannot read.
    """
    key = prefix + SET_KEY
    got = s3.get(bucket, key, limit=SET_MAX_BYTES)
    if got is None:
        raise ObjectNotFoundError(f"no set at s3://{bucket}/{prefix} (no {SET_KEY}); "
                                  "publish one with publish_set")
    return SetManifest.from_json(got[0]), got[1]


def fetch_set(url: str, dest: os.PathLike | str, member: str | None = None, *,
              machine: Machine | None = None, store: os.PathLike | str | None = None,
              link: bool = False, endpoint_url: str | None = None, client: S3 | None = None,
              config: FetchConfig | None = None, placements: list[str] | None = None,
              replace_needed: bool = False, trusted_keys: Any = None,
              concurrency: int = UNSET, range_size: int = UNSET) -> SetFetchReport:
    """Fetch one member of the set at ``url`` into the directory ``dest``.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix/``, as :func:`~trtet_store.sets.publish_set` took it.
    dest : path-like
        The directory the member's files go into, under their runtime names
        (created when its parent exists). A previous version there is
        replaced atomically, all files at once.
    member : str, optional
        The member to fetch; always wins. Default: the one this machine runs.
    machine : Machine, optional
        The facts the pick is made on (default :meth:`Machine.detect`).
    store : path-like, optional
        The local content store (default ``dest/../.trtet-blobs``); put it on
        ``dest``'s filesystem for reflinks.
    link : bool
        Place by hard link to the store's blobs: no new disk on any
        filesystem, and the files are read-only (0444): a program writing
        one in place (ExecuTorch's ``save`` truncates in place) would change
        every name sharing the inode, the store's and other members' too.
    endpoint_url, client
        The server (as ``fetch``).
    config : FetchConfig, optional
        How each blob comes down (as ``fetch``'s); its ``concurrency`` and
        ``range_size`` are still accepted as keywords.
    placements : list of str, optional
        Limit the placements (``clone``, ``move``, ``copy``), for tests and
        benchmarks; without ``move`` the store keeps every blob it downloads.
    replace_needed : bool
        Replace a ``.ptd`` of ``dest`` that another ``.pte`` there needs (as
        ``fetch``'s: ExecuTorch names ``.ptd`` files by tag, so two programs
        share names). Default: refused before anything is downloaded
        (:class:`~trtet_store.NeededByAnotherError`); and a ``.ptd`` of the
        previous member that another ``.pte`` needs is kept, not removed.
    trusted_keys : sequence of path-like or PublicKey, optional
        Fetch only a set signed by one of these keys, each blob checked by
        the sha256 the signature covers (:mod:`.signed`). Default:
        ``TRTET_TRUSTED_KEYS``, else the config file's, else none (any set).

    Returns
    -------
    SetFetchReport

    Raises
    ------
    NoMemberFitsError
        No ``member`` given and none (or two equally) fits this machine;
        nothing downloaded or created.
    KeyError
        ``member`` is not in the set; the message lists the members.
    NeededByAnotherError
        A ``.ptd`` of the member would replace one another ``.pte`` of
        ``dest`` needs (see ``replace_needed``); nothing downloaded or written.
    FetchVerificationError
        A blob on the server is not the one the set names (size, CRC64NVME,
        xxh3-128), or a placed file does not match the set's chunk digests;
        the destination unchanged.
    SetSignatureError
        (a FetchVerificationError) With trusted keys: the set is not signed
        by one (nothing downloaded), or a blob's sha256 is not the signed
        one (nothing placed).
    VerificationError
        A blob of the local store changed since it was checked and is not
        the set's bytes any more; nothing placed (remove it and fetch again).
    InsufficientSpaceError
        Before downloading or placing, as ``fetch`` and ``write_files``.
    FetchInterruptedError
        The network kept failing through fetch's retry policy (a server
        restarted within :data:`~trtet_store.remote.s3.RETRY_WINDOW` seconds
        is waited out; the message says the tries and seconds): the message
        says to run the same fetch-set again (:func:`fetch_set_command`),
        which keeps what was downloaded.
    """
    if member is not None and not isinstance(member, str):
        raise TypeError(f"member must be a str or None, not {member!r}")
    if machine is not None and not isinstance(machine, Machine):
        raise TypeError(f"machine must be a Machine, not {type(machine).__name__}")
    for name, flag in (("link", link), ("replace_needed", replace_needed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, not {flag!r}")
    cfg = merge_options(FetchConfig, config, "fetch_set", "config",
                        dict(concurrency=concurrency, range_size=range_size))
    bucket, prefix = parse_set_url(url)
    where = f"s3://{bucket}/{prefix}"
    target = Path(dest).absolute()
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{target.parent} is not a directory (the destination's "
                                "parent must exist)")
    trusted = resolve_trusted(trusted_keys)
    # fetch's retry policy for every call (the set manifest, each blob's HEAD and GETs): a
    # server restarted within RETRY_WINDOW seconds is waited out. A given client keeps its own.
    s3 = client if client is not None else S3(endpoint_url, max_connections=cfg.concurrency + 2,
                                              retry_window=RETRY_WINDOW)
    again = fetch_set_command(url, target, member, machine=machine, store=store, link=link,
                              endpoint_url=endpoint_url, replace_needed=replace_needed,
                              trusted_keys=trusted_keys)
    shas = None
    with _resumable(where, s3, again):
        if trusted is None:
            manifest, version = read_set(s3, bucket, prefix)
        else:  # a signed root: vouched for before anything is picked or downloaded
            manifest, version, shas = read_signed_set(s3, bucket, prefix, trusted)

    picked = member is None
    if member is None:
        member = pick_member({n: m.metadata for n, m in manifest.members.items()},
                             machine if machine is not None else Machine.detect(), where)
    elif member not in manifest.members:
        raise KeyError(f"{where} has no member {member!r}; its members: "
                       f"{sorted(manifest.members)}")
    entry = manifest.members[member]
    log.info("%s: fetching member %r (%s)", where, member,
             "picked for this machine" if picked else "asked for")

    # fetch's rule, before anything is downloaded or created: a .ptd another .pte of the
    # directory needs is not replaced (unless asked). One that already holds the member's
    # bytes is not replaced at all, so it is not asked about.
    program = target / entry.files[0].name
    if target.is_dir() and not replace_needed:
        check_ptds_to_write(program, _ptds_replaced(target, entry, manifest.chunk_size),
                            replace_needed=False)
    target.mkdir(exist_ok=True)
    cas = ContentStore(store if store is not None else target.parent / STORE_DIR)
    report = SetFetchReport(where, member, picked, [target / f.name for f in entry.files],
                            cas.root, bytes_total=entry.size)
    _, missing = _missing(cas, entry)
    # Every blob the store lacks, before the first is downloaded: one that cannot fit is
    # refused here, not after the others took the disk (each fetch checks its own again,
    # and the placement its own before it creates anything).
    needed = sum(f.size for f in missing)
    available = free_bytes(cas.root)
    if needed > available:
        raise InsufficientSpaceError(
            needed, available, cas.root,
            f"{where}: member {member!r} needs {needed} bytes of blobs the store lacks; "
            "nothing was downloaded")
    # Without reflinks (ext4) a new blob leaves the store for the member's file: its lock is
    # held until the store's reference to that file is written, so that no other process
    # reads the store's name in between (each process takes its member's locks in order).
    may_move = _may_move(cas, target, link, placements)
    held = contextlib.ExitStack()
    if may_move:
        for digest in sorted({f.blob for f in entry.files}):
            held.enter_context(cas.locked(digest))
    with held, _resumable(where, s3, again):
        return _fetch_locked(s3, bucket, prefix, where, manifest, version, member, entry,
                             target, program, cas, report, may_move, link=link,
                             config=cfg, placements=placements,
                             replace_needed=replace_needed, shas=shas)


def _fetch_locked(s3: S3, bucket: str, prefix: str, where: str, manifest: SetManifest,
                  version: str, member: str, entry, target: Path, program: Path,
                  cas: ContentStore, report: SetFetchReport, may_move: bool, *, link: bool,
                  config: FetchConfig, placements: list[str] | None,
                  replace_needed: bool, shas: dict[str, str] | None = None) -> SetFetchReport:
    """Steps 2 and 3 (under the member's blob locks where ``may_move``)."""
    report.bytes_in_store, missing = _missing(cas, entry)
    t0 = time.monotonic()
    fresh: set[str] = set()  # blobs this call brought into the store
    for f in missing:
        # One process downloads a blob (its lock); another that needs it waits, then
        # finds it sealed (checked by the one that downloaded it) and takes it as held.
        with contextlib.nullcontext() if may_move else cas.locked(f.blob):
            if cas.holds(f.blob, f.size) and cas.sealed(f.blob):
                report.bytes_in_store += f.size
                continue
            # A member's file that is the blob (placed by a move), unchanged: copied.
            if cas.take_reference(f.blob, f.size, manifest.chunk_size):
                report.bytes_in_store += f.size
            else:
                report.bytes_downloaded += cas.download(
                    s3, bucket, blob_key(prefix, f.blob), f.blob, f.size, f.crc64nvme,
                    config=config, sha256=shas is not None)
            fresh.add(f.blob)
    t1 = time.monotonic()
    report.seconds_download = t1 - t0
    record = record_bytes(where, member, version, entry, manifest.chunk_size)
    previous = read_record(target, report.left_alone)
    # Each blob is the set's bytes before anything is placed from it: its seal (one
    # stat: checked when it was downloaded), else read once (refused if changed).
    for digest, size, chunks in {(f.blob, f.size, f.chunks) for f in entry.files}:
        cas.check(digest, size, manifest.chunk_size, chunks)
    if shas is not None:  # a signed set: each blob by the sha256 its signature covers
        check_blobs(cas, [f.blob for f in entry.files], shas, where)
    moves = _moves(cas, entry, fresh, manifest.chunk_size) if may_move else {}
    inodes = {f.name: cas.inode(f.blob) for f in entry.files if f.name in moves}
    report.placed = place_files(target, [(f.name, cas.path(f.blob), f.size, None)
                                         for f in entry.files],
                                manifest.chunk_size, link=link, placements=placements,
                                record=(RECORD, record), moves=moves,
                                moving=cas.root / MOVING_DIR)
    # The store keeps a reference to each moved blob, not its bytes.
    for f in entry.files:
        if f.name in moves:
            cas.refer(f.blob, target / f.name, inodes[f.name])
    _check_after(cas, target, entry, manifest.chunk_size, link, moved=set(moves))
    # The previous member's files this one does not name (another member fetched into the
    # same directory, or a version that dropped a .ptd): ours by the record, so removed.
    report.removed = remove_unlisted(
        target, previous, {f.name for f in entry.files},
        needed=None if replace_needed else functools.partial(_needed, program))
    report.seconds_place = time.monotonic() - t1
    log.info("%s: member %r in %s: %d bytes, %d downloaded, %d in the store already; "
             "placed %s", where, member, target, report.bytes_total, report.bytes_downloaded,
             report.bytes_in_store, report.placed)
    return report


def _ptds_replaced(target: Path, entry, chunk_size: int) -> list[str]:
    """The member's ``.ptd`` names whose file in ``target`` is not already its bytes.

    A file of another size differs without a read; one of the same size is
    read only when another ``.pte`` is there to need it.
    """
    ptds = [f for f in entry.files if f.name.endswith(".ptd")]  # every name placed
    others = [p for p in target.glob("*.pte") if p.name != entry.files[0].name]
    out = []
    for f in ptds:
        try:
            st = os.lstat(target / f.name)
        except FileNotFoundError:
            continue
        if not others or st.st_size != f.size or \
                digest_file(target / f.name, chunk_size, False)[0] != f.blob:
            out.append(f.name)
    return out


def _needed(program: Path, name: str) -> bool:
    """Whether another ``.pte`` beside ``program`` needs the ``.ptd`` ``name`` (fetch's rule)."""
    if not name.endswith(".ptd"):
        return False
    try:
        check_ptds_to_write(program, [name], replace_needed=False)
    except NeededByAnotherError as exc:
        log.info("%s: kept, though the new member does not name it: %s",
                 program.parent / name, exc.strerror)
        return True
    return False


def _missing(cas: ContentStore, entry) -> tuple[int, list]:
    """The bytes of the member's blobs the store holds, and the files whose blob it lacks."""
    seen, missing, held = set(), [], 0
    for f in entry.files:
        if f.blob in seen:
            continue
        seen.add(f.blob)
        if cas.holds(f.blob, f.size):
            held += f.size
        else:
            missing.append(f)
    return held, missing


def _may_move(cas: ContentStore, target: Path, link: bool,
              placements: list[str] | None) -> bool:
    """Whether a new blob is moved from the store into place (and the store keeps a reference).

    Only where the store cannot share blocks with ``target`` (no reflink:
    ext4), on ``target``'s filesystem (a rename reaches), and no links are
    placed. XFS and btrfs clone from the store, which keeps its blobs.
    """
    if link or (placements is not None and "move" not in placements):
        return False
    if os.stat(cas.root).st_dev != os.stat(target).st_dev:
        return False  # another filesystem: a rename cannot reach, the copy stays
    return not reflinks(cas.root, target)


def _moves(cas: ContentStore, entry, fresh: set[str], chunk_size: int) -> dict[str, Digests]:
    """The runtime names whose blob is moved into place, with its digests.

    A blob this call downloaded (or copied from a reference), sealed, named
    once by the member: renamed into the transaction instead of copied, and
    the store then keeps a reference to the placed file
    (:meth:`ContentStore.refer`). A blob the store held already stays there.
    """
    uses: dict[str, int] = {}
    for f in entry.files:
        uses[f.blob] = uses.get(f.blob, 0) + 1
    return {f.name: Digests(f.blob, f.size, chunk_size, tuple(f.chunks), None)
            for f in entry.files
            if f.blob in fresh and uses[f.blob] == 1 and cas.sealed(f.blob)}


def _check_after(cas: ContentStore, target: Path, entry, chunk_size: int, link: bool,
                 moved: set[str] = frozenset()) -> None:
    """The blobs are still the sealed files after the placement, or the placed files are read.

    A blob written while it was placed (its identity changed: a write in
    the store during the fetch) may have given the new files other bytes:
    those files are read back then, and a mismatch is raised (the member's
    record says what they should be; ``verify_member`` names them).
    """
    for f in entry.files:
        if f.name in moved:
            continue  # renamed, checked by its identity as it was placed
        if link:
            cas.seal(f.blob, relink=True)  # our own link changed only its ctime
        if cas.sealed(f.blob):
            continue
        got = digest_file(target / f.name, chunk_size, False)[0]
        if got != f.blob:
            raise FetchVerificationError(
                f"{target / f.name}: the store's blob {cas.path(f.blob)} changed while it was "
                f"placed, and the placed file is not the set's (xxh3-128 {got}, not "
                f"{f.blob}); fetch again")


def fetch_set_command(url: str, dest: os.PathLike | str, member: str | None = None, *,
                      machine: Machine | None = None, store: os.PathLike | str | None = None,
                      link: bool = False, endpoint_url: str | None = None,
                      replace_needed: bool = False, trusted_keys: Any = None) -> str:
    """The ``trtet-store fetch-set`` command that does this fetch again (and resumes it).

    Every option given is repeated (``member`` only when asked for: the same
    machine picks the same one); the store keeps what was downloaded, so the
    command downloads only what is missing.
    """
    words = ["trtet-store", "fetch-set", url, os.fspath(dest)]
    if member is not None:
        words += ["--member", member]
    if store is not None:
        words += ["--store", os.fspath(store)]
    if link:
        words.append("--link")
    if replace_needed:
        words.append("--replace-needed")
    if machine is not None:
        if machine.compute_capability is not None:
            words += ["--compute-capability", machine.compute_capability]
        if machine.tensorrt is not None:
            words += ["--tensorrt", machine.tensorrt]
    if endpoint_url:
        words += ["--endpoint-url", endpoint_url]
    for path in key_files(trusted_keys):  # given ones; the environment's apply again
        words += ["--trusted-key", path]
    return shlex.join(words)


@contextlib.contextmanager
def _resumable(where: str, s3: S3, again: str) -> Iterator[None]:
    """A network failure inside says to run the same fetch-set again, not a blob's own fetch.

    A blob's download fails with the ``trtet-store fetch`` of the blob into the
    store, an internal step; the user's command is the fetch-set. A failure to
    connect before the server ever answered (a wrong endpoint) stays as it is.
    """
    try:
        yield
    except FetchInterruptedError as exc:
        raise FetchInterruptedError(f"{where}: {exc.reason}", again) from exc
    except Transient as exc:
        if isinstance(exc, EndpointUnreachableError) and not s3.answered:
            raise
        raise FetchInterruptedError(f"{where}: {exc}", again) from exc


__all__ = ["fetch_set", "fetch_set_command", "read_set"]
