"""Reusing the engines of an export that died or failed: a TensorRT build is hours, a save seconds.

Each engine staged by :func:`build_or_reuse` carries, in its blob's metadata,
the fingerprint of the build that made it: the exported graph, its range
constraints, its weights, the example inputs' shapes, the compile settings,
the versions of torch, Torch-TensorRT and every TensorRT wheel installed, and
the GPU. As soon as one build's engines are staged (one build per method), a
build record joins them: a blob holding the program with its engine
placeholders (``torch.export.save``), and in its metadata each engine's id,
digest, state and output specs. So a multi-method export killed after its
first method left that method's build complete and reusable.

Where staged engines outlive a failed export:

- the process died: its store's lock went with it, and the blobs are orphans
  of the staging directory (``BlobStore.orphans``);
- the call raised: :func:`keep` turns the build's blobs into orphans of the
  export's own store (released only by ``remove_orphans``), or, for a
  caller's store, keeps them alive in that store until it closes.

The next export of the same build (same fingerprint) finds the newest record
whose every engine is there, unchanged since it was sealed (identity and
recorded digest, one ``stat`` each), takes those over without copying and
lowers from there instead of building. Nothing else is touched: engines of
other or older builds, and changed ones, stay orphans, listed by
:func:`abandoned` and ``trtet-store recover``.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import logging
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from trtet_store.export import tensorrt
from trtet_store.export.record_check import UnsafeRecordError, load_record
from trtet_store.io import Blob, InsufficientSpaceError, Orphan
from trtet_store.io.digests import file_identity
from trtet_store.io.sidecar import read_meta

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.io import BlobStore

log = logging.getLogger("trtet_store.tensorrt")

ENGINE_KIND = "trtet_store.tensorrt.engine"
RECORD_KIND = "trtet_store.tensorrt.build"

# build_versions (with its cache and pattern) lives in a module without torch: ``cache pull``
# checks a shared entry's versions against this machine's (engine_key.entry_problem).
from trtet_store.export.build_versions import (  # noqa: E402, F401 (engine_reuse's names)
    VERSIONED_DISTRIBUTIONS,
    _import_path_state,
    _normalized,
    build_versions,
)


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


#: The parts of a build's key, in the order the full fingerprint hashes their digests.
KEY_PARTS = ("graph", "weight_layout", "weights", "inputs", "settings", "versions", "gpu")
#: The parts that are not the weight bytes: a change elsewhere needs a build, not a refit.
STRUCTURE_PARTS = tuple(p for p in KEY_PARTS if p != "weights")


@dataclass(frozen=True)
class KeyParts:
    """One build's key, part by part (see :func:`build_key_parts`).

    Attributes
    ----------
    digests : dict
        Part name (:data:`KEY_PARTS`) -> xxh3-128 hex digest of that part.
    settings : dict
        Setting name -> xxh3-64 hex digest of its ``repr``: which setting changed.
    versions : list
        ``[name, version]`` of each distribution the build depends on.
    gpu : str
        The GPU's name (``"no cuda"`` without one).
    """

    digests: dict[str, str]
    settings: dict[str, str]
    versions: list[list[str]]
    gpu: str

    @property
    def full(self) -> str:
        """The build fingerprint: every part, weight bytes included."""
        return _combined(self.digests, KEY_PARTS)

    @property
    def structure(self) -> str:
        """Every part but the weight bytes: what an engine refit from new weights keeps."""
        return _combined(self.digests, STRUCTURE_PARTS)

    def to_json(self) -> dict[str, Any]:
        """What a build record keeps of its key, so that a later miss can say what changed."""
        return {"digests": dict(self.digests), "structure": self.structure,
                "settings": dict(self.settings), "versions": [list(v) for v in self.versions],
                "gpu": self.gpu}


def _combined(digests: dict[str, str], parts: tuple[str, ...]) -> str:
    h = xxhash.xxh3_128()
    for part in parts:
        h.update(f"{part}={digests[part]}\0".encode())
    return h.hexdigest()


class _PartHash:
    """One part's running hash: ``repr`` of each item, NUL-separated, raw bytes as given."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()

    def add(self, text: object) -> None:
        self._h.update(repr(text).encode())
        self._h.update(b"\0")

    def update(self, data: memoryview) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


