"""Our package installs beside the Torch-TensorRT releases users have.

The ranges are read from the released wheels' own metadata (``upstream.py``
fetches them), so a tightened pin on their side fails here, not on a user's
machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import upstream
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def our_extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs]
            for name, reqs in project["optional-dependencies"].items()}


def their_requirements(name: str) -> list[Requirement]:
    try:
        lines = upstream.requires_dist(name)
    except upstream.WheelUnavailable as exc:
        from filesystems import unavailable

        unavailable(str(exc))
    return [Requirement(line) for line in lines]


def allowed(reqs: list[Requirement], package: str, extras: tuple[str, ...] = ()) -> list:
    """The specifiers ``reqs`` put on ``package`` (markers evaluated with ``extras``)."""
    out = []
    for r in reqs:
        if r.name != package:
            continue
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
            out.append(r.specifier)
    return out


#: The executorch releases that exist and matter here.
EXECUTORCH_RELEASES = [Version(v) for v in ("1.4.1", "1.5.0", "1.5.1")]


def test_executorch_ranges_meet_torch_tensorrt_and_its_runtime():
    theirs = (allowed(their_requirements("torch-tensorrt"), "executorch", ("executorch",))
              + allowed(their_requirements("torch-tensorrt-executorch-runtime"), "executorch"))
    assert len(theirs) == 2, theirs  # the extra's range and the runtime's pin
    for extra, reqs in our_extras().items():
        ours = allowed(reqs, "executorch")
        if not ours:
            continue
        common = [v for v in EXECUTORCH_RELEASES
                  if all(v in spec for spec in ours + theirs)]
        assert common, f"[{extra}] {ours} admits no executorch that {theirs} admits"
        assert Version("1.5.1") in ours[0], f"[{extra}] must still admit 1.5.1"


def test_torch_tensorrt_extra_admits_the_release_with_a_runtime():
    (ours,) = allowed(our_extras()["tensorrt"], "torch-tensorrt")
    (runtime_needs,) = allowed(their_requirements("torch-tensorrt-executorch-runtime"),
                               "torch-tensorrt")
    assert Version(upstream.RELEASES["torch-tensorrt"]) in ours
    assert Version(upstream.RELEASES["torch-tensorrt"]) in runtime_needs


@pytest.mark.parametrize("package", ["torch"])
def test_no_extra_pins_what_torch_tensorrt_pins(package):
    """We leave torch to them: an extra that named it could only conflict."""
    for extra, reqs in our_extras().items():
        assert not allowed(reqs, package), f"[{extra}] pins {package}"
