"""TensorRT timing caches in the engine cache: keyed per GPU and TensorRT build, merged by key.

Most of a TensorRT build is tactic timing, and a timing cache lets a build
skip the timing of every tactic it holds. This module is the engine cache's
side of it (the entry's storage, a private copy and a merge under the key's
single flight, is :mod:`trtet_store.cache.mergeable`, which knows no TensorRT):

- **The key** (:func:`timing_facts`, :func:`timing_key`): the GPU's name and
  compute capability, the TensorRT distributions with their full versions
  (the wheel's version carries the build number: ``10.14.1.48``), the CUDA
  runtime, the driver, and the builder flags that change which
  implementations TensorRT may choose (:data:`IMPLEMENTATION_FLAGS`: TF32,
  refit, precisions, ...): narrower than TensorRT's own header. The GPU and
  versions come from where the build key's come from
  (:func:`.engine_reuse.build_versions`, :func:`.engine_key.compute_capability`,
  ``torch.cuda.get_device_name``). The key is ``trt-t-<xxh3-128>-<capability>``
  and the entry's metadata holds the facts themselves: an entry whose facts
  are not this build's is never loaded or merged, whatever its key.
- **The seam** (:func:`combine`, :func:`count_entries`): TensorRT's
  ``ITimingCache.combine(other, ignore_mismatch=False)`` and ``queryKeys``,
  replaced by the stub in tests as the build and the refit are.
- **A build** (:func:`build_warm`): starts from a private copy of the entry
  for its key, handed to Torch-TensorRT as ``timing_cache_path`` (no process
  ever writes a shared file in place), and after a successful build merges
  what the build wrote back into the entry (:func:`.mergeable.merge_in`).
  A caller's own ``timing_cache_path=`` is left alone (not cached here).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

from trtet_store.cache.mergeable import MergeRefused, copy_out, merge_in
from trtet_store.export import engine_key
from trtet_store.io.units import MiB

if TYPE_CHECKING:
    from trtet_store.export.tensorrt import BuildResult
    from trtet_store.export.timing_tier import CacheLevels

__all__ = ["IMPLEMENTATION_FLAGS", "MAX_TIMING_BYTES", "TIMING_KIND", "TIMING_PREFIX",
           "MergeRefused", "TimingSaid", "build_warm", "combine", "count_entries", "entry_problem",
           "timing_facts", "timing_key"]

log = logging.getLogger("trtet_store.engine_cache")

TIMING_KIND = "trtet_store.tensorrt.timing"
#: A timing entry's key prefix; a build fingerprint is hex and a structure key ``trt-s-``.
TIMING_PREFIX = "trt-t-"
#: A timing cache bigger than this is refused (they are MiBs: 21.5 MB for a team's many engines).
MAX_TIMING_BYTES = 512 * MiB

#: Compile settings that change which implementations (tactics) TensorRT may pick, so a
#: timing measured under one value must not be reused under another: TF32, refit
#: (``immutable_weights`` and the two refit flags), precisions and typing, sparsity,
#: version/hardware compatibility, engine capability, tiling, weight streaming.
#: ``optimization_level`` only changes how many tactics are tried (an entry's timing
#: holds whatever the level), and the rest (workspace, partitioning) none.
IMPLEMENTATION_FLAGS = (
    "enabled_precisions", "disable_tf32", "use_fp32_acc", "use_explicit_typing",
    "immutable_weights", "refit_identical_engine_weights", "strip_engine_weights",
    "sparse_weights", "version_compatible", "hardware_compatible", "engine_capability",
    "tiling_optimization_level", "l2_limit_for_tiling", "enable_weight_streaming",
    "truncate_double",
)


def _driver() -> str:
    """The NVIDIA kernel driver's version (``/proc/driver/nvidia/version``), or ``"none"``."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return "none"
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9][0-9.]*)", head)
    return m.group(1) if m else "unknown"


def gpu_facts() -> dict[str, Any]:
    """This machine's side of the key: GPU, capability, TensorRT, CUDA runtime, driver.

    From where the build key's GPU and versions come from; tests that play
    another machine replace this function.
    """
    import torch

    from trtet_store.export import engine_reuse

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda",
        "compute_capability": engine_key.compute_capability(),
        # Full versions: a timing cache is TensorRT's down to the build number.
        "tensorrt": sorted(f"{n} {v}" for n, v in engine_reuse.build_versions()
                           if n.startswith("tensorrt")),
        "cuda": str(torch.version.cuda or "none"),
        "driver": _driver(),
    }


