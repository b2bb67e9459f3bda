"""The seal: a file's bytes (size, digests) and the identity of the file they were read from.

Written once for every store: trust a file whose identity (device, inode,
size, mtime, ctime) is the sealed one, reading nothing; else read it again:
the same bytes renew the seal, others are refused (:meth:`Seal.check`). Our
own hard link or unlink changes the ctime alone: only then is the new
identity taken unread (:func:`same_identity` with ``relink=True``).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtet_store.io.digests import digest_fd, file_identity

Identity = Sequence[int] | os.stat_result


def same_identity(sealed: Identity | None, now: Identity, *, relink: bool = False) -> bool:
    """Whether ``now`` (an identity or a stat) is the ``sealed`` file's identity.

    ``relink``: without its ctime, which our own hard link, unlink or rename
    of the file changes and nothing else does (the one place this is decided).
    """
    n = 4 if relink else 5
    a, b = (file_identity(x) if isinstance(x, os.stat_result) else tuple(x or ())
            for x in (sealed, now))
    return len(a) == 5 and a[:n] == b[:n]


@dataclass(frozen=True)
class Seal:
    """A file's size, digests and identity (the cache's ``blobs/<name>.json`` form)."""

    size: int
    digest: str
    chunk_size: int
    chunk_digests: tuple[int, ...]
    identity: tuple[int, ...] = ()

    @classmethod
    def read(cls, fd: int, chunk_size: int) -> Seal:
        """Digest the open file ``fd`` whole; the identity is its own once its bytes are read."""
        digest, chunks, size = digest_fd(fd, chunk_size)
        return cls(size, digest, chunk_size, tuple(chunks), file_identity(os.fstat(fd)))

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Seal:
        """From its JSON document; KeyError, TypeError or ValueError when it is not one."""
        return cls(int(doc["size"]), str(doc["digest"]), int(doc["chunk_size"]),
                   tuple(doc["chunk_digests"]), tuple(doc["identity"]))

    def to_json(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), chunk_digests=list(self.chunk_digests),
                    identity=list(self.identity))

    def holds(self, st: os.stat_result) -> str | None:
        """None when ``st`` is the sealed file; a reason, or ``"identity"`` (re-digest to tell)."""
        if not stat.S_ISREG(st.st_mode):
            return "the blob is not a regular file"
        if st.st_size != self.size:
            return f"size {st.st_size}, sealed {self.size} (truncated or extended)"
        return None if same_identity(self.identity, st) else "identity"

    def recheck(self, fd: int) -> str | None:
        """Read the whole file again: None when its digests are the sealed ones."""
        digest, chunks, size = digest_fd(fd, self.chunk_size)
        if size != self.size:
            return f"read {size} bytes, sealed {self.size}"
        if digest != self.digest or tuple(chunks) != self.chunk_digests:
            bad = next((i for i, (a, b) in enumerate(zip(chunks, self.chunk_digests,
                                                         strict=False)) if a != b), None)
            return f"digest mismatch (first bad chunk {bad})"
        return None

    def check(self, fd: int, st: os.stat_result, *,
              full: bool = False) -> tuple[str | None, Seal | None]:
        """Trust the open file by its identity, else (or with ``full``) read it again.

        ``(None, None)``: as sealed, unread; ``(None, seal)``: read, the sealed
        bytes, ``seal`` to keep; ``(reason, None)``: never serve them.
        """
        problem = self.holds(st)
        if problem == "identity" or (problem is None and full):
            problem = self.recheck(fd)
            return problem, None if problem else self.renewed(st)
        return problem, None

    def renewed(self, st: os.stat_result, *, relink: bool = False) -> Seal | None:
        """This seal with ``st``'s identity; with ``relink``, None unless only the ctime moved."""
        if relink and not same_identity(self.identity, st, relink=True):
            return None
        return dataclasses.replace(self, identity=file_identity(st))
