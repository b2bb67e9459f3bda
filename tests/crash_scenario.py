"""A crash test's write, described by seeds and sizes only: :class:`Scenario`.

A child process (a subprocess for the kill tests, a fork for the power cuts)
builds the write from the scenario, and the parent computes what the outputs
and the blobs must hold from the same scenario, without sharing any object
with the child.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from digests import digest

from trtet_store.io.units import MiB


def content(seed: int, size: int) -> bytes:
    """Reproducible pseudo-random bytes.

    Parameters
    ----------
    seed : int
        Picks the bytes; the same seed and size give the same bytes in any process.
    size : int
        How many bytes.

    Returns
    -------
    bytes
    """
    return random.Random(seed).randbytes(size)


def tampered(data: bytes) -> bytes:
    """``data`` with its first bytes changed, same length: a source changed after staging."""
    mark = b"tampered after staging"
    return mark[: len(data)] + data[len(mark):]


@dataclass
class Scenario:
    """A write described by seeds and sizes.

    Attributes
    ----------
    blobs : list of (int, int)
        Each blob's ``(seed, size)``.
    outputs : dict
        Maps an output name to its pieces: ``["bytes", seed, size]``,
        ``["blob", i]`` (blob ``i`` of ``blobs``) or ``["ext", name]`` (a user
        file, never consumed, kept outside the staging and output directories).
    old : dict
        The ``(seed, size)`` of the content each output has before the write
        (absent if not named).
    externals : dict
        The ``(seed, size)`` of each user file named by an ``"ext"`` piece.
    store_chunk, write_chunk : int
        The store's and the write's chunk sizes.
    consume : bool
        Whether the write consumes its blobs.
    pristine : str or None
        A directory whose ``blob-<i>`` files hold the blobs' bytes (large
        blobs are generated once, not per run).
    tamper : int or None
        Index of a blob changed after staging.
    """

    blobs: list[tuple[int, int]]
    outputs: dict[str, list[list]]
    old: dict[str, tuple[int, int]] = field(default_factory=dict)
    externals: dict[str, tuple[int, int]] = field(default_factory=dict)
    store_chunk: int = 64 << 10
    write_chunk: int = 256 << 10
    consume: bool = True
    pristine: str | None = None
    tamper: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        raw = json.loads(text)
        raw["blobs"] = [tuple(b) for b in raw["blobs"]]
        raw["old"] = {k: tuple(v) for k, v in raw["old"].items()}
        raw["externals"] = {k: tuple(v) for k, v in raw["externals"].items()}
        return cls(**raw)

    # -- what the parent knows -------------------------------------------------

    def blob_bytes(self, i: int) -> bytes:
        """Blob ``i``'s bytes as staged (after any tampering)."""
        seed, size = self.blobs[i]
        if self.pristine:
            data = Path(self.pristine, f"blob-{i}").read_bytes()
            assert len(data) == size
        else:
            data = content(seed, size)
        return tampered(data) if self.tamper == i else data

    def staged_digests(self) -> list[str]:
        """The digest of each blob's file as staged (after any tampering)."""
        return [digest(self.blob_bytes(i)) for i in range(len(self.blobs))]

    def new_content(self) -> dict[str, bytes]:
        """What each output holds after an uninterrupted write."""
        return {name: b"".join(self._pieces(pieces, self.blob_bytes,
                                            lambda name: content(*self.externals[name])))
                for name, pieces in self.outputs.items()}

    def old_content(self) -> dict[str, bytes | None]:
        """What each output holds before the write (None: it does not exist)."""
        return {name: content(*self.old[name]) if name in self.old else None
                for name in self.outputs}

    def moved_blobs(self) -> set[int]:
        """Blobs a consuming write on one filesystem moves (used once, consume=True)."""
        if not self.consume:
            return set()
        uses: dict[int, int] = {}
        for pieces in self.outputs.values():
            for p in pieces:
                if p[0] == "blob":
                    uses[p[1]] = uses.get(p[1], 0) + 1
        return {i for i, n in uses.items() if n == 1}

    # -- setting the scene ---------------------------------------------------------

    def install(self, root: Path) -> tuple[Path, Path, Path]:
        """Fresh ``staging``, ``out`` and ``user`` directories under ``root``, old outputs in place.

        Returns
        -------
        tuple of Path
            ``(staging, out, user)``.
        """
        root.mkdir(parents=True, exist_ok=True)
        dirs = []
        for name in ("staging", "out", "user"):
            d = root / name
            if d.exists():
                for p in d.iterdir():
                    p.unlink()
            else:
                d.mkdir()
            dirs.append(d)
        staging, out, user = dirs
        for name, (seed, size) in self.old.items():
            (out / name).write_bytes(content(seed, size))
        for name, (seed, size) in self.externals.items():
            (user / name).write_bytes(content(seed, size))
        return staging, out, user

    def stage(self, staging: Path) -> tuple[Any, list[Any]]:
        """Make the store and its blobs (in the process that will write).

        Returns
        -------
        tuple
            ``(store, blobs)``.
        """
        from trtet_store import BlobStore

        store = BlobStore(staging, chunk_size=self.store_chunk)
        blobs = []
        for i, (seed, size) in enumerate(self.blobs):
            if self.pristine:
                with store.writer() as w, open(Path(self.pristine, f"blob-{i}"), "rb") as f:
                    while part := f.read(4 * MiB):
                        w.write(part)
                blob = w.blob
            else:
                blob = store.put(content(seed, size))
            blobs.append(blob)
        if self.tamper is not None:
            path = blobs[self.tamper].path
            data = Path(path).read_bytes()
            with open(path, "r+b") as f:
                f.write(tampered(data)[:64])
        return store, blobs

    def write(self, out: Path, user: Path, blobs: list[Any], **kwargs: Any) -> Any:
        """Run the write (``write_files``) of this scenario; return its report."""
        from trtet_store import ExternalFile, write_files

        outputs = [(out / name, self._pieces(pieces, blobs.__getitem__,
                                             lambda name: ExternalFile.of(user / name)))
                   for name, pieces in self.outputs.items()]
        return write_files(outputs, consume=self.consume, chunk_size=self.write_chunk, **kwargs)

    @staticmethod
    def _pieces(pieces: list[list], blob: Any, external: Any) -> list[Any]:
        """The pieces of one output, the ``"blob"`` and ``"ext"`` ones made by ``blob(i)`` and
        ``external(name)``: the parent wants bytes where the child wants blobs and files."""
        built = []
        for p in pieces:
            if p[0] == "bytes":
                built.append(content(p[1], p[2]))
            elif p[0] == "blob":
                built.append(blob(p[1]))
            else:
                built.append(external(p[1]))
        return built


