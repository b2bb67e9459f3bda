"""What an engine build's key and entries are: compute capability, build key, kinds, checks.

The cache (``cache/``) knows no TensorRT: this module says what its keys and
metadata mean for an engine build. The build key is
``trt-<fingerprint>-<capability>``; a build is the entries ``<key>.e<i>``
(engine ``i``'s bytes) and ``<key>`` (the build record, written last); a
shared entry is the files ``record``, ``e0``, ``e1``... with the pointer
metadata ``{"record": ..., "engines": [...]}``. :func:`entry_problem` is the
engine cache's ``accept``: an entry is served only on the GPU and versions
it was built for. Both the engine cache and the Torch-TensorRT adapter import
this module (neither imports the other at import time).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trtet_store.io.units import GiB

if TYPE_CHECKING:
    from trtet_store.cache.tier import RemoteEntry
    from trtet_store.export.tensorrt import BuildResult

__all__ = ["DEFAULT_LEASE_TTL", "DEFAULT_MAX_BYTES", "DEFAULT_MIN_FREE", "ENGINE_KIND",
           "NO_GPU", "RECORD_KIND", "build_key", "compute_capability", "engine_key",
           "entry_problem", "metadata", "missed_because", "places"]

ENGINE_KIND = "trtet_store.tensorrt.engine"
RECORD_KIND = "trtet_store.tensorrt.build"
#: A structure entry's record kind and key prefix (``trt-s-<structure>-<capability>``,
#: :mod:`.engine_refit`); a fingerprint is hex, so no build key starts so.
STRUCTURE_RECORD_KIND = "trtet_store.tensorrt.structure"
STRUCTURE_PREFIX = "trt-s-"
NO_GPU = "no-gpu"

#: The default bound: what Torch-TensorRT's DiskEngineCache allows (5 GB) is two
#: engines of a 7B model; ours defaults to 20 GiB of distinct engine bytes.
DEFAULT_MAX_BYTES = 20 * GiB
#: Kept free on the cache's filesystem by default: the cache never fills a disk.
DEFAULT_MIN_FREE = 1 * GiB
#: The shared tier's lease on a key: renewed every third of it while the build runs.
DEFAULT_LEASE_TTL = 300.0


def compute_capability() -> str:
    """The GPU's compute capability as ``sm_<major><minor>`` (device 0), or ``"no-gpu"``.

    Part of every key: an engine is built for one GPU architecture, and a
    cache shared between machines must never hand it to another.

    Where no CUDA driver can be loaded, no GPU is there for torch either: said
    without importing torch (``cache pull`` needs no model, :func:`_no_cuda_driver`).
    """
    if "torch" not in sys.modules and _no_cuda_driver():
        return NO_GPU
    import torch

    if not torch.cuda.is_available():
        return NO_GPU
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _no_cuda_driver() -> bool:
    """Whether the CUDA driver library (``libcuda.so.1``) cannot be loaded: then
    ``torch.cuda.is_available()`` is False too. Any other case (a driver, with or
    without a device) is left to torch."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def build_key(fingerprint: str, capability: str | None = None) -> str:
    """The cache key of a build: ``trt-<fingerprint>-<capability>``."""
    if capability is None:
        capability = compute_capability()
    return f"trt-{fingerprint}-{capability}"


def engine_key(key: str, index: int) -> str:
    """The local cache key of engine ``index`` of the build ``key``."""
    return f"{key}.e{index}"


