"""Real filesystems for tests: the pytest layer over :mod:`trtet_store.testing.loopfs`.

Loop-mounted ext4, XFS and btrfs images and tmpfs are made, released and
cleaned up by :mod:`trtet_store.testing.loopfs` (shared with the benchmark, which
ships in the package); the measurement helpers come from
:mod:`trtet_store.bench.measure`. This module re-exports what the tests use under
their usual names and adds the pytest policy: :func:`unavailable` turns a
missing prerequisite into a skip, or into a failure under CI.

It does not import pytest at module level (so benchmarks can use it too);
the fixtures in ``conftest.py`` turn :class:`FilesystemUnavailable` into a
skip or a failure through :func:`unavailable`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

# The repository root is on sys.path when pytest runs from it (`python -m
# pytest`); this keeps the module importable from elsewhere (benchmarks).
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from trtet_store.bench.measure import drop_caches, free_bytes, syncfs  # noqa: E402
from trtet_store.testing import loopfs  # noqa: E402
from trtet_store.testing.loopfs import (  # noqa: E402
    FSTYPES,
    MIN_SIZE_MIB,
    FilesystemUnavailable,
    MountedFs,
    _which,
    cleanup_stale_sessions,
    loop_devices_under,
    mounted_fstype,
    mounts_under,
)

__all__ = [
    "FSTYPES",
    "MIN_SIZE_MIB",
    "FilesystemFactory",
    "FilesystemUnavailable",
    "MountedFs",
    "cleanup_stale_sessions",
    "drop_caches",
    "free_bytes",
    "in_ci",
    "loop_devices_under",
    "mounted_fstype",
    "mounts_under",
    "syncfs",
    "unavailable",
]


def in_ci() -> bool:
    """Return True when running under CI (env ``CI`` is ``true``/``1``/``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the current test for ``reason``, or fail it under CI.

    CI must never pass by skipping the real-filesystem tests, so there a
    missing prerequisite is a failure.

    Args:
        reason: Why the filesystem is unavailable.
    """
    import pytest

    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


class FilesystemFactory(loopfs.FilesystemFactory):
    """:class:`trtet_store.testing.loopfs.FilesystemFactory`, with tools found through this module.

    Tests simulate a missing mkfs tool by replacing ``filesystems._which``;
    the factory looks tools up through that name at call time.
    """

    def _find_tool(self, tool: str) -> str | None:
        return _which(tool)