def _canonical(value: Any) -> Any:
    """A setting's value as JSON, the same whatever a set's order (dtypes by name)."""
    if isinstance(value, (set, frozenset, list, tuple)):
        items = [_canonical(v) for v in value]
        if isinstance(value, (set, frozenset)):
            items.sort(key=repr)
        return items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def timing_facts(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a timing cache is keyed by: :func:`gpu_facts` and the implementation flags."""
    flags = {name: _canonical(settings[name]) for name in IMPLEMENTATION_FLAGS
             if name in settings}
    return {**gpu_facts(), "flags": flags}


def timing_key(facts: Mapping[str, Any]) -> str:
    """``trt-t-<xxh3-128 of the facts>-<capability>``."""
    digest = xxhash.xxh3_128_hexdigest(json.dumps(facts, sort_keys=True).encode())
    return f"{TIMING_PREFIX}{digest}-{facts['compute_capability']}"


def entry_problem(metadata: Mapping[str, Any], facts: Mapping[str, Any]) -> str | None:
    """Why a timing entry with ``metadata`` must not be loaded or merged for ``facts``."""
    if metadata.get("kind") != TIMING_KIND:
        return f"it is not a timing cache (kind {metadata.get('kind')!r})"
    theirs = metadata.get("timing")
    if not isinstance(theirs, dict):
        return "it names no device, TensorRT or flags"
    differ = [f"{name} {theirs.get(name)!r} (here {facts.get(name)!r})"
              for name in sorted(set(facts) | set(theirs)) if theirs.get(name) != facts.get(name)]
    if differ:
        return "it was made for another " + ", ".join(differ)
    return None


# -- the seam (CPU tests replace both, :mod:`trtet_store.testing.stub_tensorrt`) ------------


def combine(base: bytes, learned: bytes, *, ignore_mismatch: bool = False) -> bytes:
    """``base`` with ``learned``'s entries added: TensorRT's ``ITimingCache.combine``.

    Never called with ``ignore_mismatch=True`` (Polygraphy's, which mixes caches
    of different devices). Raises :class:`MergeRefused` when TensorRT refuses
    (their headers differ: another device, TensorRT build or flags).
    """
    import tensorrt as trt

    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    config = builder.create_builder_config()
    mine = config.create_timing_cache(base)
    theirs = config.create_timing_cache(learned)
    if not mine.combine(theirs, ignore_mismatch):
        raise MergeRefused("TensorRT's ITimingCache.combine refused them (their headers "
                           "differ: another device, TensorRT build or builder flags)")
    return bytes(mine.serialize())


def count_entries(data: bytes) -> int:
    """How many entries a serialized timing cache holds (TensorRT's ``queryKeys``)."""
    import tensorrt as trt

    if not data:
        return 0
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    return len(builder.create_builder_config().create_timing_cache(data).queryKeys())


# -- a build through it --------------------------------------------------------------------


@dataclass
class TimingSaid:
    """What the timing cache did for one build (the export's event and log line)."""

    key: str
    warm: bool
    entries: int  # in the copy the build started from
    reason: str | None = None  # why an entry that was there was not used
    merged: bool | None = None  # None: nothing to merge (the build wrote nothing new)
    merge_reason: str | None = None
    after: int | None = None  # entries in the entry after the merge
    tier: Any = None  # what the shared tier did (:class:`.timing_tier.TierSaid`), with one

    def line(self) -> str:
        """``timing cache: warm, 1,234 entries`` or ``timing cache: cold``."""
        text = f"timing cache: warm, {self.entries:,} entries" if self.warm else \
            "timing cache: cold"
        if self.reason:
            text += f" ({self.reason})"
        tier = self.tier
        if tier is not None and tier.downloaded:
            text += f", {tier.downloaded:,} bytes from the shared cache"
        if tier is not None and tier.fetched_reason:
            text += f" ({tier.fetched_reason})"
        if self.merged is False:
            text += f"; not merged: {self.merge_reason}"
        if tier is not None and tier.published is False:
            text += f"; not published: {tier.publish_reason}"
        return text


def _count(data: bytes) -> int:
    return count_entries(data) if data else 0


def _combined(current: bytes | None, learned: bytes) -> tuple[bytes, dict[str, Any]]:
    """The seam's merge of the entry as it is now with what a build learned (or fetched)."""
    out = learned if current is None else combine(current, learned, ignore_mismatch=False)
    return out, {"entries": _count(out)}


def _metadata(facts: dict[str, Any]) -> dict[str, Any]:
    """A timing entry's metadata: its kind, the facts it is keyed by, what ``cache list`` shows."""
    return {"kind": TIMING_KIND, "timing": facts,
            "compute_capability": facts["compute_capability"],
            "versions": [n.split(" ", 1) for n in facts["tensorrt"]]}


def build_warm(cache: CacheLevels, build: Callable[..., BuildResult],
               settings: Mapping[str, Any] | None) -> tuple[BuildResult, TimingSaid | None]:
    """``build()`` started from this key's timing cache, what it learned merged back.

    ``build`` takes ``timing_cache_path=`` (the private copy). Without
    settings, with the caller's own ``timing_cache_path``, or when the cache
    cannot make the copy (read-only), the build runs as it was (None said).
    A merge problem never fails the export (said in the line, logged).
    """
    if settings is None or settings.get("timing_cache_path") is not None:
        return build(), None
    blobs = cache.blobs
    facts = timing_facts(settings)
    key = timing_key(facts)

    def check(meta: dict[str, Any]) -> str | None:
        return entry_problem(meta, facts)

    tier = None
    if cache.remote is not None:  # the team's entry first, when it changed since taken in
        from trtet_store.export import timing_tier

        tier = timing_tier.TierSaid()
        timing_tier.pull(cache, key, check, _combined, _metadata(facts),
                         limit=MAX_TIMING_BYTES, said=tier)
    try:
        copied = copy_out(blobs, key, check, limit=MAX_TIMING_BYTES)
    except OSError as exc:
        log.warning("engine cache %s: no timing cache for this build (%s); building without",
                    cache.directory, exc)
        return build(), None
    with copied:
        entries = 0
        reason = copied.reason
        if copied.warm:
            try:
                with open(copied.path, "rb") as f:
                    entries = _count(f.read())
            except (OSError, ValueError, RuntimeError) as exc:
                reason = f"unreadable ({exc})"
                os.ftruncate(copied.fd, 0)
                copied.warm = False
        said = TimingSaid(key, copied.warm, entries, reason, tier=tier)
        log.info("engine cache %s: %s", cache.directory, said.line())
        built = build(timing_cache_path=os.fspath(copied.path))
        _merge(cache, said, copied, facts)
    if tier is not None and said.merged:  # what this build learned, to the team
        from trtet_store.export import timing_tier

        timing_tier.push(cache, key, check, lambda theirs, mine: combine(
            theirs, mine, ignore_mismatch=False), _combined,
            lambda out: {**_metadata(facts), "entries": _count(out)},
            limit=MAX_TIMING_BYTES, said=tier)
    if said.merged is False:
        log.warning("engine cache %s: the timing cache %s was not merged: %s",
                    cache.directory, key, said.merge_reason)
    return built, said


def _merge(cache: CacheLevels, said: TimingSaid, copied: Any, facts: dict[str, Any]) -> None:
    """Merge the build's timing cache into the entry (under its single flight); never raises
    for a cache problem."""
    try:
        st = os.fstat(copied.fd)
        if st.st_size == 0:
            return  # the build timed nothing (reused, or a builder that keeps no cache)
        with open(copied.path, "rb") as f:
            if copied.warm and xxhash.xxh3_128_hexdigest(f.read()) == copied.digest:
                return  # nothing learned
    except OSError as exc:
        said.merged, said.merge_reason = False, f"the build's timing cache is gone ({exc})"
        return

    try:
        done = merge_in(cache.blobs, said.key, copied.path, _combined,
                        lambda m: entry_problem(m, facts), _metadata(facts),
                        limit=MAX_TIMING_BYTES)
    except (OSError, ValueError, RuntimeError) as exc:
        said.merged, said.merge_reason = False, f"{type(exc).__name__}: {exc}"
        return
    said.merged, said.merge_reason = done.merged, done.reason
    if done.merged:
        said.after = done.metadata.get("entries")
        if done.replaced:
            log.warning("engine cache %s: the timing cache %s was replaced, not merged: %s",
                        cache.directory, said.key, done.replaced)
        log.info("engine cache %s: timing cache %s merged: %s entries", cache.directory,
                 said.key, said.after)
