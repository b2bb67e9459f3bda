"""What ``trtet-store compile-and-save`` names on its command line, made into API arguments.

``MODULE.py:FACTORY`` (a file path, or a dotted module name) is imported and
called for ``(module, inputs)``; ``--method NAME=MODULE.py:FACTORY`` makes a
method mapping of exported programs; ``--backend-config KEY=VALUE`` makes an
``ExecutorchBackendConfig``. torch and ExecuTorch are imported only here,
inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def load_factory(target: str) -> Callable[[], Any]:
    """Import ``MODULE.py:FACTORY`` (a file path, or a dotted module name) and return FACTORY."""
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise ValueError(f"expected MODULE.py:FACTORY, got {target!r}")
    path = Path(module_part)
    if module_part.endswith(".py") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {module_part}")
        name = f"_trtet_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, os.fspath(path.parent.absolute()))
        try:
            spec.loader.exec_module(module)
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(os.fspath(path.parent.absolute()))
        factory = getattr(module, attr, None)
    else:
        # A dotted module name: the stdlib's own `module:attr` resolver (nested attributes too).
        try:
            factory = pkgutil.resolve_name(target)
        except AttributeError:
            factory = None
    if factory is None:
        raise AttributeError(f"{module_part} has no attribute {attr!r}")
    if not callable(factory):
        raise TypeError(f"{target} is not callable")
    return factory


def module_and_inputs(made: Any) -> tuple[Any, tuple]:
    if isinstance(made, dict):
        return made["module"], _inputs_tuple(made.get("inputs", ()))
    if isinstance(made, (tuple, list)) and len(made) == 2:
        return made[0], _inputs_tuple(made[1])
    inputs = getattr(made, "example_inputs", None)
    if inputs is None:
        raise TypeError(
            "FACTORY() must return (module, inputs), {'module': ..., 'inputs': ...}, or a "
            "module with an 'example_inputs' attribute"
        )
    return made, _inputs_tuple(inputs)


def _inputs_tuple(inputs: Any) -> tuple:
    """FACTORY()'s inputs as a tuple; a bare tensor is refused (``tuple(x)`` would split it)."""
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f"FACTORY()'s inputs must be a tuple of the positional example "
                        f"inputs, got a {type(inputs).__name__}: for one input return a "
                        "tuple of one, (module, (x,)) not (module, x)")
    return tuple(inputs)


def compile_source(paths: Sequence[str], methods_given: Sequence[str] | None, *,
                   out_optional: bool = False) -> tuple[Any, tuple | None, Path | None]:
    """``(source, inputs, OUT)`` for compile_and_save: one module, or a method mapping.

    ``paths`` are the command's ``[MODULE.py:FACTORY] OUT``; ``methods_given`` its
    ``--method NAME=MODULE.py:FACTORY`` values. With ``out_optional``
    (``--publish``), OUT may be left out; then it is None.
    """
    if len(paths) > 2:
        raise ValueError(f"expected [MODULE.py:FACTORY] OUT, got {len(paths)} paths")
    if out_optional and len(paths) == (0 if methods_given else 1):
        out, target = None, (paths[0] if paths else None)  # no OUT: a path is the factory
    elif not paths:
        raise ValueError("expected [MODULE.py:FACTORY] OUT, got no OUT")
    else:
        out = Path(paths[-1])
        target = paths[0] if len(paths) == 2 else None
    if (target is None) == (not methods_given):
        raise ValueError("give either MODULE.py:FACTORY or --method NAME=MODULE.py:FACTORY")
    if target is not None:
        return (*made_by(target), out)
    import torch

    methods: dict[str, Any] = {}
    for spec in methods_given:
        name, sep, where = spec.partition("=")
        if not sep or not name or not where:
            raise ValueError(f"--method wants NAME=MODULE.py:FACTORY, got {spec!r}")
        if name in methods:
            raise ValueError(f"--method {name!r} given twice")
        module, inputs = made_by(where)
        methods[name] = torch.export.export(module, inputs, strict=False)
    return methods, None, out


def made_by(target: str) -> tuple[Any, tuple]:
    """``(module, inputs)`` from ``MODULE.py:FACTORY``; an error names the target."""
    try:
        return module_and_inputs(load_factory(target)())
    except Exception as exc:
        raise ValueError(f"{target}: {type(exc).__name__}: {exc}") from exc


def backend_config(pairs: Sequence[str]) -> Any:
    """An ExecutorchBackendConfig from ``KEY=VALUE`` strings (ints, true/false, strings)."""
    if not pairs:
        return None
    import dataclasses

    from executorch.exir import ExecutorchBackendConfig

    fields = {f.name for f in dataclasses.fields(ExecutorchBackendConfig)}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--backend-config {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{sorted(fields)}")
        low = text.lower()
        values[key] = (True if low == "true" else False if low == "false"
                       else int(text) if text.lstrip("-").isdigit() else text)
    return ExecutorchBackendConfig(**values)
