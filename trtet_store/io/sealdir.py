"""SealedDir: a private directory of files named by their digest, each trusted by its seal.

A seal (an :class:`~.seal.Seal`) records the identity of the file whose bytes
were checked. One ``lstat`` trusts the file while its identity is the sealed
one (:meth:`SealedDir.sealed`); else it is read once: the same bytes reseal
it, others are refused. Our own hard link changes the ctime alone: then the
seal is renewed unread (:meth:`SealedDir.relinked`, ``seal(relink=True)``).
Each store keeps its own on-disk form, unchanged:

- the content store's (the default): ``<root>/.trtet-seals/<name>``,
  ``{"xxh3", "size", "identity"}`` and a ``sha256`` or ``ref`` beside, 0444;
- the engine cache's (``beside=True``): ``<root>/<name>.json``, the whole
  seal with its chunk digests, sorted keys, its temp file in ``temp_dir``.

Locks and removal are here too: a store built on it holds no identity or
digest code of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtet_store.io import fs
from trtet_store.io.digests import digest_file
from trtet_store.io.errors import VerificationError
from trtet_store.io.lock import try_lock, unlock_file
from trtet_store.io.owned import NotOursError, read_ours
from trtet_store.io.safedir import staging_directory, write_atomic
from trtet_store.io.seal import Seal
from trtet_store.io.units import MiB

__all__ = ["BESIDE_MAX_BYTES", "SEALS_DIR", "SEAL_MAX_BYTES", "SealedDir"]

log = logging.getLogger("trtet_store.sets")

#: The seals' directory: ``<name>`` each (and ``<name>.lock``, a file's lock).
SEALS_DIR = ".trtet-seals"
#: The most bytes a seal may hold (a small JSON object).
SEAL_MAX_BYTES = 64 * 1024
#: The most an engine cache seal may hold: its chunk digests, at most 22 bytes each in
#: JSON, for a blob of up to 700 GiB in the cache's 1 MiB chunks.
BESIDE_MAX_BYTES = 16 * MiB


class SealedDir:
    """The directory ``root`` of files ``<root>/<name>``, each sealed.

    ``todo``: ``root`` is created 0700 here, and a link, another user's or
    a shared one refused, ``todo`` saying what to do; None: the caller opened
    and checked it. ``beside``: the engine cache's form (module docstring).
    ``refuse``: a seal file another user owns raises NotOursError (else it is
    not trusted, as a link, a FIFO or one over its cap always is).
    """

    def __init__(self, root: os.PathLike | str, *, todo: str | None = None,
                 beside: bool = False, temp_dir: Path | None = None,
                 refuse: bool = False) -> None:
        self.root = Path(root).absolute()
        self.beside, self.temp_dir, self.refuse = beside, temp_dir, refuse
        self.what = "engine cache seal" if beside else "store seal"
        if todo is not None:
            staging_directory(self.root, todo=todo).close()

    def path(self, name: str) -> Path:
        return self.root / name

    def seal_path(self, name: str) -> Path:
        return self.root / f"{name}.json" if self.beside else self.root / SEALS_DIR / name

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

    # -- the seal files, in each form ------------------------------------------------

    def read_seal(self, name: str, limit: int | None = None) -> Any:
        """The seal as JSON (either form), or None: read under the one rule (ours, regular,
        capped, a link never followed). One not ours is not trusted (said; its file is read
        again), except another user's in a ``refuse`` directory: NotOursError, left alone."""
        path = self.seal_path(name)
        try:
            return json.loads(read_ours(path, limit=limit or (
                BESIDE_MAX_BYTES if self.beside else SEAL_MAX_BYTES), what=self.what))
        except NotOursError as exc:
            if self.refuse and exc.other_owner:
                raise
            log.warning("%s", exc)
        except (OSError, ValueError):
            pass
        return None

    def read(self, name: str) -> Seal | None:
        """The file's :class:`Seal`, or None when it has none this form can read."""
        return self._parse(name, self.read_seal(name))

    def kept(self, name: str, field: str, limit: int | None = None
             ) -> tuple[Seal | None, str | None]:
        """The store's seal of the file (None: not one of it) and the string ``field`` it keeps
        beside (``ref``, ``sha256``; None: none), read with ``limit`` if given."""
        doc = self.read_seal(name, limit)
        value = doc.get(field) if isinstance(doc, dict) else None
        return self._parse(name, doc), value if isinstance(value, str) else None

    def _parse(self, name: str, doc: Any) -> Seal | None:
        try:
            if self.beside:
                return Seal.from_json(doc)
            ident = doc["identity"]
            if doc["xxh3"] != name or not isinstance(ident, list) or len(ident) != 5:
                return None
            return Seal(ident[2], name, 0, (), tuple(ident))
        except (KeyError, TypeError, ValueError):
            return None

    def write(self, name: str, seal: Seal, **extra: Any) -> None:
        """Write the file's seal in this directory's form (``extra``: the store's fields)."""
        if self.beside:
            write_atomic(self.seal_path(name), json.dumps(seal.to_json(), sort_keys=True)
                         .encode(), temp_dir=self.temp_dir)
            return
        doc = {"xxh3": name, "size": seal.size, "identity": list(seal.identity), **extra}
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root / SEALS_DIR, 0o700)
        write_atomic(self.seal_path(name), json.dumps(doc).encode(), mode=0o444)

    def write_seal(self, name: str, st: os.stat_result, **extra: Any) -> None:
        """Seal ``name`` (the store's form) as the file of ``st``, with ``extra`` fields."""
        self.write(name, Seal(st.st_size, name, 0, ()).renewed(st), **extra)

    # -- the discipline --------------------------------------------------------------

    def sealed(self, name: str) -> bool:
        """Whether the file is still the one whose bytes were checked (one ``lstat``)."""
        seal = self.read(name)
        try:
            return seal is not None and seal.holds(os.lstat(self.path(name))) is None
        except FileNotFoundError:
            return False

    def sealed_identity(self, name: str) -> list[int] | None:
        seal = self.read(name)
        return None if seal is None else list(seal.identity)

    @staticmethod
    def matches(identity: Any, st: os.stat_result) -> bool:
        """Whether ``st`` (a regular file's) is the file of the recorded ``identity``."""
        return isinstance(identity, list) and \
            Seal(st.st_size, "", 0, (), tuple(identity)).holds(st) is None

    def relinked(self, name: str) -> None:
        """Reseal after our own hard link, unlink or rename of the file, unread, only while just
        its ctime moved: any other change (a write) is left for its next use to read. In the
        store's form the rewritten seal keeps nothing beside (no ``sha256``)."""
        seal = self.read(name)
        new = seal and seal.renewed(os.lstat(self.path(name)), relink=True)
        if new is not None and new != seal:
            self.write(name, new)

    def renew(self, name: str, seal: Seal) -> bool:
        """Record a re-read file's new identity (its bytes the sealed ones), if still sealed."""
        if self.read(name) is None:
            return False
        with contextlib.suppress(OSError):
            self.write(name, seal)
        return True

    def seal(self, name: str, *, relink: bool = False, sha256: str | None = None) -> None:
        """Seal the file as it is now, right after its bytes were checked against ``name``;
        with ``relink`` (after our own hard link to it) only while just its ctime moved (a
        write meanwhile leaves the old seal, so the file is read again at its next use)."""
        if relink:
            self.relinked(name)
            return
        self.write_seal(name, os.lstat(self.path(name)),
                        **({} if sha256 is None else {"sha256": sha256}))

    def check(self, name: str, size: int, chunk_size: int, chunks: tuple[int, ...]) -> bool:
        """Trust the file by its seal (True), else read it once against ``name`` and
        ``chunks``: resealed when they match (False: it was read), else
        :class:`VerificationError` (nothing is to be used from it)."""
        if self.sealed(name):
            return True
        path = self.path(name)
        fd = fs.calls.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            problem = Seal(size, name, chunk_size, tuple(chunks)).recheck(fd)
        finally:
            os.close(fd)
        if problem is not None:
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

    def remove(self, name: str) -> list[Path]:
        """The seal, then the file, whichever are there; the paths removed."""
        removed = []
        for p in (self.seal_path(name), self.path(name)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
                removed.append(p)
        return removed
