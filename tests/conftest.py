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
    random_budget -> int
        Random Hypothesis examples per configuration: 25 (profile ``trtet-ci``), 2,500
        under ``TRTET_LONG=1`` (``trtet-long``).
    s3_server / s3 / tcp_proxy
        A real S3 server (SeaweedFS, session), a fresh bucket on it per test,
        and a loopback fault proxy factory (trtet_store.testing.s3server, tests/tcp_proxy.py).
    proxy -> CountingProxy
        The counting proxy (trtet_store.testing.proxy) in front of ``s3``'s server.

Tests marked ``slow`` are skipped unless ``TRTET_LONG=1``; tests using
``make_fs`` are marked ``root`` automatically.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lanes
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
        max_examples=2500,
    )
    # The budget of the random (not derandomized) fuzz runs, per configuration: small on
    # every run (new examples each time), large under TRTET_LONG=1 (the ``random_budget``
    # fixture). The fixed, derandomized examples keep their own counts.
    settings.register_profile(
        "trtet-ci",
        parent=settings.get_profile("trtet"),
        max_examples=25,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "trtet-long" if LONG else "trtet"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow = pytest.mark.skip(reason="long variant: set TRTET_LONG=1 (make test-long)")
    for item in items:
        if not LONG and item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)
        if "make_fs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.root)


# --- lanes, the executorch marker and its guard, the time checks (tests/lanes.py) ------------


def pytest_addoption(parser: pytest.Parser) -> None:
    lanes.addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "executorch(reason): depends on the ExecuTorch version (given by "
        "tests/lanes.py at collection; runs in every lane)")
    config.addinivalue_line(
        "markers", "long_test: may take over TRTET_CREEP_SECONDS (60 s) of call time; "
        "still runs on every run")
    config.pluginmanager.register(lanes.LanesPlugin(config), "trtet-lanes")


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin("trtet-lanes")
    if plugin is not None:
        plugin.close()


@pytest.fixture(scope="session")
def long_run() -> bool:
    """Whether long variants were asked for (``TRTET_LONG=1``)."""
    return LONG


@pytest.fixture(scope="session")
def random_budget() -> int:
    """Random fuzz examples per configuration: the ``trtet-ci`` profile's, ``trtet-long``'s
    under ``TRTET_LONG=1``."""
    from hypothesis import settings as hypothesis_settings

    return hypothesis_settings.get_profile("trtet-long" if LONG else "trtet-ci").max_examples


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


# --- a real S3 server (SeaweedFS ``weed mini``; trtet_store.testing.s3server) ----------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """One ``weed mini`` for the session, every port free-picked, on 127.0.0.1.

    A server that cannot start FAILS the test (never skips): it is installed
    with requirements-dev.txt. Stopped by its own pid at the end; its sockets
    are removed.
    """
    import tempfile

    from trtet_store.testing.s3server import S3Server, S3ServerError

    # A short path: the server's Unix sockets live in it (108-byte limit).
    directory = Path(tempfile.mkdtemp(prefix="trtet-s3-", dir="/tmp"))
    server = None
    try:
        try:
            server = S3Server(directory)
            server.start()
        except (S3ServerError, OSError) as exc:
            pytest.fail(f"the S3 test server (weed mini) could not start: {exc}", pytrace=False)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_watch(s3_server: Any) -> Any:
    """The session server's health between tests (restarted once, then given up)."""
    from trtet_store.testing.s3server import ServerWatch

    return ServerWatch(s3_server)


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.stash[_CALL_FAILED] = True  # the s3 fixture then checks the server's write path


@pytest.fixture
def s3(s3_server: Any, s3_watch: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh bucket on the session's S3 server, for one test.

    Yields an object with ``endpoint`` (``.url``, ``.access_key``,
    ``.secret_key``, ``.region``), ``bucket``, ``client`` (a boto3 client) and
    ``server`` (``stop()``, ``start()``, ``restart()``, ``kill()``: a test may
    stop the server mid-upload; it is running again after the test). The
    bucket is made with one request asked once: a server that does not answer
    it (or, after a failed test, a write) is restarted once; if it stays bad,
    this and every later test using it fail at once, with the server's log.
    """
    from types import SimpleNamespace

    from trtet_store.testing.s3server import S3ServerError

    try:
        bucket = s3_watch.bucket()
    except S3ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield SimpleNamespace(endpoint=s3_server.endpoint, bucket=bucket,
                          client=s3_server.endpoint.client(), server=s3_server)
    if s3_server.process is None:
        s3_server.start()
    if request.node.stash.get(_CALL_FAILED, False):
        s3_watch.after_failure(bucket)


@pytest.fixture
def s3env(s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``s3``, with boto3's environment (``AWS_*``) set to the test server's credentials.

    Adds ``journal_dir`` (a fresh directory path) for publish journals.
    """
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.endpoint.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.endpoint.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3.endpoint.region)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    s3.journal_dir = tmp_path / "journal"
    return s3


@pytest.fixture
def proxy(s3: Any) -> Iterator[Any]:
    """The counting proxy in front of the test server: bytes each way, counted apart."""
    from trtet_store.testing.proxy import CountingProxy

    with CountingProxy.for_url(s3.endpoint.url) as p:
        yield p


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[..., Any]]:
    """Factory ``tcp_proxy(target, faults=None, request_rate=None) -> TcpProxy``; closed at the end.

    ``target`` is a URL (``s3.endpoint.url``) or ``(host, port)``.
    """
    from urllib.parse import urlsplit

    from tcp_proxy import TcpProxy

    made: list[Any] = []

    def _make(target: Any, faults: Any = None, request_rate: float | None = None) -> Any:
        if isinstance(target, str):
            parts = urlsplit(target)
            target = (parts.hostname, parts.port)
        proxy = TcpProxy(target, faults, request_rate).start()
        made.append(proxy)
        return proxy

    yield _make
    for proxy in made:
        proxy.close()
