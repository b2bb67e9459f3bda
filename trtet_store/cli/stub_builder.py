"""``TRTET_STUB_TENSORRT=1``: compile-and-save with the stub TensorRT builder, a test aid.

With the variable set to ``1``, ``trtet-store compile-and-save`` builds its
engines with :mod:`trtet_store.testing.stub_tensorrt` (pseudo-random engine
bytes, no GPU, no TensorRT) and refits them with its stub refitter
instead of TensorRT, and says so on stderr:
everything after the build (staging, the engine cache and its shared tier,
single flight, saving, publishing) runs for real, so the README's cache
walk-through can be tried from a shell. The programs it writes hold no
runnable engine. Unset (or ``0``) it changes nothing; any other value, a
backend that builds no engines, or a stub that cannot be imported is refused
in one line before anything is built.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

__all__ = ["ENV", "StubBuilderError", "stub_builder"]

#: The environment variable that asks for the stub builder.
ENV = "TRTET_STUB_TENSORRT"


class StubBuilderError(RuntimeError):
    """``TRTET_STUB_TENSORRT`` asked for what cannot be given (a wrong value or backend)."""


def stub_builder(backend: str) -> contextlib.AbstractContextManager[Any] | None:
    """The stub builder installed for the duration, when :data:`ENV` asks for it; else None.

    Parameters
    ----------
    backend : str
        compile-and-save's ``--backend``.

    Raises
    ------
    StubBuilderError
        :data:`ENV` is neither unset, ``0`` nor ``1``; the backend is not
        ``tensorrt``; or the stub (:mod:`trtet_store.testing.stub_tensorrt`,
        which needs torch and xxhash) cannot be imported.
    """
    value = os.environ.get(ENV, "")
    if value in ("", "0"):
        return None
    if value != "1":
        raise StubBuilderError(f"{ENV}={value!r}: set it to 1 to build engines with the stub "
                               "TensorRT builder (a test aid), or unset it")
    if backend != "tensorrt":
        raise StubBuilderError(f"{ENV}=1 stands in for the TensorRT build, and --backend "
                               f"{backend} builds no engines: unset {ENV}")
    try:
        from trtet_store.testing import stub_tensorrt
    except ImportError as exc:
        raise StubBuilderError(f"{ENV}=1 needs the stub builder, trtet_store.testing."
                               f"stub_tensorrt, and its requirements (torch, xxhash): {exc}; "
                               f"install them or unset {ENV}") from None
    # The stub refitter too: `--refittable` engines are refit (not rebuilt) on a weights-only
    # change, as with TensorRT.
    return stub_tensorrt.installed(stub_tensorrt.FakeBuilder(),
                                   refitter=stub_tensorrt.FakeRefitter())
