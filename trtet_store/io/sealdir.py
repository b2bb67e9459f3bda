"""SealedDir: a private directory of files named by their digest, each trusted by its seal.

A seal, ``<root>/.trtet-seals/<name>`` (``{"xxh3", "size", "identity"}`` and
what a store keeps beside: ``sha256``, ``ref``), records the identity of the
file whose bytes were checked. One ``lstat`` trusts the file while its
identity is the sealed one; else it is read once: the same bytes reseal it,
others are refused. Our own hard link changes the ctime alone: then
(``relink=True``) the seal is renewed unread (:func:`~.seal.same_identity`).
Locks and removal are here too: a store built on it holds no identity or
digest code of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtet_store.io.digests import digest_file, file_identity
from trtet_store.io.errors import VerificationError
from trtet_store.io.lock import try_lock, unlock_file
from trtet_store.io.owned import NotOursError, read_ours
from trtet_store.io.safedir import staging_directory, write_atomic
from trtet_store.io.seal import same_identity
from trtet_store.io.units import MiB

__all__ = ["SEALS_DIR", "SEAL_MAX_BYTES", "SealedDir"]

log = logging.getLogger("trtet_store.sets")

#: The seals' directory: ``<name>`` each (and ``<name>.lock``, a file's lock).
SEALS_DIR = ".trtet-seals"
#: The most bytes a seal may hold (a small JSON object).
SEAL_MAX_BYTES = 64 * 1024


class SealedDir:
    """The directory ``root`` (created 0700; a link, another user's or a shared one refused,
    ``todo`` saying what to do) of files ``<root>/<name>`` sealed in ``.trtet-seals/``."""

    def __init__(self, root: os.PathLike | str, *, todo: str) -> None:
        self.root = Path(root).absolute()
        staging_directory(self.root, todo=todo).close()

    def path(self, name: str) -> Path:
        return self.root / name

    def seal_path(self, name: str) -> Path:
        return self.root / SEALS_DIR / name

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Hold the file's lock (waiting for another process that holds it)."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        path = self.seal_path(name + ".lock")
        fd = try_lock(path, create=True, wait=True)
        assert fd is not None  # wait=True never returns None
        try:
            yield
        finally:
            unlock_file(fd, path)

    def read_seal(self, name: str) -> Any:
        """The seal as JSON, read under the one rule (ours, regular, capped), or None."""
        try:
            return json.loads(read_ours(self.seal_path(name), limit=SEAL_MAX_BYTES,
                                        what="store seal"))
        except NotOursError as exc:
            log.warning("%s", exc)
        except (OSError, ValueError):
            pass
        return None

    def write_seal(self, name: str, st: os.stat_result, **extra: Any) -> None:
        """Seal ``name`` as the file of ``st`` (its bytes just checked), with ``extra`` fields."""
        doc = {"xxh3": name, "size": st.st_size, "identity": list(file_identity(st)), **extra}
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        write_atomic(self.seal_path(name), json.dumps(doc).encode(), mode=0o444)

    def seal(self, name: str, *, relink: bool = False, sha256: str | None = None) -> None:
        """Seal the file as it is now, right after its bytes were checked against ``name``;
        with ``relink`` (after our own hard link to it) only while just its ctime moved (a
        write meanwhile leaves the old seal, so the file is read again at its next use)."""
        st = os.lstat(self.path(name))
        if relink and not same_identity(self.sealed_identity(name), st, relink=True):
            return
        self.write_seal(name, st, **({} if sha256 is None else {"sha256": sha256}))

    def sealed_identity(self, name: str) -> list[int] | None:
        doc = self.read_seal(name)
        if not isinstance(doc, dict) or doc.get("xxh3") != name:
            return None
        ident = doc.get("identity")
        return ident if isinstance(ident, list) and len(ident) == 5 else None

    @staticmethod
    def matches(identity: Any, st: os.stat_result) -> bool:
        """Whether ``st`` (a regular file's) is the file of the recorded ``identity``."""
        return stat.S_ISREG(st.st_mode) and isinstance(identity, list) and \
            same_identity(identity, st)

    def sealed(self, name: str) -> bool:
        """Whether the file is still the one whose bytes were checked (one ``lstat``)."""
        try:
            st = os.lstat(self.path(name))
        except FileNotFoundError:
            return False
        return self.matches(self.sealed_identity(name), st)

    def check(self, name: str, size: int, chunk_size: int, chunks: tuple[int, ...]) -> bool:
        """Trust the file by its seal (True), else read it once against ``name`` and
        ``chunks``: resealed when they match (False: it was read), else
        :class:`VerificationError` (nothing is to be used from it)."""
        if self.sealed(name):
            return True
        path = self.path(name)
        got, got_chunks, n = digest_file(path, chunk_size, False)
        if n != size or got != name or tuple(got_chunks) != tuple(chunks):
            raise VerificationError(
                f"{path}: the store's blob (changed since it was checked; remove it and fetch "
                "again)", None, os.fspath(path))
        log.info("%s: changed identity, same bytes: sealed anew", path)
        self.seal(name)
        return False

    @staticmethod
    def digest(path: Path) -> str:
        """The whole file's xxh3-128 (a read)."""
        return digest_file(path, MiB, False)[0]

    def unseal(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.seal_path(name))

    def remove(self, name: str) -> None:
        """The file and its seal, whichever are there."""
        for p in (self.path(name), self.seal_path(name)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
