"""Torch-TensorRT's released ExecuTorch parts, read from their wheels, to test against.

torch-tensorrt cannot be imported here (its TensorRT libraries are not
installable and there is no GPU), but what our programs must satisfy is pure
Python in its wheel: ``torch_tensorrt/executorch/serialization.py`` holds the
delegate blob's ``serialize_engine``/``deserialize_engine``, the same layout its
C++ runtime parses. The wheels are fetched once with ``pip download --no-deps``
into ``.cache/wheels`` (or ``$TRTET_WHEEL_CACHE``), and the module is loaded
from the wheel by file path, as the released code, unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import zipfile
from email.parser import Parser
from pathlib import Path

#: The releases users have: Torch-TensorRT with its ExecuTorch backend, and the
#: only released ExecuTorch runtime with a TensorRT delegate.
RELEASES = {"torch-tensorrt": "2.14.0", "torch-tensorrt-executorch-runtime": "0.1.0"}
SERIALIZATION = "torch_tensorrt/executorch/serialization.py"

CACHE = Path(os.environ.get("TRTET_WHEEL_CACHE",
                            Path(__file__).resolve().parent.parent / ".cache" / "wheels"))


class WheelUnavailable(RuntimeError):
    """The wheel could not be fetched."""


def wheel(name: str) -> Path:
    """The cached wheel of ``name`` at its release in :data:`RELEASES`, fetched if missing."""
    version = RELEASES[name]
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(CACHE.glob(f"{stem}*.whl"))
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
               "--disable-pip-version-check", "-d", os.fspath(CACHE), f"{name}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        found = sorted(CACHE.glob(f"{stem}*.whl"))
        if done.returncode or not found:
            raise WheelUnavailable(f"pip download {name}=={version} failed: "
                                   f"{done.stderr.strip()[-500:]}")
    return found[-1]


def serialization_module() -> types.ModuleType:
    """torch-tensorrt 2.14.0's ``torch_tensorrt.executorch.serialization``, from its wheel."""
    path = wheel("torch-tensorrt")
    source = zipfile.ZipFile(path).read(SERIALIZATION)
    module = types.ModuleType("torch_tensorrt_2_14_serialization")
    module.__file__ = f"{path}!/{SERIALIZATION}"
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - released code
    return module


def requires_dist(name: str) -> list[str]:
    """The ``Requires-Dist`` lines of the wheel's metadata."""
    with zipfile.ZipFile(wheel(name)) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(zf.read(meta).decode())
    return message.get_all("Requires-Dist") or []