# Parts of the fingerprints computed in this process, so that the build record made
# later from a fingerprint alone (engine_key.metadata) can keep its parts.
_PARTS_OF: dict[str, KeyParts] = {}
_PARTS_KEPT = 256


def key_parts_of(fingerprint: str) -> KeyParts | None:
    """The parts of ``fingerprint`` if this process computed it (:func:`build_key_parts`)."""
    return _PARTS_OF.get(fingerprint)


def build_key_parts(exported_program: ExportedProgram, arg_inputs: tuple,
                    kwarg_inputs: dict | None, settings: dict[str, Any]) -> KeyParts:
    """What makes two builds the same, part by part: graph, weights, inputs, settings, ...

    - ``graph``: the graph's text (its nodes with their arguments, so its
      edges), its signature and its range constraints (two exports whose
      graphs print alike but whose dynamic dimensions are bounded differently
      build different engines: their optimization profiles differ);
    - ``weight_layout``: each parameter's, buffer's and constant's name,
      shape and dtype (so the widths of the layers), a non-tensor constant's
      ``repr``;
    - ``weights``: the tensors' bytes (xxh3, a few GB/s; hashed once);
    - ``inputs``: the example inputs' shapes, dtypes and devices;
    - ``settings``: the compile settings, compared by ``repr`` (one whose
      repr differs between runs only costs a rebuild);
    - ``versions``: torch, Torch-TensorRT and every TensorRT wheel;
    - ``gpu``: the GPU's name.
    """
    graph, layout, weights, inputs = _PartHash(), _PartHash(), _PartHash(), _PartHash()
    graph.add(str(exported_program.graph_module.graph))
    graph.add(exported_program.graph_signature)
    graph.add(sorted((str(k), str(v)) for k, v in exported_program.range_constraints.items()))
    for name, value in sorted({**exported_program.state_dict,
                               **exported_program.constants}.items()):
        layout.add(name)
        if isinstance(value, torch.Tensor):
            layout.add((tuple(value.shape), value.dtype))
            weights.add(name)
            weights.update(_tensor_bytes(value))
        else:
            layout.add(value)
    for x in torch.utils._pytree.tree_leaves((arg_inputs, kwarg_inputs or {})):
        inputs.add((tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor)
                   else x)
    setting_reprs = sorted((str(k), repr(v)) for k, v in settings.items())
    versions = build_versions()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda"

    def digest(item: object) -> str:
        h = _PartHash()
        h.add(item)
        return h.hexdigest()

    parts = KeyParts(
        digests={"graph": graph.hexdigest(), "weight_layout": layout.hexdigest(),
                 "weights": weights.hexdigest(), "inputs": inputs.hexdigest(),
                 "settings": digest(setting_reprs), "versions": digest(versions),
                 "gpu": digest(gpu)},
        settings={k: xxhash.xxh3_64_hexdigest(r.encode()) for k, r in setting_reprs},
        versions=[list(v) for v in versions], gpu=gpu)
    if len(_PARTS_OF) >= _PARTS_KEPT:
        _PARTS_OF.pop(next(iter(_PARTS_OF)))
    _PARTS_OF[parts.full] = parts
    return parts


def build_fingerprint(exported_program: ExportedProgram, arg_inputs: tuple,
                      kwarg_inputs: dict | None, settings: dict[str, Any]) -> str:
    """The full key of a build: every part of :func:`build_key_parts`, weight bytes included."""
    return build_key_parts(exported_program, arg_inputs, kwarg_inputs, settings).full


