"""The local content store: every blob a machine holds for any set, once, named by its digest.

A :class:`~trtet_store.io.SealedDir` of files named by their xxh3-128
(``<store>/<hex>``, 0444), filled by :meth:`ContentStore.download`, plus what
is its own: a seal may record a *reference* to the placed file that is the
blob (:meth:`ContentStore.refer`, :meth:`ContentStore.take_reference`). The
seals, references, locks and why this is not the engine cache's store:
``docs/DESIGN.md``, "The content store".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from trtet_store.io import SafeDir, SealedDir, SourceChangedError, clone_or_copy
from trtet_store.remote.download.options import FetchConfig
from trtet_store.remote.errors import FetchVerificationError, ObjectChangedError
from trtet_store.remote.s3 import S3

log = logging.getLogger("trtet_store.sets")

#: The default store's name, beside the destination directory.
STORE_DIR = ".trtet-blobs"
#: Where a blob waits (on the store's filesystem) while a transaction moves it into place.
MOVING_DIR = ".trtet-moving"
STORE_TODO = ("remove it or pass store= a directory of your own (0700, not a link, "
              "owned by you)")
#: How a referenced file is opened: never through a link, never waiting on a FIFO.
_REF_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ContentStore(SealedDir):
    """A directory of blobs named by their xxh3-128 hex digest (a :class:`SealedDir`).

    Parameters
    ----------
    root : path-like
        The directory; created 0700 if missing. A link, another user's
        directory or one others may write to is refused
        (:class:`~trtet_store.io.UnsafeDirectoryError`).
    """

    def __init__(self, root: os.PathLike | str) -> None:
        super().__init__(root, todo=STORE_TODO)

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
            self.unseal(digest)
            return False
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != tuple(inode):
            log.warning("%s: not the file blob %s was moved to (a directory on its path "
                        "changed?); not recorded as a reference", path, digest)
            self.unseal(digest)
            return False
        self.write_seal(digest, st, ref=os.fspath(path))
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
        seal, path = self.kept(digest, "ref")
        if path is None:
            return None
        ref = Path(path)
        try:
            st = os.lstat(ref)
        except FileNotFoundError:
            st = None
        if seal is not None and st is not None and st.st_size == size and \
                seal.holds(st) is None:
            return ref, list(seal.identity)
        log.info("%s: %s since it was placed as blob %s; the reference is dropped and the "
                 "blob is downloaded again", ref, "gone" if st is None else "changed", digest)
        self.unseal(digest)
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
            self.unseal(digest)
            return False
        try:
            st = os.fstat(fd)
            if not self.matches(before, st):
                log.info("%s: not the file placed as blob %s (changed, or reached through a "
                         "directory swapped since); the reference is dropped and the blob "
                         "downloaded again", ref, digest)
                self.unseal(digest)
                return False
            _reference_step("copy", ref)
            try:
                _copy_reference(fd, ref, dest, size)
                ok = self.matches(before, os.fstat(fd))
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
            self.remove(digest)
            return False
        self.seal(digest)  # the sealed bytes: the source kept its identity throughout
        return True

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
                 crc64nvme: str, *, config: FetchConfig, sha256: bool = False) -> int:
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
                        if_replaced="error", config=config, sha256=sha256,
                        trusted_keys=False)  # the set manifest vouches
        except ObjectChangedError as exc:
            raise FetchVerificationError(f"{where} is not the version its manifest names "
                                         f"({exc}); refused: publish the set again") from exc
        got = rep.objects[0].digest
        if got is None:  # resumed: not every byte passed this call's digest
            got = self.digest(dest)
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
