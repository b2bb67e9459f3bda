"""The build record's side of a hit: a cached build, pinned, and the events of an export.

A build is cached as entries of one :class:`~trtet_store.cache.BlobCache`:
``<build key>.e<i>`` (engine ``i``'s bytes) and ``<build key>``, the build
record (the program with its engine placeholders as the blob; each engine's
id, digest, size, state and outputs in its metadata), written last.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.export.engine_key import engine_key
from trtet_store.io import Digests, file_identity

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.cache import BlobCache, Hit
    from trtet_store.cache.tiered import Download

__all__ = ["CachedBuild", "EngineCacheEvent", "Unplaced"]


@dataclass
class EngineCacheEvent:
    """What the cache did for one engine of an export (in its report and log).

    ``outcome`` is ``"hit"`` (not built: taken from the local cache),
    ``"remote-hit"`` (not built: downloaded from the shared tier, then placed
    as a local hit), ``"refit"`` (not built: the cached refittable engine of
    the same structure refit with the new weights, then cached under the full
    key like a build; ``written`` and ``seconds`` say what it cost) or
    ``"miss"`` (built). A build after a refit that failed says why in
    ``reason`` (``"refit failed: RefitError: ...; built instead"``). For a
    hit, ``placement`` is how the cached engine reached the staging store:
    ``"clone"`` (shared extents, no byte written) or ``"copy"``. For a miss,
    ``stored`` says whether the cache took it, with the put's ``placement``
    (``"clone"``, ``"copy"``, ``"link"``, ``"dedup"``) or the ``reason`` it
    was skipped. A miss that rebuilt a
    damaged entry says so in ``reason`` (``"rebuilt: the cached entry was
    damaged (engine 0: digest mismatch ...)"``, or the shared entry's damage).

    With a shared tier (``EngineCache(remote=...)``): ``downloaded`` is the
    bytes received from the server for the build's entry (every engine and
    the record; for a refit, the shared structure entry it was refit from,
    None when it was refit from a local one), counted on the build's first
    engine (0 on the others, so a sum over events is the total);
    ``published`` says whether this build (a miss, a refit, or a local hit
    still waiting to be published) entered the
    shared tier, and ``publish_reason`` why not (another machine published
    it first, the server was unreachable, ...). All three are None without
    a shared tier.
    """

    engine_id: str
    key: str
    size: int
    outcome: str
    placement: str | None = None
    stored: bool | None = None
    reason: str | None = None
    # The shared tier's part, at the end so that positional construction keeps its meaning.
    downloaded: int | None = None
    published: bool | None = None
    publish_reason: str | None = None
    #: Why the shared tier's entry of this key was not served (refused by the trusted
    #: keys, damaged, built for another GPU), or None (none there, or served).
    remote_reason: str | None = None
    #: A local miss: the parts of its key that differ from the closest cached build
    #: (``"weights changed"``, ``"settings changed: optimization_level"``, ...), or that
    #: the cache holds nothing close (:func:`~trtet_store.export.engine_key.missed_because`).
    missed_because: str | None = None
    #: A refit (``outcome == "refit"``, issue 46): the bytes the refit wrote for this
    #: engine (into the staging store, digested as they went) and the seconds it took.
    written: int | None = None
    seconds: float | None = None
    #: A build: where its TensorRT timing started (``"timing cache: warm, 1,234 entries"``
    #: or ``"timing cache: cold"``, :mod:`.timing_cache`); None for a hit or a refit.
    timing_cache: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CachedBuild:
    """A complete cached build, every entry pinned (never evicted) until :meth:`close`.

    Attributes
    ----------
    key : str
        The build key.
    record : Hit
        The build record's entry (the program with its placeholders).
    engines : list of Hit
        Engine ``i``'s entry, in the record's order.
    entries : list of dict
        The record's engine entries: ``engine_id``, ``digest``, ``size``,
        ``state``, ``outputs``.
    """

    def __init__(self, key: str, record: Hit, engines: list[Hit]) -> None:
        self.key = key
        self.record = record
        self.engines = engines
        self.entries: list[dict[str, Any]] = list(record.metadata.get("engines", []))

    def exported_program(self) -> ExportedProgram:
        """The recorded program, its engine nodes naming the recorded engine ids.

        Loaded only when the record is data (:func:`.record_check.load_record`);
        else :class:`~.record_check.UnsafeRecordError` (a ValueError: a miss).
        """
        from trtet_store.export.record_check import load_record

        return load_record(self.record.path)

    def close(self) -> None:
        for hit in (self.record, *self.engines):
            hit.close()

    def __enter__(self) -> CachedBuild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FileHit:
    """A downloaded, verified file standing in for a cache :class:`Hit` (for build_from_cache)."""

    def __init__(self, path: Path, metadata: dict[str, Any], digest: str,
                 digests: Digests | None = None) -> None:
        self.path = path
        self.metadata = metadata
        self.digest = digest
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self._fd).st_size
        # As the download digested the bytes, with the file's identity then.
        self._digests = digests if digests is not None and digests.digest == digest else None

    def fileno(self) -> int:
        return self._fd

    def unchanged(self) -> bool:
        """Whether the file is still the one the download digested (one ``fstat``)."""
        d = self._digests
        return d is not None and d.identity is not None and \
            file_identity(os.fstat(self._fd)) == tuple(d.identity)

    def digests(self) -> Digests:
        assert self._digests is not None
        return Digests(self._digests.digest, self._digests.size, self._digests.chunk_size,
                       self._digests.chunk_digests)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Unplaced(CachedBuild):
    """A shared entry's download the local cache did not take: served once, then removed.

    An engine the cache took (linked in before a later put was skipped) is
    served from the cache, pinned.
    """

    def __init__(self, download: Download, cache: BlobCache) -> None:
        key, entry, paths = download.key, download.entry, download.paths
        digests = {f["name"]: f["digest"] for f in entry.files}
        hits: list[Any] = []
        try:
            for i, meta in enumerate(entry.metadata["engines"]):
                if paths[f"e{i}"].exists():
                    hits.append(_FileHit(paths[f"e{i}"], meta, digests[f"e{i}"],
                                         download.digests.get(f"e{i}")))
                    continue
                hit = cache.get(engine_key(key, i))
                if hit is None or hit.digest != digests[f"e{i}"]:
                    if hit is not None:
                        hit.close()
                    raise FileNotFoundError(errno.ENOENT, f"engine {i} of {key} is neither "
                                            "downloaded nor cached any more")
                hits.append(hit)
            record = _FileHit(paths["record"], entry.metadata["record"], digests["record"])
        except BaseException:
            for h in hits:
                h.close()
            raise
        super().__init__(key, record, hits)  # type: ignore[arg-type]
        self.download = download

    def close(self) -> None:
        super().close()
        self.download.close()


def tier_files(cached: CachedBuild) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """A cached build's files (its pinned paths and digests) and its entry's metadata."""
    files = [("record", cached.record.path, cached.record.digest)]
    files += [(f"e{i}", hit.path, hit.digest) for i, hit in enumerate(cached.engines)]
    return files, {"record": dict(cached.record.metadata),
                   "engines": [dict(hit.metadata) for hit in cached.engines]}