class _TaggingStore:
    """The store as the builder sees it: every blob it stages is tagged as this build's.

    A full disk while an engine streams in becomes an
    :class:`~trtet_store.io.InsufficientSpaceError` naming the staging file,
    how much it had taken and how much was free, not a bare ``ENOSPC``.
    """

    def __init__(self, store: BlobStore, fingerprint: str) -> None:
        self._store = store
        self._tag = {"kind": ENGINE_KIND, "fingerprint": fingerprint}

    @contextmanager
    def writer(self, *, metadata: dict | None = None) -> Iterator[Any]:
        written = _Counting()
        try:
            with self._store.writer(metadata={**(metadata or {}), **self._tag}) as w:
                written.inner = w
                yield written
        except OSError as exc:
            if exc.errno != errno.ENOSPC or isinstance(exc, InsufficientSpaceError):
                raise
            directory = self._store.directory
            st = os.statvfs(directory)
            raise StagingSpaceError(written.size, st.f_bavail * st.f_frsize,
                                    directory) from exc

    def put(self, data: bytes, *, metadata: dict | None = None) -> Blob:
        return self._store.put(data, metadata={**(metadata or {}), **self._tag})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class StagingSpaceError(InsufficientSpaceError):
    """The disk filled while a TensorRT engine was staged (its size was not known before).

    ``needed`` is a lower bound: the bytes staged when the disk filled, plus one.
    """

    def __init__(self, written: int, available: int, directory: os.PathLike | str) -> None:
        from trtet_store.io.units import format_mib

        OSError.__init__(
            self, errno.ENOSPC,
            f"not enough free space to stage a TensorRT engine in {os.fspath(directory)}: the "
            f"disk filled after {format_mib(written)} of it, so it needs more than that, and "
            f"{format_mib(available)} is available there (its partial file removed). Free "
            "space, or stage on a larger filesystem (store=, or trtet-store --store DIR); "
            "engines staged before it are kept, and the next run of the same export reuses "
            "them", os.fspath(directory))
        self.needed = written + 1
        self.available = available
        self.path = os.fspath(directory)


class _Counting:
    """A blob writer that counts what went in (for the full-disk message)."""

    def __init__(self) -> None:
        self.inner: Any = None
        self.size = 0

    def write(self, data: Any) -> int:
        n = self.inner.write(data)
        self.size += n
        return n

    @property
    def blob(self) -> Blob | None:
        return self.inner.blob


def engine_entry(engine: tensorrt.Engine) -> dict[str, Any]:
    return {"engine_id": engine.engine_id, "digest": engine.blob.digest,
            "size": engine.blob.size, "state": dataclasses.asdict(engine.state),
            "outputs": [[list(shape), str(dtype).removeprefix("torch.")]
                        for shape, dtype in engine.outputs]}


def _record(store: BlobStore, fingerprint: str, built: tensorrt.BuildResult) -> Blob:
    buffer = io.BytesIO()
    torch.export.save(built.exported_program, buffer)
    return store.put(buffer.getvalue(), metadata={
        "kind": RECORD_KIND, "fingerprint": fingerprint,
        "engines": [engine_entry(e) for e in built.engines]})


def entry_state(entry: dict[str, Any]) -> tensorrt.EngineState:
    s = entry["state"]  # dataclasses.asdict of the state, lists where it has tuples
    return tensorrt.EngineState(**{
        **s, "input_names": tuple(s["input_names"]), "output_names": tuple(s["output_names"]),
        "aliased_io": tuple(map(tuple, s["aliased_io"]))})


# -- engines kept after a failed call ------------------------------------------------------

# Blobs a failed call kept alive in its caller's store, until that store closes.
_KEPT: weakref.WeakKeyDictionary[Any, list[Blob]] = weakref.WeakKeyDictionary()


