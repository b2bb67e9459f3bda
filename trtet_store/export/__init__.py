"""The ExecuTorch and TensorRT adapters (they import torch and executorch, lazily here).

``trtet_store.export.export`` is :func:`trtet_store.export.lowering.export`, also
reachable as ``trtet_store.export_program`` (at the top level, ``export`` is this
subpackage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from trtet_store.export.lowering import export


def __getattr__(name: str) -> Any:
    if name == "export":
        from trtet_store.export.lowering import export

        return export
    raise AttributeError(f"module 'trtet_store.export' has no attribute {name!r}")


__all__ = ["export"]
