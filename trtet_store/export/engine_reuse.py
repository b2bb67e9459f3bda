"""Reusing the engines of an export that died: a TensorRT build is hours, a save seconds.

Each engine staged by :func:`build_or_reuse` carries, in its blob's metadata,
the fingerprint of the build that made it: the exported graph, its weights,
the example inputs' shapes, the compile settings and the versions of torch,
Torch-TensorRT and TensorRT and the GPU. Once every engine is staged, a build
record joins them: a blob holding the program with its engine placeholders
(``torch.export.save``), and in its metadata each engine's id, digest, state
and output specs. If the process dies before the program is written, those
blobs outlive it as orphans of the staging directory (``BlobStore.orphans``);
the next export of the same build (same fingerprint) finds the record, takes
the engines over without copying, checks each against its recorded digest and
lowers from there instead of building again. Anything that does not match is
built anew.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from trtet_store.export import tensorrt

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from trtet_store.io import Blob, BlobStore

log = logging.getLogger("trtet_store.tensorrt")

ENGINE_KIND = "trtet_store.tensorrt.engine"
RECORD_KIND = "trtet_store.tensorrt.build"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


def build_fingerprint(exported_program: ExportedProgram, arg_inputs: tuple,
                      kwarg_inputs: dict | None, settings: dict[str, Any]) -> str:
    """What makes two builds the same: graph, weights, input specs, settings, versions, GPU.

    Weights are hashed, not compared by name (xxh3, a few GB/s). Settings are
    compared by ``repr``: one whose repr differs between runs (an object
    without one) only costs a rebuild.
    """
    h = xxhash.xxh3_128()

    def add(text: object) -> None:
        h.update(repr(text).encode())
        h.update(b"\0")

    add(str(exported_program.graph_module.graph))
    add(exported_program.graph_signature)
    add(exported_program.range_constraints)
    for name, value in sorted({**exported_program.state_dict,
                               **exported_program.constants}.items()):
        add(name)
        if isinstance(value, torch.Tensor):
            add((tuple(value.shape), value.dtype))
            h.update(_tensor_bytes(value))
        else:
            add(value)
    for x in torch.utils._pytree.tree_leaves((arg_inputs, kwarg_inputs or {})):
        add((tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else x)
    add(sorted((k, repr(v)) for k, v in settings.items()))
    add([_version(d) for d in ("torch", "torch-tensorrt", "tensorrt", "tensorrt-cu13")])
    add(torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")
    return h.hexdigest()


class _TaggingStore:
    """The store as the builder sees it: every blob it stages is tagged as this build's."""

    def __init__(self, store: BlobStore, fingerprint: str) -> None:
        self._store = store
        self._tag = {"kind": ENGINE_KIND, "fingerprint": fingerprint}

    @contextmanager
    def writer(self, *, metadata: dict | None = None) -> Iterator[Any]:
        with self._store.writer(metadata={**(metadata or {}), **self._tag}) as w:
            yield w

    def put(self, data: bytes, *, metadata: dict | None = None) -> Blob:
        return self._store.put(data, metadata={**(metadata or {}), **self._tag})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _engine_entry(engine: tensorrt.Engine) -> dict[str, Any]:
    return {"engine_id": engine.engine_id, "digest": engine.blob.digest,
            "size": engine.blob.size, "state": dataclasses.asdict(engine.state),
            "outputs": [[list(shape), str(dtype).removeprefix("torch.")]
                        for shape, dtype in engine.outputs]}


def _record(store: BlobStore, fingerprint: str, built: tensorrt.BuildResult) -> Blob:
    buffer = io.BytesIO()
    torch.export.save(built.exported_program, buffer)
    return store.put(buffer.getvalue(), metadata={
        "kind": RECORD_KIND, "fingerprint": fingerprint,
        "engines": [_engine_entry(e) for e in built.engines]})


def _state(entry: dict[str, Any]) -> tensorrt.EngineState:
    s = entry["state"]  # dataclasses.asdict of the state, lists where it has tuples
    return tensorrt.EngineState(**{
        **s, "input_names": tuple(s["input_names"]), "output_names": tuple(s["output_names"]),
        "aliased_io": tuple(map(tuple, s["aliased_io"]))})


def reuse(store: BlobStore, fingerprint: str) -> tensorrt.BuildResult | None:
    """The build of ``fingerprint`` left in ``store``'s directory by a dead export, or None.

    Takes over the newest complete record and its engines (renames, no
    copies); each recorded engine is found by its digest among the build's
    staged engines (one whose sidecar identity no longer matches is read once
    to digest it). If one is missing, returns None: the blobs taken over stay
    in ``store`` and go when it closes, and the caller builds again.
    """
    orphans = [o for o in store.orphans()
               if o.metadata.get("fingerprint") == fingerprint and not o.pinned]
    records = [o for o in orphans if o.metadata.get("kind") == RECORD_KIND]
    if not records:
        return None
    record = records[-1]
    wanted = record.metadata.get("engines", [])
    sizes = {entry["size"] for entry in wanted}
    candidates = [o for o in orphans
                  if o.metadata.get("kind") == ENGINE_KIND and o.size in sizes]
    record_blob = store.adopt_orphan(record)
    # Matched by content, not by size or order: two engines of one size must not swap.
    by_digest = {b.digest: b for b in map(store.adopt_orphan, candidates)}
    blobs = [by_digest.get(entry["digest"]) for entry in wanted]
    missing = [entry["engine_id"] for entry, blob in zip(wanted, blobs, strict=True)
               if blob is None]
    if missing:
        log.warning("build %s: staged engines %s are missing or changed since they were "
                    "built; building again", fingerprint, missing)
        return None
    with open(record_blob.path, "rb") as f:
        exported = torch.export.load(f)
    engines = [tensorrt.register_engine(
        blob, _state(entry),
        [(tuple(shape), getattr(torch, dtype)) for shape, dtype in entry["outputs"]],
        engine_id=entry["engine_id"]) for entry, blob in zip(wanted, blobs, strict=True)]
    log.info("build %s: reusing %d staged engines of a previous export (%d bytes) instead "
             "of building them", fingerprint, len(engines), sum(b.size for b in blobs))
    return tensorrt.BuildResult(exported, engines, record_blob)


def build_or_reuse(exported_program: ExportedProgram, arg_inputs: tuple,
                   kwarg_inputs: dict | None, store: BlobStore,
                   settings: dict[str, Any]) -> tensorrt.BuildResult:
    """Reuse a dead export's build of the same fingerprint, or build and record it.

    The record is staged once every engine is, and lives, like them, until
    ``store`` releases it: a crash from here to the end of the write leaves
    everything the next export needs.
    """
    fingerprint = build_fingerprint(exported_program, arg_inputs, kwarg_inputs, settings)
    reused = reuse(store, fingerprint)
    if reused is not None:
        return reused
    built = tensorrt.build_engines(exported_program, arg_inputs, kwarg_inputs,
                                   _TaggingStore(store, fingerprint), settings)
    built.record = _record(store, fingerprint, built)
    return built
