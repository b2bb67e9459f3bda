"""Shared fixtures: real filesystems, the long-run switch, Hypothesis profiles.

Fixtures:
    make_fs(fstype, size_mib, *, mount_options=None, mkfs_options=None) -> Path
        Function-scoped factory: a fresh loop-mounted ext4/xfs/btrfs image or a
        tmpfs, unmounted and deleted when the test ends.
    here_fs -> Path
        A fresh empty directory on the root disk's filesystem.
    fs_factory -> FilesystemFactory
        The session's factory, for tests that need its helpers directly.
    long_run -> bool
        True under ``TRTET_LONG=1`` (``make test-long``).

Tests marked ``slow`` are skipped unless ``TRTET_LONG=1``; tests using
``make_fs`` are marked ``root`` automatically.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filesystems import FilesystemFactory, FilesystemUnavailable, unavailable

LONG = os.environ.get("TRTET_LONG", "").strip().lower() in ("1", "true", "yes")

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is in requirements-dev.txt
    pass
else:
    # Real-filesystem examples take milliseconds to seconds, so per-example
    # deadlines would only produce flaky failures.
    settings.register_profile(
        "trtet",
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "trtet-long",
        parent=settings.get_profile("trtet"),
        max_examples=2000,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "trtet-long" if LONG else "trtet"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow = pytest.mark.skip(reason="long variant: set TRTET_LONG=1 (make test-long)")
    for item in items:
        if not LONG and item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)
        if "make_fs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.root)


@pytest.fixture(scope="session")
def long_run() -> bool:
    """Whether long variants were asked for (``TRTET_LONG=1``)."""
    return LONG


@pytest.fixture(scope="session")
def fs_factory() -> Iterator[FilesystemFactory]:
    """The session's filesystem factory; checks at the end that nothing is left mounted."""
    factory = FilesystemFactory()
    yield factory
    problems = factory.close()
    if problems:
        pytest.fail("filesystem teardown left things behind: " + "; ".join(problems))


@pytest.fixture
def make_fs(fs_factory: FilesystemFactory) -> Iterator[Callable[..., Path]]:
    """Factory for real filesystems, all released when the test ends.

    Call as ``make_fs(fstype, size_mib, *, mount_options=None, mkfs_options=None)``
    with fstype one of ``ext4``, ``xfs`` (at least 300 MiB), ``btrfs`` (at
    least 114 MiB) or ``tmpfs``; it returns the mount point. Skips the test
    when the filesystem cannot be made here, or fails it under ``CI=true``.
    """
    made: list[Path] = []

    def _make(
        fstype: str,
        size_mib: int,
        *,
        mount_options: list[str] | str | None = None,
        mkfs_options: list[str] | None = None,
    ) -> Path:
        try:
            mountpoint = fs_factory.make(
                fstype, size_mib, mount_options=mount_options, mkfs_options=mkfs_options
            )
        except FilesystemUnavailable as err:
            unavailable(str(err))
        made.append(mountpoint)
        return mountpoint

    yield _make
    problems: list[str] = []
    for mountpoint in reversed(made):
        problems += fs_factory.release(mountpoint)
    if problems:
        pytest.fail("filesystem teardown: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def here_fs(fs_factory: FilesystemFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh empty directory on the root disk (the session directory's filesystem).

    Unlike ``tmp_path`` this is never on a tmpfs, whatever /tmp is here.
    Removed when the test ends.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]
    here = fs_factory.base / "here"
    here.mkdir(exist_ok=True)
    path = here / name
    n = 0
    while path.exists():
        n += 1
        path = here / f"{name}-{n}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def upstream_trt():
    """torch-tensorrt 2.14.0's delegate-blob module, loaded from its wheel (see upstream.py).

    Skips where the wheel cannot be fetched, or fails under ``CI=true``.
    """
    import upstream

    try:
        return upstream.serialization_module()
    except upstream.WheelUnavailable as exc:
        unavailable(str(exc))
