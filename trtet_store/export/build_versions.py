"""The installed versions a TensorRT build depends on, found without importing torch.

Moved out of :mod:`trtet_store.export.engine_reuse` (which imports torch, and still
exports these names) so that ``trtet-store cache pull`` can check a shared entry's
versions against this machine's without torch.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys

#: Distributions whose version changes what a build makes: torch, Torch-TensorRT,
#: and every TensorRT wheel, whatever its CUDA flavour (``tensorrt``,
#: ``tensorrt-cu12``, ``tensorrt-cu13``, ``tensorrt-cu12-libs``,
#: ``tensorrt-cu13-bindings``, ...): names as PEP 503 normalizes them.
VERSIONED_DISTRIBUTIONS = re.compile(r"^(torch|torch-tensorrt|tensorrt(-[a-z0-9-]+)?)$")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


#: (the import path and each entry's mtime, its versions): what build_versions last found.
_versions_seen: tuple[tuple[tuple[str, int | None], ...], list[tuple[str, str]]] | None = None


def _import_path_state() -> tuple[tuple[str, int | None], ...]:
    """``sys.path`` and each directory's mtime: an install or an upgrade changes one of them
    (a ``*.dist-info`` directory added or removed)."""
    out = []
    for entry in sys.path:
        try:
            out.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            out.append((entry, None))
    return tuple(out)


def build_versions() -> list[tuple[str, str]]:
    """``(name, version)`` of every installed distribution a build depends on, sorted.

    Found by pattern (:data:`VERSIONED_DISTRIBUTIONS`) among everything
    ``importlib.metadata`` sees, so an install with ``tensorrt-cu12`` or only
    the ``*-libs`` wheels is fingerprinted by its real TensorRT version.
    Reading every distribution's metadata costs 0.1 s (a hit's export asks
    two or three times): the answer is kept while ``sys.path`` and its
    directories' mtimes stay as they were.
    """
    global _versions_seen
    state = _import_path_state()
    seen = _versions_seen
    if seen is not None and seen[0] == state:
        return list(seen[1])
    found = set()
    for dist in importlib.metadata.distributions():
        name = _normalized(dist.metadata.get("Name") or "")
        if VERSIONED_DISTRIBUTIONS.match(name):
            found.add((name, dist.version))
    _versions_seen = (state, sorted(found))
    return sorted(found)