def kill_scenario(pristine: Path | None = None, *, scale: int = MiB,
                  aligned: bool = False) -> Scenario:
    """The kill tests' write: two outputs from five blobs (64 MiB at the default scale)
    and a user file, small chunks so that there are hundreds of chunk boundaries.

    Unaligned, every blob is moved. Aligned, model.pte's 4 KiB header lets its
    largest blob host it (insert) where the filesystem can insert ranges.
    """
    sizes = [20 * scale + 123, 17 * scale + 4097, 13 * scale, 9 * scale + 1, 5 * scale + 77]
    return Scenario(
        blobs=[(100 + i, n) for i, n in enumerate(sizes)],
        outputs={
            "model.pte": [["bytes", 1, 4096 if aligned else 4000], ["blob", 0],
                          ["bytes", 2, 3000], ["blob", 1],
                          ["ext", "user.bin"], ["bytes", 3, 100]],
            "model.ptd": [["bytes", 4, 64], ["blob", 2], ["blob", 3], ["bytes", 5, 17],
                          ["blob", 4]],
        },
        old={"model.pte": (7, 5000), "model.ptd": (8, 70_000)},
        externals={"user.bin": (9, scale + 5)},
        store_chunk=64 << 10,
        write_chunk=256 << 10,
        pristine=os.fspath(pristine) if pristine else None,
    )


def write_pristine(scn: Scenario, directory: Path) -> None:
    """Write each blob's bytes to ``directory/blob-<i>``, for ``Scenario.pristine``."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, (seed, size) in enumerate(scn.blobs):
        (directory / f"blob-{i}").write_bytes(content(seed, size))