def keep(store: BlobStore, blobs: list[Blob], *, own_store: bool) -> None:
    """Keep a failed call's staged engines and records for the next call of the same build.

    ``own_store``: the store is the call's own and is about to close; its
    blobs become orphans of its directory, kept until ``remove_orphans`` (as
    if the process had died). Otherwise the store is the caller's: the blobs
    stay alive in it, and go when the caller closes it.
    """
    live = [b for b in blobs if b is not None and not b.closed and not b.consumed]
    if not live:
        return
    if own_store:
        _unkeep(store, live)
        for blob in live:
            # A blob's release deletes its file; detached, the file stays, and
            # once the store's lock is gone it is a dead store's blob: an orphan.
            blob.keep()
    else:
        held = _KEPT.setdefault(store, [])
        held.extend(b for b in live if all(b is not h for h in held))
    log.warning("export failed after its build: %d staged file(s) (engines, build records; "
                "%d bytes) kept in %s "
                "for the next export of the same build", len(live),
                sum(b.size for b in live), store.directory)


def kept(store: BlobStore) -> list[Blob]:
    """The blobs failed calls keep alive in ``store`` (see :func:`keep`)."""
    return [b for b in _KEPT.get(store, []) if not b.closed and not b.consumed]


# -- finding a reusable build --------------------------------------------------------------

@dataclass
class _Staged:
    """An engine or record staged earlier: an orphan, or a blob kept in this store."""

    metadata: dict
    size: int
    digest: str | None  # None: changed since sealed (or never digested), so not trusted
    orphan: Orphan | None = None
    blob: Blob | None = None

    def take(self, store: BlobStore) -> Blob:
        if self.blob is not None:
            return self.blob
        return store.adopt_orphan(self.orphan)


def _trusted_digest(o: Orphan) -> str | None:
    """The orphan's recorded digest, if the file is still exactly the one sealed."""
    try:
        now = file_identity(os.stat(o.path))
    except FileNotFoundError:
        return None
    if o.sealed_identity is None or tuple(o.sealed_identity) != now:
        return None
    return read_meta(o.path).get("digest")


def _staged(store: BlobStore, fingerprint: str | None = None) -> list[_Staged]:
    """Engines and records of builds in ``store``: its orphans, oldest first, then kept blobs."""
    out = []
    for o in store.orphans():
        kind = o.metadata.get("kind")
        if kind not in (ENGINE_KIND, RECORD_KIND) or o.pinned:
            continue
        if fingerprint is None or o.metadata.get("fingerprint") == fingerprint:
            out.append(_Staged(o.metadata, o.size, _trusted_digest(o), orphan=o))
    for b in _KEPT.get(store, []):
        if b.closed or b.consumed:
            continue
        if fingerprint is None or b.metadata.get("fingerprint") == fingerprint:
            out.append(_Staged(b.metadata, b.size,
                               b.digest if b.identity_matches() else None, blob=b))
    return out


