"""Lowered once: the small test programs of tests/programs.py, lowered once per test run.

``xnnpack_linear_program(**kw)`` and ``portable_linear_program(**kw)`` here are
tests/programs.py's, cached by the builder, its keywords and the ExecuTorch version:
the first call lowers, every call returns a deep copy (a test may consume, write or
mutate its program; the next one gets an untouched one), and torch's global random
state is left as the lowering left it. ``programs.named_data_program`` is not cached
(its entries are a test's own files). test_export.py keeps uncached lowerings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import programs

_lowered: dict[tuple, tuple[Any, Any]] = {}


def _version() -> str:
    try:
        from executorch import version

        return str(version.__version__)
    except ImportError:  # pragma: no cover - an install without its version module
        from importlib.metadata import version as dist_version

        return dist_version("executorch")


def lowered(builder: Callable[..., Any], **kw: Any) -> Any:
    """``builder(**kw)``'s program, lowered at most once per run; a fresh deep copy each call."""
    import torch

    key = (builder.__name__, tuple(sorted(kw.items())), _version())
    if key not in _lowered:
        built = builder(**kw)
        _lowered[key] = (built, torch.get_rng_state())
    built, rng = _lowered[key]
    torch.set_rng_state(rng)  # what the lowering's seeding left, as a fresh call would
    return copy.deepcopy(built)


def xnnpack_linear_program(**kw: Any) -> Any:
    """:func:`programs.xnnpack_linear_program`, lowered once (a copy each call)."""
    return lowered(programs.xnnpack_linear_program, **kw)


def portable_linear_program(**kw: Any) -> Any:
    """:func:`programs.portable_linear_program`, lowered once (a copy each call)."""
    return lowered(programs.portable_linear_program, **kw)