def metadata(key: str, built: BuildResult, fingerprint: str, capability: str | None = None
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What a build's entries carry: each engine's metadata, and the record's.

    The same dicts go into the local cache and into a shared entry's pointer
    (``{"record": ..., "engines": [...]}``), so a downloaded entry is cached
    exactly as a local build is.
    """
    from trtet_store.export import engine_reuse

    if capability is None:
        capability = compute_capability()
    engines = [{"kind": ENGINE_KIND, "build": key, "engine_id": engine.engine_id,
                "compute_capability": capability} for engine in built.engines]
    record = {"kind": RECORD_KIND, "fingerprint": fingerprint, "compute_capability": capability,
              "versions": [list(v) for v in engine_reuse.build_versions()],
              "engines": [engine_reuse.engine_entry(e) for e in built.engines]}
    parts = engine_reuse.key_parts_of(fingerprint)
    if parts is not None:
        # Each part's digest, so that a later miss can name what changed (and the
        # structure key, for a refit).
        record["key_parts"] = parts.to_json()
    return engines, record


def places(entry: RemoteEntry) -> list[tuple[str, str, dict[str, Any]]]:
    """Where a shared build's files go in the local cache: the engines, then the record."""
    key = entry.key
    out = [(f"e{i}", engine_key(key, i), meta)
           for i, meta in enumerate(entry.metadata["engines"])]
    return [*out, ("record", key, entry.metadata["record"])]


def entry_problem(entry: RemoteEntry, capability: str | None = None) -> str | None:
    """Why the shared ``entry`` must not be placed on this machine (None: it may).

    Its metadata must be an engine build's, its files those of that build,
    and its compute capability and versions this machine's: an engine is
    never placed on a GPU (or a TensorRT) it was not built for. ``capability``:
    this machine's (default :func:`compute_capability`).
    """
    meta = entry.metadata if isinstance(entry.metadata, dict) else {}
    record, engines = meta.get("record"), meta.get("engines")
    # A structure entry (issue 46 item 5: ``trt-s-...``) holds a structure record, and
    # only it does: a build's record is never entered as one, nor the other way round.
    kind = STRUCTURE_RECORD_KIND if str(entry.key).startswith(STRUCTURE_PREFIX) else RECORD_KIND
    if not isinstance(record, dict) or record.get("kind") != kind or \
            not isinstance(engines, list) or \
            not all(isinstance(e, dict) and e.get("kind") == ENGINE_KIND for e in engines) \
            or not isinstance(record.get("engines"), list) \
            or len(record["engines"]) != len(engines):
        return "its metadata is not an engine build's (record and engines)"
    names = sorted(str(f.get("name")) for f in entry.files)
    want = sorted(["record", *(f"e{i}" for i in range(len(engines)))])
    if names != want:
        return f"its files are {names}, a build of {len(engines)} engine(s) has {want}"
    here = compute_capability() if capability is None else capability
    for what, value in [("the record", record.get("compute_capability")),
                        *((f"engine {i}", e.get("compute_capability"))
                          for i, e in enumerate(engines))]:
        if value != here:
            return (f"{what} was built for compute capability {value!r}; this machine's "
                    f"GPU is {here!r}")
    # engine_reuse's (where imported: tests replace it there), else without torch.
    reuse = sys.modules.get("trtet_store.export.engine_reuse")
    if reuse is None:
        from trtet_store.export import build_versions as reuse
    mine = {str(n): str(v) for n, v in reuse.build_versions()}
    try:
        theirs = {str(n): str(v) for n, v in record.get("versions") or []}
    except (TypeError, ValueError):
        return f"its versions {record.get('versions')!r} cannot be read"
    if theirs != mine:
        differ = sorted(set(mine) | set(theirs))
        shown = [f"{n} {theirs.get(n, '(none)')} (here {mine.get(n, '(none)')})"
                 for n in differ if theirs.get(n) != mine.get(n)]
        return "it was built with other versions: " + ", ".join(shown)
    return None


#: How a miss names each differing part of its key (item 6 of issue 46).
_PART_CHANGED = {"graph": "graph changed", "weight_layout": "weight names, shapes or dtypes "
                 "changed", "weights": "weights changed", "inputs": "input shapes changed"}
NOTHING_CLOSE = "the cache holds no build close to this one"


def missed_because(entries: Iterable[Any], key: str, fingerprint: str) -> str | None:
    """Why the build ``key`` missed: the parts that differ from the closest cached build.

    ``entries``: the cache's entries (their ``key`` and ``metadata``; only the
    metadata is read, never an engine byte). The closest build is the record,
    other than ``key``'s own, whose key parts differ in the fewest parts.
    ``"weights changed"``, ``"settings changed: optimization_level"``,
    ``"versions changed: tensorrt 10.13 -> 10.14"``...; :data:`NOTHING_CLOSE`
    when no record has key parts or the closest is another model (graph and
    weights both differ); None when this process does not know the parts of
    ``fingerprint``.
    """
    from trtet_store.export import engine_reuse

    mine = engine_reuse.key_parts_of(fingerprint)
    if mine is None:
        return None
    prefix = f"trt-{fingerprint}-"
    here = key[len(prefix):] if key.startswith(prefix) else compute_capability()
    best: tuple[int, str] | None = None
    for entry in entries:
        meta = entry.metadata if isinstance(entry.metadata, dict) else {}
        theirs = meta.get("key_parts")
        if entry.key == key or meta.get("kind") != RECORD_KIND or not isinstance(theirs, dict) \
                or not isinstance(theirs.get("digests"), dict):
            continue
        differ = [p for p in engine_reuse.KEY_PARTS
                  if theirs["digests"].get(p) != mine.digests[p]]
        capability = meta.get("compute_capability")
        if capability != here:
            differ.append("capability")
        if best is None or len(differ) < best[0]:
            best = (len(differ), _said(differ, mine, theirs, capability, here))
    return NOTHING_CLOSE if best is None else best[1]


def _said(differ: list[str], mine: Any, theirs: dict[str, Any], capability: Any,
          here: str) -> str:
    if not differ:
        return "a build of the same key parts is cached under another key"
    if "graph" in differ and "weights" in differ:
        return NOTHING_CLOSE
    said = []
    for part in differ:
        if part == "settings":
            old = theirs.get("settings") if isinstance(theirs.get("settings"), dict) else {}
            keys = sorted(k for k in set(old) | set(mine.settings)
                          if old.get(k) != mine.settings.get(k))
            said.append("settings changed" + (": " + ", ".join(keys) if keys else ""))
        elif part == "versions":
            try:
                old = {str(n): str(v) for n, v in theirs.get("versions") or []}
            except (TypeError, ValueError):
                old = {}
            new = {str(n): str(v) for n, v in mine.versions}
            shown = [f"{n} {old.get(n, '(none)')} -> {new.get(n, '(none)')}"
                     for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]
            said.append("versions changed" + (": " + ", ".join(shown) if shown else ""))
        elif part == "gpu":
            said.append(f"GPU changed: {theirs.get('gpu')} -> {mine.gpu}")
        elif part == "capability":
            said.append(f"compute capability changed: {capability} -> {here}")
        else:
            said.append(_PART_CHANGED[part])
    return "; ".join(said)