def reuse(store: BlobStore, fingerprint: str) -> tensorrt.BuildResult | None:
    """The build of ``fingerprint`` an earlier export left in ``store``, or None.

    Takes over the newest record whose every engine is staged and unchanged
    (orphans by rename, no copy; blobs kept in this store as they are), each
    engine matched by its recorded digest. Nothing else is taken or removed:
    other records and engines, of older runs or changed since, stay where
    they are. None when no record is complete; then nothing was touched.
    """
    staged = _staged(store, fingerprint)
    records = [s for s in staged if s.metadata.get("kind") == RECORD_KIND]
    engines = {s.digest: s for s in staged
               if s.metadata.get("kind") == ENGINE_KIND and s.digest is not None}
    for record in reversed(records):  # newest first
        wanted = record.metadata.get("engines", [])
        found = [engines.get(entry.get("digest")) for entry in wanted]
        missing = [entry.get("engine_id") for entry, s in zip(wanted, found, strict=True)
                   if s is None or s.size != entry.get("size")]
        if missing:
            log.warning("build %s: staged engines %s of a record are missing or changed since "
                        "they were built; that record is not used (its files are kept)",
                        fingerprint, missing)
            continue
        try:  # checked before anything is taken: a refused record leaves all as it was
            exported = load_record(record.orphan.path if record.orphan is not None
                                   else record.blob.path)  # type: ignore[union-attr]
        except UnsafeRecordError as exc:
            log.warning("build %s: %s; that record is not used (its files are kept)",
                        fingerprint, exc)
            continue
        record_blob = record.take(store)
        taken: dict[str, Blob] = {}
        for entry, s in zip(wanted, found, strict=True):
            if entry["digest"] not in taken:
                taken[entry["digest"]] = s.take(store)
        blobs = [taken[entry["digest"]] for entry in wanted]
        _unkeep(store, [record_blob, *blobs])
        engines_out = [tensorrt.register_engine(
            blob, entry_state(entry),
            [(tuple(shape), getattr(torch, dtype)) for shape, dtype in entry["outputs"]],
            engine_id=entry["engine_id"]) for entry, blob in zip(wanted, blobs, strict=True)]
        log.info("build %s: reusing %d staged engines of a previous export (%d bytes) instead "
                 "of building them", fingerprint, len(engines_out),
                 sum(b.size for b in taken.values()))
        return tensorrt.BuildResult(exported, engines_out, record_blob)
    return None


def _unkeep(store: BlobStore, blobs: list[Blob]) -> None:
    held = _KEPT.get(store)
    if held:
        held[:] = [h for h in held if all(h is not b for b in blobs)]


def abandoned(store: BlobStore, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """One line per build whose staged engines sit unused in ``store``'s directory.

    For builds whose fingerprint is in ``exclude`` (this export's own, about
    to be reused) only the engines no record lists are named: a kill during
    the build left them, or they changed since, and nothing can reuse them.
    Each line names the build, how many engines and records and their size.
    """
    builds: dict[str, list[_Staged]] = {}
    for s in _staged(store):
        builds.setdefault(s.metadata.get("fingerprint", "?"), []).append(s)
    lines = []
    for fingerprint, items in sorted(builds.items()):
        records = [s for s in items if s.metadata.get("kind") == RECORD_KIND]
        engines = [s for s in items if s.metadata.get("kind") == ENGINE_KIND]
        listed = {e.get("digest") for r in records for e in r.metadata.get("engines", [])}
        loose = [s for s in engines if s.digest is None or s.digest not in listed]
        if fingerprint in exclude:
            if loose:
                lines.append(f"build {fingerprint}: {len(loose)} staged engine(s) no record "
                             f"lists, {sum(s.size for s in loose)} bytes (partial: killed "
                             "before its record, or changed since; nothing can reuse them)")
            continue
        state = "complete" if records and not loose else \
            "partial: engines no record lists cannot be reused"
        lines.append(f"build {fingerprint}: {len(engines)} staged engine(s), {len(records)} "
                     f"record(s), {sum(s.size for s in items)} bytes ({state})")
    return lines


def build_or_reuse(exported_program: ExportedProgram, arg_inputs: tuple,
                   kwarg_inputs: dict | None, store: BlobStore,
                   settings: dict[str, Any], *,
                   fingerprint: str | None = None) -> tensorrt.BuildResult:
    """Reuse an earlier export's build of the same fingerprint, or build and record it.

    The record is staged as soon as this build's engines are, and lives, like
    them, until ``store`` releases it: a crash from here on leaves everything
    the next export needs for this build.
    """
    if fingerprint is None:
        fingerprint = build_fingerprint(exported_program, arg_inputs, kwarg_inputs, settings)
    reused = reuse(store, fingerprint)
    if reused is not None:
        return reused
    built = tensorrt.build_engines(exported_program, arg_inputs, kwarg_inputs,
                                   _TaggingStore(store, fingerprint), settings)
    built.record = _record(store, fingerprint, built)
    return built
