"""Torch-TensorRT 2.14.0's own engine cache, loaded from its wheel with only its imports stubbed.

torch-tensorrt cannot be imported here (no TensorRT, no GPU), but its engine
cache, ``torch_tensorrt/dynamo/_engine_cache.py`` (``BaseEngineCache`` with
``pack``/``unpack``/``insert``/``check``, and ``DiskEngineCache``), is pure
Python. :func:`load` reads that file from the wheel and runs it unchanged; its
four imports are served from here, scoped to that module (``sys.modules`` is
not touched, so nothing else can mistake the stubs for torch-tensorrt):

- ``torch``: only ``torch.fx.GraphModule``/``Graph`` are named (annotations);
- ``torch._inductor.codecache.sha256_hash``: hashlib's sha256;
- ``torch_tensorrt._Input.Input`` and ``torch_tensorrt.dynamo._settings``
  (``CompilationSettings``, ``_SETTINGS_TO_BE_ENGINE_INVARIANT``): the small
  classes below, defined in this module so that their pickles (a packed entry
  holds both) load in any process.

:func:`as_torch_tensorrt` puts a loaded module at its real name
(``torch_tensorrt.dynamo._engine_cache``) for the length of a ``with`` block,
so code that imports it lazily (our adapter) finds it. Used by
``tests/test_engine_cache_upstream.py`` and ``benchmarks/engine_cache.py``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import os
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The wheel's file, and the module name it has in torch-tensorrt.
ENGINE_CACHE = "torch_tensorrt/dynamo/_engine_cache.py"
MODULE = "torch_tensorrt.dynamo._engine_cache"

#: Where tests/upstream.py keeps the wheels it fetched (``$TRTET_WHEEL_CACHE`` wins).
WHEEL_CACHE = Path(os.environ.get(
    "TRTET_WHEEL_CACHE", Path(__file__).resolve().parents[2] / ".cache" / "wheels"))


@dataclasses.dataclass(frozen=True)
class Input:
    """Stands in for ``torch_tensorrt.Input``: what a packed entry's ``input_specs`` holds."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __str__(self) -> str:  # get_hash hashes str(Input)
        return f"Input(shape={self.shape}, dtype={self.dtype})"


@dataclasses.dataclass
class CompilationSettings:
    """Stands in for ``torch_tensorrt.dynamo.CompilationSettings`` (a few of its fields)."""

    enabled_precisions: frozenset = frozenset({"float32"})
    workspace_size: int = 0
    optimization_level: int | None = None
    strip_engine_weights: bool = False
    immutable_weights: bool = True


#: As upstream's ``_settings.py``: the settings an engine depends on (a subset).
SETTINGS_TO_BE_ENGINE_INVARIANT = ("enabled_precisions", "workspace_size",
                                   "optimization_level", "strip_engine_weights",
                                   "immutable_weights")


def _stub_modules() -> dict[str, Any]:
    """The modules the wheel's file imports, as its ``import`` statements will see them."""
    fx = types.SimpleNamespace(GraphModule=type("GraphModule", (), {}),
                               Graph=type("Graph", (), {}))
    torch = types.SimpleNamespace(fx=fx)
    codecache = types.SimpleNamespace(
        sha256_hash=lambda data: hashlib.sha256(data).hexdigest())
    inductor = types.SimpleNamespace(codecache=codecache)
    torch._inductor = inductor
    input_mod = types.SimpleNamespace(Input=Input)
    settings = types.SimpleNamespace(
        CompilationSettings=CompilationSettings,
        _SETTINGS_TO_BE_ENGINE_INVARIANT=frozenset(SETTINGS_TO_BE_ENGINE_INVARIANT))
    tt = types.SimpleNamespace(_Input=input_mod,
                               dynamo=types.SimpleNamespace(_settings=settings))
    return {"torch": torch, "torch._inductor.codecache": codecache,
            "torch_tensorrt._Input": input_mod, "torch_tensorrt.dynamo._settings": settings,
            "torch_tensorrt": tt}


def find_wheel(wheel: os.PathLike | str | None = None) -> Path:
    """``wheel``, else the torch-tensorrt 2.14.0 wheel in :data:`WHEEL_CACHE`.

    Raises FileNotFoundError saying how to fetch it (``tests/upstream.py``
    does, or ``pip download --no-deps torch-tensorrt==2.14.0``).
    """
    if wheel is not None:
        return Path(wheel)
    found = sorted(WHEEL_CACHE.glob("torch_tensorrt-2.14.0-*.whl"))
    if not found:
        raise FileNotFoundError(
            f"no torch_tensorrt-2.14.0 wheel in {WHEEL_CACHE}: run `pip download --no-deps -d "
            f"{WHEEL_CACHE} torch-tensorrt==2.14.0` (or any test using tests/upstream.py)")
    return found[-1]


def load(wheel: os.PathLike | str | None = None) -> types.ModuleType:
    """The wheel's ``_engine_cache.py`` as a module, its code unchanged, its imports stubbed."""
    path = find_wheel(wheel)
    with zipfile.ZipFile(path) as zf:
        source = zf.read(ENGINE_CACHE)
    stubs = _stub_modules()
    real_import = builtins.__import__

    def scoped_import(name: str, globals: Any = None, locals: Any = None,
                      fromlist: Any = (), level: int = 0) -> Any:
        # ``import torch`` -> the top stub; ``from a.b import c`` -> the a.b stub.
        if level == 0 and name in stubs:
            return stubs[name] if fromlist else stubs[name.split(".")[0]]
        return real_import(name, globals, locals, fromlist, level)

    module = types.ModuleType(MODULE)
    module.__file__ = f"{path}!/{ENGINE_CACHE}"
    module.__dict__["__builtins__"] = dict(vars(builtins), __import__=scoped_import)
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - released code
    return module


@contextlib.contextmanager
def as_torch_tensorrt(module: types.ModuleType) -> Iterator[types.ModuleType]:
    """Make ``import torch_tensorrt.dynamo._engine_cache`` give ``module`` inside the block.

    Only names not already there are added (a real torch-tensorrt is never
    shadowed), and they are removed on leaving.
    """
    added = []
    packages = {"torch_tensorrt": types.ModuleType("torch_tensorrt"),
                "torch_tensorrt.dynamo": types.ModuleType("torch_tensorrt.dynamo")}
    for name, mod in ((*packages.items(), (MODULE, module))):
        if name not in sys.modules:
            if name != MODULE:
                mod.__path__ = []  # a package, so its submodules resolve
            sys.modules[name] = mod
            added.append(name)
    if "torch_tensorrt.dynamo" in added:
        packages["torch_tensorrt.dynamo"]._engine_cache = module
    if "torch_tensorrt" in added:
        packages["torch_tensorrt"].dynamo = sys.modules["torch_tensorrt.dynamo"]
    try:
        yield module
    finally:
        for name in reversed(added):
            sys.modules.pop(name, None)
