"""A member's files from the local store, under the runtime's names: one transaction.

Each blob is checked by the store before it comes here
(:meth:`~trtet_store.sets.store.ContentStore.check`: its seal, or a read),
so nothing here reads it again to learn its digests: a copy is not read
back, a link is not digested.

By default one :func:`~trtet_store.io.write_files` transaction (preflight,
journal, atomic renames, rollback): cloned (reflink) from the store where the filesystem can, so the
bytes are on disk once and a write to one name never reaches another (the
filesystem copies on write); copied elsewhere. Where the store cannot clone
(ext4), a blob the fetch just brought into the store is moved instead
(``moves``: adopted by a :class:`~trtet_store.io.BlobStore` in the store's
``.trtet-moving`` and renamed into place by the ``consume`` transaction,
0644, no byte copied); the store then keeps a reference to the placed file
(:mod:`.store`). Any other blob of the store is never consumed.

``link=True`` places hard links to the store's read-only (0444) blobs
instead: no new disk on any filesystem, at the price of one inode for every
name: a program that writes one in place (ExecuTorch's own ``save``
truncates in place) would change the store and every member sharing it,
which the mode bits refuse to anyone but root. The links are made under temporary names
and renamed over the runtime's names (the ``.ptd`` files first, the
``.pte`` last), so a name holds its old file or the new one, never a torn
one; unlike the transaction, a crash between two renames can leave some
names new and some old.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from trtet_store.io import (
    BlobStore,
    Digests,
    ExternalFile,
    fsync_dir,
    try_clone,
    write_atomic,
    write_files,
)

#: One placed file: (runtime name, the store's blob, size, chunk digests to check the
#: placed bytes against, or None for a blob the store vouches for).
Placed = tuple[str, Path, int, tuple[int, ...] | None]


def place_files(directory: Path, files: list[Placed], chunk_size: int, *, link: bool,
                placements: list[str] | None = None,
                record: tuple[str, bytes] | None = None,
                moves: dict[str, Digests] | None = None,
                moving: Path | None = None) -> dict[str, int]:
    """Place ``files`` (the ``.pte`` first) in ``directory``, with ``record`` (a name and
    its bytes) written in the same transaction; bytes placed, by how.

    ``moves``: the runtime names whose store blob is moved into place (renamed: no
    byte copied or read), each with its blob's digests; ``moving`` the directory
    (on the store's filesystem) the blobs wait in while the transaction runs. A
    transaction that fails gives each blob back to its store name.
    """
    if link:
        placed = _link(directory, files)
        if record is not None:
            write_atomic(directory / record[0], record[1], mode=0o644)
        return placed
    moves = moves or {}
    with contextlib.ExitStack() as stack:
        staging = None
        if moves:
            assert moving is not None
            staging = stack.enter_context(BlobStore(moving, chunk_size=chunk_size,
                                                    orphan_max_age=0))
        outputs: list[tuple[Path, list]] = []
        for name, src, size, chunks in files:
            if name in moves:
                assert staging is not None
                # The member's file is its own, writable as a fetched file is: the
                # blob leaves the store with the placed mode (its bytes untouched).
                os.chmod(src, 0o644)
                stack.callback(_readonly_if_back, src)
                # Renamed into the staging store; given back to ``src`` if not consumed.
                piece = staging.adopt(src, digests=moves[name])
                stack.callback(piece.close)
            else:
                piece = ExternalFile(src, size, 0, size, chunk_size, chunks)
            outputs.append((directory / name, [piece]))
        if record is not None:
            outputs.append((directory / record[0], [record[1]]))
        if moves and placements is not None:
            placements = [*placements, "insert", "move"]
        # The names are the manifest's: a link there is replaced, never written through.
        # "auto": a move's fallback budget shrinks to fit the disk (an insert uses none).
        reports = write_files(outputs, consume=bool(moves), placements=placements,
                              follow_links=False, **({"chunk_size": "auto"} if moves else {}))
    placed: dict[str, int] = {}
    for w in reports[:len(files)]:
        for rec in w.placements:
            how = "move" if rec.placement in ("insert", "move") else rec.placement
            placed[how] = placed.get(how, 0) + rec.size
    return placed


def _readonly_if_back(path: Path) -> None:
    """A blob a failed transaction gave back to the store is read-only again."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, 0o444)


def reflinks(store: Path, directory: Path) -> bool:
    """Whether a file of ``store`` can be cloned (reflink) into ``directory``, by trying it.

    One block, written to an unnamed file (``O_TMPFILE``) of the store and
    cloned into another of ``directory``; both vanish when closed, no name
    left behind.
    """
    try:
        src = os.open(store, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.pwrite(src, bytes(4096), 0)
        try:
            dst = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            return try_clone(src, dst, 4096)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _link(directory: Path, files: list[Placed]) -> dict[str, int]:
    made: list[tuple[Path, Path]] = []
    try:
        for name, src, _, _ in files:
            tmp = directory / f".{name}.trtet-link-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            try:
                os.link(src, tmp)
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise OSError(errno.EXDEV, f"link=True needs the store ({src.parent}) on "
                                  f"the destination's filesystem ({directory}); pass store= "
                                  "a directory there, or place without links", src) from None
                raise
            made.append((tmp, directory / name))
        for tmp, final in [*made[1:], made[0]]:  # the program last
            os.replace(tmp, final)
        fsync_dir(directory)
    finally:
        for tmp, _ in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return {"link": sum(size for _, _, size, _ in files)}
