"""Which member of a set this machine runs: its GPU's compute capability and its TensorRT.

A member's metadata says what its engines need (``compute_capability``
``"8.9"``, ``tensorrt`` ``"10.3.0"``), and how far they stretch:
``version_compatible`` (TensorRT's ``VERSION_COMPATIBLE``: runs on this
TensorRT version or a later one) and ``hardware_compatibility``
(``"ampere_plus"``: TensorRT's ``HardwareCompatibilityLevel.AMPERE_PLUS``,
any GPU of compute capability 8.0 or more). A member that names no compute
capability has no GPU engine (a CPU/XNNPACK program) and runs anywhere.

The pick prefers the most specific fit: an exact compute capability, then a
hardware-compatibility level that covers the GPU, then a member with no GPU
need. Two members at the best level, or none at all, are refused
(:class:`NoMemberFitsError`), listing every member with what it needs.

The facts about "this machine" are a :class:`Machine`, injectable:
:meth:`Machine.detect` asks ``nvidia-smi`` and the installed ``tensorrt``
package's version, never importing torch or TensorRT.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtet_store.remote.errors import RemoteError

#: HardwareCompatibilityLevel names -> the smallest compute capability they cover.
HARDWARE_LEVELS = {"ampere_plus": (8, 0)}


class NoMemberFitsError(RemoteError):
    """No member of the set (or more than one, equally) fits this machine.

    Attributes
    ----------
    members : dict
        Every member's name -> what it needs (its metadata).
    machine : Machine
        The facts the pick was made on.
    """

    def __init__(self, message: str, members: dict[str, dict[str, Any]],
                 machine: Machine) -> None:
        super().__init__(message)
        self.members = members
        self.machine = machine


@dataclass(frozen=True)
class Machine:
    """What a machine offers: its GPU's compute capability (``"8.9"``) and TensorRT version.

    ``None`` where it has none (no GPU, no TensorRT).
    """

    compute_capability: str | None = None
    tensorrt: str | None = None

    def __post_init__(self) -> None:
        if self.compute_capability is not None:
            _cc(self.compute_capability, "Machine.compute_capability")
        if self.tensorrt is not None:
            _version(self.tensorrt, "Machine.tensorrt")

    @classmethod
    def detect(cls) -> Machine:
        """This machine: the first GPU's compute capability (``nvidia-smi``) and the
        installed ``tensorrt`` package's version; None for what it cannot find."""
        cc = None
        smi = shutil.which("nvidia-smi")
        if smi is not None:
            try:
                out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10, check=True)
                first = out.stdout.strip().splitlines()[0].strip() if out.stdout.strip() else ""
                cc = first if re.fullmatch(r"\d+\.\d+", first) else None
            except (OSError, subprocess.SubprocessError):
                cc = None
        trt = None
        from importlib import metadata

        for dist in ("tensorrt", "tensorrt-cu12", "tensorrt_cu12"):
            try:
                trt = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        return cls(cc, trt)

    def describe(self) -> str:
        return (f"compute capability {self.compute_capability or 'none (no GPU)'}, "
                f"TensorRT {self.tensorrt or 'none'}")


def _cc(text: Any, what: str) -> tuple[int, int]:
    if not isinstance(text, str) or not re.fullmatch(r"\d+\.\d+", text):
        raise ValueError(f"{what} must be like '8.9', not {text!r}")
    major, minor = text.split(".")
    return int(major), int(minor)


def _version(text: Any, what: str) -> tuple[int, ...]:
    if not isinstance(text, str) or not re.fullmatch(r"\d+(\.\d+)*([.+-].*)?", text):
        raise ValueError(f"{what} must be a version like '10.3.0', not {text!r}")
    return tuple(int(p) for p in re.match(r"\d+(\.\d+)*", text).group(0).split("."))


def check_metadata(metadata: Mapping[str, Any], member: str) -> None:
    """Refuse metadata the pick could not read (before anything is sent)."""
    where = f"member {member!r}"
    if metadata.get("compute_capability") is not None:
        _cc(metadata["compute_capability"], f"{where}: compute_capability")
    for key in ("tensorrt", "executorch"):
        if metadata.get(key) is not None:
            _version(metadata[key], f"{where}: {key}")
    if not isinstance(metadata.get("version_compatible", False), bool):
        raise TypeError(f"{where}: version_compatible must be True or False")
    level = metadata.get("hardware_compatibility")
    if level is not None and level not in HARDWARE_LEVELS:
        raise ValueError(f"{where}: hardware_compatibility must be one of "
                         f"{sorted(HARDWARE_LEVELS)} or None, not {level!r}")


def needs(metadata: Mapping[str, Any]) -> str:
    """What a member needs, in words (for the refusal's list)."""
    cc = metadata.get("compute_capability")
    level = metadata.get("hardware_compatibility")
    trt = metadata.get("tensorrt")
    gpu = ("any machine (no GPU engine)" if cc is None else
           f"a GPU of compute capability >= {'.'.join(map(str, HARDWARE_LEVELS[level]))} "
           f"({level}, built on {cc})" if level else f"a GPU of compute capability {cc}")
    if trt is None:
        return gpu
    return gpu + (f", TensorRT {trt} or later (version-compatible)"
                  if metadata.get("version_compatible") else f", TensorRT {trt}")


def _trt_fits(metadata: Mapping[str, Any], machine: Machine) -> bool:
    want = metadata.get("tensorrt")
    if want is None:
        return True
    if machine.tensorrt is None:
        return False
    have, need = _version(machine.tensorrt, "tensorrt"), _version(want, "tensorrt")
    if metadata.get("version_compatible"):
        return have >= need
    # A plain engine runs only on the TensorRT version that built it (major.minor.patch).
    return have[:3] == need[:3]


def fit_level(metadata: Mapping[str, Any], machine: Machine) -> int | None:
    """How well a member fits: 3 exact GPU, 2 covered by its hardware level, 1 no GPU
    need; None when it cannot run here."""
    if not _trt_fits(metadata, machine):
        return None
    cc = metadata.get("compute_capability")
    if cc is None:
        return 1
    if machine.compute_capability is None:
        return None
    have = _cc(machine.compute_capability, "compute_capability")
    if have == _cc(cc, "compute_capability"):
        return 3
    level = metadata.get("hardware_compatibility")
    if level in HARDWARE_LEVELS and have >= HARDWARE_LEVELS[level]:
        return 2
    return None


def pick_member(members: Mapping[str, Mapping[str, Any]], machine: Machine,
                where: str) -> str:
    """The one member that fits ``machine`` best.

    Raises
    ------
    NoMemberFitsError
        None fits, or two fit equally well; the message lists every member
        and what it needs, and says to pass ``member=``.
    """
    levels = {name: fit_level(meta, machine) for name, meta in members.items()}
    best = max((lv for lv in levels.values() if lv is not None), default=None)
    chosen = sorted(n for n, lv in levels.items() if lv is not None and lv == best)
    if len(chosen) == 1:
        return chosen[0]
    listing = "; ".join(f"{n}: needs {needs(m)}" for n, m in sorted(members.items()))
    why = ("no member fits this machine" if not chosen else
           f"members {chosen} fit this machine equally well")
    raise NoMemberFitsError(f"{where}: {why} ({machine.describe()}). Members: {listing}. "
                            "Pass member=NAME (--member) to fetch one of them",
                            {n: dict(m) for n, m in members.items()}, machine)
