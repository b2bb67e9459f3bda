"""What the installed ExecuTorch can do, as skip marks (the suite runs on 1.4.1 and 1.5.1).

Each mark names what is missing; ``make test-all`` runs both versions, so a test
skipped on one runs on the other.
"""

from __future__ import annotations

import inspect

import pytest

from trtet_store.export import _executorch_private as priv


def _runtime_loads_ptd() -> bool:
    from executorch.runtime import Runtime

    return "data_path" in inspect.signature(Runtime.load_program).parameters


#: File-backed named data (``FileBackedData``, ``NamedDataStore`` of files) came in 1.5.
needs_file_backed_data = pytest.mark.skipif(
    not priv.has_file_backed_data(),
    reason=f"executorch {priv.executorch_version()} has no FileBackedData (1.5+)")

#: ``Runtime.load_program(..., data_path=)``: loading a ``.ptd`` beside a ``.pte``.
needs_ptd_runtime = pytest.mark.skipif(
    not _runtime_loads_ptd(),
    reason=f"executorch {priv.executorch_version()}'s runtime loads no .ptd (data_path)")
