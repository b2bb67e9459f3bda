"""The local content store: every blob a machine holds for any set, once, named by its digest.

A directory of files named by their xxh3-128 (``<store>/<hex>``), read-only
(0444) once complete. A blob is downloaded into it by
:func:`trtet_store.fetch` (ranged GETs checked against the blob's own
manifest, resumable from the store's ``.trtet-staging``, written by an
atomic rename), then checked against the digest that names it, so a name
in the store is always its bytes' digest. Members are placed from here
(:mod:`.place`); a blob another member or another set brought is not
downloaded again.

**Seals: the digests travel with the bytes.** When a blob's xxh3-128 has
been checked (after its download, or after a re-read), the store writes its
seal, ``.trtet-seals/<hex>`` (a small JSON record): the file's identity
then (device, inode, size, mtime, ctime;
:func:`~trtet_store.io.file_identity`), as the engine cache seals its
entries. A placement trusts a blob whose identity is still
the sealed one (one ``stat``): it is placed without reading it again, and a
copy is not read back. A blob whose identity changed (written in place, even
with the same size; replaced; touched) is read again once: the same bytes
are sealed anew, other bytes are refused
(:class:`~trtet_store.io.VerificationError`, "remove it and fetch again"),
and nothing is placed from it. A blob without a seal (an older store) is
read once and sealed.

**Without reflinks (ext4), the store keeps a reference.** Where the store
cannot clone into the destination and ``link=False``, a member's files are
not copied out of the store: a blob this fetch downloaded is sealed in the
store as above, then moved (renamed, :class:`~trtet_store.io.BlobStore`
``adopt`` and a ``consume`` transaction: no byte copied or read back) into
the member's ``write_files`` transaction, as an ordinary writable 0644 file
of its own (no hard link). Its seal then records a *reference*
(:meth:`ContentStore.refer`): ``"ref"``, the placed file's absolute path,
and that file's identity after the placement. The store holds no bytes of
it, so after K members the disk holds K copies, and a first ``fetch_set``
writes each byte once, as ``fetch`` does.

A later member (another set too) that needs the blob: the store's own
file if it holds one (as on XFS); else the referenced file is opened once
(``O_NOFOLLOW | O_NONBLOCK``), its identity checked by ``fstat`` on that
descriptor against the recorded one, and copied into the store from that
same descriptor (:meth:`ContentStore.take_reference`): a directory on its
path renamed or swapped (``renameat2(RENAME_EXCHANGE)``) leads the open to
another inode, which is refused, and cannot redirect a copy already open.
The descriptor's identity is checked again after the copy: unchanged, the
copy is the sealed bytes (any write in between changes its mtime and
ctime), sealed without a read and moved into the new member in turn (the
reference follows it); changed, the copy is discarded and the blob
downloaded. A reference is recorded only for the very inode the blob was
moved to (its device and inode in the store before the move), taken by
``fstat`` on the placed name opened without following a link. Seals are
read under the one rule (:func:`~trtet_store.io.read_ours`).

A reference whose file is gone or changed (an in-place write, ExecuTorch's
``save`` truncating it) is dropped, logged at INFO, and the blob downloaded
again; the member's file is its own and is never touched. A blob the store
held before this fetch (an older store, a ``link=True`` or XFS-era fetch,
one completed by a killed fetch) stays in the store and is copied, as
before. A store on another filesystem than the destination keeps today's
copy (a rename cannot reach). In this mode a fetch holds its member's blob
locks (in digest order) until its references are written, so no other
process copies from the store's name while the blob leaves it; a
transaction that fails gives the blob back to its store name.

**Two processes, one store.** A blob is downloaded under its own lock,
``.trtet-seals/<hex>.lock`` (an exclusive ``flock``, waited for; removed by
its holder as it lets go, :func:`~trtet_store.io.unlock_file`): a second
``fetch_set`` that needs a blob another process is downloading waits for
it, then finds it sealed (or a reference to the first one's file) and
downloads nothing; on XFS and btrfs two blobs are downloaded at once. A
killed holder's lock is released by the kernel, and the next taker resumes
its download.

Where it lives: ``store=`` of :func:`~trtet_store.sets.fetch_set`, by
default ``.trtet-blobs`` beside the destination directory (its parent), so
that sets fetched into sibling directories share it and, on one filesystem,
a reflink places a file with no new disk.

Why not the engine cache's blob store (``trtet_store.cache``, also named by
xxh3-128): the set room uses only io's and remote's faces (the cache is a
sibling, not a floor); the cache evicts under a byte budget and lives where
builds stage (often another filesystem than the destination, where a clone
cannot reach); and a blob here must stay while a member placed by hard link
shares its inode. Both stores keep the same discipline (complete or absent,
named by the digest, checked on use), so one can adopt the other's files
later without a re-download.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from trtet_store.io import (
    MiB,
    NotOursError,
    SafeDir,
    SourceChangedError,
    VerificationError,
    clone_or_copy,
    digest_file,
    file_identity,
    read_ours,
    same_identity,
    staging_directory,
    try_lock,
    unlock_file,
    write_atomic,
)
from trtet_store.remote.errors import FetchVerificationError, ObjectChangedError
from trtet_store.remote.s3 import S3

log = logging.getLogger("trtet_store.sets")

#: The default store's name, beside the destination directory.
STORE_DIR = ".trtet-blobs"
#: The seals' directory in the store: ``<hex>`` each, the blob's identity when checked.
SEALS_DIR = ".trtet-seals"
#: Where a blob waits (on the store's filesystem) while a transaction moves it into place.
MOVING_DIR = ".trtet-moving"
STORE_TODO = ("remove it or pass store= a directory of your own (0700, not a link, "
              "owned by you)")
#: The most bytes a seal may hold (a small JSON object).
SEAL_MAX_BYTES = 64 * 1024
#: How a referenced file is opened: never through a link, never waiting on a FIFO.
_REF_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ContentStore:
    """A directory of blobs named by their xxh3-128 hex digest.

    Parameters
    ----------
    root : path-like
        The directory; created 0700 if missing. A link, another user's
        directory or one others may write to is refused
        (:class:`~trtet_store.UnsafeDirectoryError`).
    """

    def __init__(self, root: os.PathLike | str) -> None:
        self.root = Path(root).absolute()
        staging_directory(self.root, todo=STORE_TODO).close()

    def path(self, digest: str) -> Path:
        return self.root / digest

    @contextlib.contextmanager
    def locked(self, digest: str) -> Iterator[None]:
        """Hold the blob's download lock (waiting for another process that holds it)."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        path = self.root / SEALS_DIR / (digest + ".lock")
        fd = try_lock(path, create=True, wait=True)
        assert fd is not None  # wait=True never returns None
        try:
            yield
        finally:
            unlock_file(fd, path)

    def seal_path(self, digest: str) -> Path:
        return self.root / SEALS_DIR / digest

    def seal(self, digest: str, *, relink: bool = False, sha256: str | None = None) -> None:
        """Record the blob's identity now, as the one whose bytes are ``digest``.

        Called only right after its bytes were checked against ``digest``,
        or with ``relink=True`` after our own hard link to it, which changed
        only its ctime: then only when the rest of its identity is the
        sealed one (a write meanwhile leaves the old seal, which no longer
        matches, so the blob is read again at its next use).
        """
        st = os.lstat(self.path(digest))
        if relink:
            sealed = self._sealed_identity(digest)
            if not same_identity(sealed, st, relink=True):
                return
        doc = {"xxh3": digest, "size": st.st_size, "identity": list(file_identity(st))}
        if sha256 is not None:  # taken as the bytes arrived (a signed set's check: .signed)
            doc["sha256"] = sha256
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        write_atomic(self.seal_path(digest), json.dumps(doc).encode(), mode=0o444)

    def _seal_doc(self, digest: str) -> object:
        """The blob's seal as JSON, read under the one rule (ours, regular, capped), or None."""
        try:
            return json.loads(read_ours(self.seal_path(digest), limit=SEAL_MAX_BYTES,
                                        what="store seal"))
        except NotOursError as exc:
            log.warning("%s", exc)
            return None
        except (OSError, ValueError):
            return None

    def _sealed_identity(self, digest: str) -> list[int] | None:
        doc = self._seal_doc(digest)
        if not isinstance(doc, dict) or doc.get("xxh3") != digest:
            return None
        ident = doc.get("identity")
        return ident if isinstance(ident, list) and len(ident) == 5 else None

    def sealed(self, digest: str) -> bool:
        """Whether the blob is still the file whose bytes were checked (one ``lstat``)."""
        try:
            st = os.lstat(self.path(digest))
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and \
            self._sealed_identity(digest) == list(file_identity(st))

    def check(self, digest: str, size: int, chunk_size: int,
              chunks: tuple[int, ...]) -> bool:
        """Make sure the blob is ``digest``'s bytes before it is placed; True when sealed.

        A blob whose identity is the sealed one is trusted without a read.
        Another is read once against ``digest`` and the set's chunk digests:
        sealed anew when it matches (False: it was read), refused otherwise.

        Raises
        ------
        VerificationError
            Its bytes are not the set's: nothing is placed from it.
        """
        if self.sealed(digest):
            return True
        path = self.path(digest)
        got, got_chunks, n = digest_file(path, chunk_size, False)
        if n != size or got != digest or tuple(got_chunks) != tuple(chunks):
            raise VerificationError(
                f"{path}: the store's blob (changed since it was checked; remove it and fetch "
                "again)", None, os.fspath(path))
        log.info("%s: changed identity, same bytes: sealed anew", path)
        self.seal(digest)
        return False

    def inode(self, digest: str) -> tuple[int, int]:
        """The store's blob's (device, inode): what :meth:`refer` expects at the placed name."""
        st = os.lstat(self.path(digest))
        return st.st_dev, st.st_ino

    def refer(self, digest: str, path: Path, inode: tuple[int, int]) -> bool:
        """Record that the blob is now the file at ``path`` (placed by a move), as it is now.

        Called only right after the blob's sealed file became ``path`` (a
        rename: its bytes are the ones checked). ``inode`` is the blob's
        (device, inode) in the store before the move (:meth:`inode`): the file
        at ``path`` is opened without following a link and its identity taken
        by ``fstat`` on that descriptor, and only the very inode moved there is
        recorded (a directory on the path swapped meanwhile leads elsewhere:
        then nothing is recorded, and a later member downloads the blob). The
        store keeps no bytes of it; :meth:`take_reference` trusts the file
        while its identity is this one. True when recorded; otherwise any seal
        of the blob is dropped (the blob is downloaded again when next needed).
        """
        path = Path(path).absolute()
        try:
            fd = os.open(path, _REF_FLAGS)
        except OSError as exc:
            log.warning("%s: not recorded as blob %s (%s)", path, digest, exc.strerror)
            self._drop(digest)
            return False
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != tuple(inode):
            log.warning("%s: not the file blob %s was moved to (a directory on its path "
                        "changed?); not recorded as a reference", path, digest)
            self._drop(digest)
            return False
        doc = {"xxh3": digest, "size": st.st_size, "identity": list(file_identity(st)),
               "ref": os.fspath(path)}
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        write_atomic(self.seal_path(digest), json.dumps(doc).encode(), mode=0o444)
        return True

    def reference(self, digest: str, size: int) -> Path | None:
        """The placed file that is the blob (see :meth:`_reference`), or None."""
        got = self._reference(digest, size)
        return None if got is None else got[0]

    def _reference(self, digest: str, size: int) -> tuple[Path, list[int]] | None:
        """The placed file that is the blob, while its identity is the recorded one (one ``lstat``).

        A reference whose file is gone or changed (written in place, even
        with the same size; replaced; touched) is dropped, logged at INFO:
        None, the blob is downloaded again. The file is never read to learn
        whether its bytes are still the blob's.
        """
        doc = self._seal_doc(digest)
        if not isinstance(doc, dict) or not isinstance(doc.get("ref"), str):
            return None
        ref = Path(doc["ref"])
        try:
            st = os.lstat(ref)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size and \
                doc.get("xxh3") == digest and doc.get("identity") == list(file_identity(st)):
            return ref, doc["identity"]
        log.info("%s: %s since it was placed as blob %s; the reference is dropped and the "
                 "blob is downloaded again", ref, "gone" if st is None else "changed", digest)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.seal_path(digest))
        return None

    def take_reference(self, digest: str, size: int, chunk_size: int) -> bool:
        """Copy the blob into the store from the placed file that is it; True when taken.

        The file is opened once (``O_NOFOLLOW | O_NONBLOCK``: a link or a FIFO
        put at its name is refused), its identity checked by ``fstat`` on that
        descriptor against the recorded one, and the copy made from that same
        descriptor: a directory on its path renamed or swapped meanwhile
        leads the open elsewhere (another identity: not taken), and cannot
        redirect the copy once the file is open. After the copy the
        descriptor's identity is checked again: a write to the file in between
        changes its mtime and ctime, and then the copy is discarded (False:
        download the blob). Unchanged, the copy is the sealed bytes and is
        sealed as the store's blob without being read.
        """
        got = self._reference(digest, size)
        if got is None:
            return False
        ref, before = got  # the recorded identity: a write since the look above shows too
        dest = self.path(digest)
        _reference_step("open", ref)
        try:
            fd = os.open(ref, _REF_FLAGS)
        except OSError as exc:  # gone, a link (ELOOP), a FIFO or socket (ENXIO), ...
            log.info("%s: cannot be opened as blob %s (%s); the reference is dropped and the "
                     "blob downloaded again", ref, digest, exc.strerror)
            self._drop(digest)
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or list(file_identity(st)) != before:
                log.info("%s: not the file placed as blob %s (changed, or reached through a "
                         "directory swapped since); the reference is dropped and the blob "
                         "downloaded again", ref, digest)
                self._drop(digest)
                return False
            _reference_step("copy", ref)
            try:
                _copy_reference(fd, ref, dest, size)
                ok = list(file_identity(os.fstat(fd))) == before
            except (SourceChangedError, OSError) as exc:
                if not isinstance(exc, SourceChangedError) and exc.errno not in (
                        errno.EIO, errno.ENOENT):
                    raise
                log.info("%s: changed while blob %s was copied from it (%s); not trusted, "
                         "the blob is downloaded again", ref, digest, exc)
                ok = False
            else:
                if not ok:
                    log.info("%s: changed while blob %s was copied from it; the copy is "
                             "discarded and the blob downloaded again", ref, digest)
        finally:
            os.close(fd)
        if not ok:
            for p in (dest, self.seal_path(digest)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            return False
        self.seal(digest)  # the sealed bytes: the source kept its identity throughout
        return True

    def _drop(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.seal_path(digest))

    def holds(self, digest: str, size: int) -> bool:
        """Whether a complete blob of this digest and size is here (one ``lstat``).

        Its bytes are checked when it is placed (:meth:`check`: its seal, or a read).
        """
        try:
            st = os.lstat(self.path(digest))
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    def download(self, s3: S3, bucket: str, key: str, digest: str, size: int,
                 crc64nvme: str, *, concurrency: int, range_size: int,
                 sha256: bool = False) -> int:
        """Fetch the blob at ``key`` into the store; the bytes downloaded.

        Checked three ways: HeadObject's size and CRC64NVME against the set
        manifest's before a byte is asked for; every range against the blob
        manifest's chunk digests as it arrives (``fetch``); the whole file's
        xxh3-128 against ``digest`` before it is kept. ``sha256=True``: its
        sha256 is taken in the same pass and kept in its seal (a signed set's).

        Raises
        ------
        FetchVerificationError
            The object is not the one the set was published with (another
            size or CRC64NVME, another version than its manifest names), or
            its bytes are not ``digest``: nothing kept in the store.
        """
        from trtet_store.remote.download.receive import fetch

        where = f"s3://{bucket}/{key}"
        head = s3.head(bucket, key)
        if head is None or head.size != size or (head.crc64nvme is not None
                                                 and head.crc64nvme != crc64nvme):
            got = "gone" if head is None else f"{head.size} bytes, CRC64NVME {head.crc64nvme}"
            raise FetchVerificationError(f"{where}: the set names a blob of {size} bytes, "
                                         f"CRC64NVME {crc64nvme}; the server holds {got}. "
                                         "Refused: publish the set again")
        dest = self.path(digest)
        try:
            rep = fetch(f"s3://{bucket}/{key}", dest, client=s3, names=[digest],
                        if_replaced="error", concurrency=concurrency, range_size=range_size,
                        sha256=sha256, trusted_keys=False)  # the set manifest vouches
        except ObjectChangedError as exc:
            raise FetchVerificationError(f"{where} is not the version its manifest names "
                                         f"({exc}); refused: publish the set again") from exc
        got = rep.objects[0].digest
        if got is None:  # resumed: not every byte passed this call's digest
            got = digest_file(dest, MiB, False)[0]
        if got != digest:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dest)
            raise FetchVerificationError(f"{where}: its bytes' xxh3-128 is {got}, not the "
                                         f"{digest} the set names; refused, nothing kept")
        os.chmod(dest, 0o444)  # a blob is never written again (and links to it are 0444)
        # Checked just now: its placements need not read it again.
        self.seal(digest, sha256=rep.objects[0].sha256 if rep.objects[0].digest else None)
        return rep.bytes_downloaded


def _reference_step(stage: str, ref: Path) -> None:
    """Called before a referenced file is opened (``"open"``) and, once its descriptor is
    checked, before it is copied (``"copy"``); nothing by default.

    A module function so that a test can rename a directory on ``ref``'s path there.
    """


def _copy_reference(fd: int, ref: Path, dest: Path, size: int) -> None:
    """Copy ``size`` bytes of the open referenced file ``fd`` to the store's name ``dest``.

    Cloned or copied (never read back) into a fresh temp file of the store
    (created ``O_EXCL | O_NOFOLLOW`` under the store's checked handle),
    fsynced, made 0444 and renamed to ``dest``. Nothing is opened by ``ref``'s
    path: it names the source in a message. A module function so that a test
    can change the source while it is copied.
    """
    with SafeDir.open(dest.parent, allow_sticky=False) as d:
        tmp = f".{dest.name}.trtet-ref-{os.getpid()}.tmp"
        out = d.create_replacing(tmp, os.O_WRONLY, 0o444)
        try:
            try:
                clone_or_copy(fd, out, size, what=os.fspath(ref))
                os.fsync(out)
            finally:
                os.close(out)
            d.rename(tmp, dest.name)
        except BaseException:
            d.unlink(tmp)
            raise
        d.fsync()
