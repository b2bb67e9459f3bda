"""fetch's options and endpoint, refused clearly before anything is sent or created (issue 34).

Item 15: ``concurrency`` and ``range_size`` are checked like publish checks
its own (an ``int``, ``bool`` refused, within bounds), in the API and in the
CLI flags, before any connection (counted by a loopback proxy). Item 19: a
wrong endpoint port says "could not connect to host:port", in fetch's reader
and in the publisher's :class:`~trtet_store.remote.s3.S3`, instead of a
network blip retried and then called an interruption.

A closed port answers at once, so the wrong-port tests' time was all
backoff (botocore's between its attempts, fetch's own between its tries):
``no_waiting`` makes every ``time.sleep`` return at once and move a virtual
``time.monotonic`` forward instead, and records who asked, so the tests
count the attempts and bound the time they would have waited.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.cli import main
from trtet_store.remote import EndpointUnreachableError
from trtet_store.remote.download.receive import fetch, resume_command
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint


def free_port() -> int:
    """A port nothing listens on (bound, then closed: a connect to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sleeps:
    """Every ``time.sleep`` asked for during a test: who asked, and for how long."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def by(self, prefix: str) -> list[float]:
        """The sleeps asked for by modules whose name starts with ``prefix``."""
        return [s for who, s in self.asked if who.startswith(prefix)]

    @property
    def total(self) -> float:
        return sum(s for _, s in self.asked)


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    """``time.sleep`` returns at once; ``time.monotonic`` moves on by what was asked.

    Retry loops that bound themselves by the monotonic clock (fetch's retry
    window) see the time pass as it would have; botocore's backoff between
    its attempts is recorded and skipped. Nothing else is changed: the
    connections are real, refused by a real closed port.
    """
    sleeps = Sleeps()
    real_monotonic = time.monotonic

    def sleep(seconds: float) -> None:
        who = sys._getframe(1).f_globals.get("__name__", "?")
        with sleeps.lock:
            sleeps.asked.append((who, float(seconds)))

    def monotonic() -> float:
        return real_monotonic() + sleeps.total

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(time, "monotonic", monotonic)
    return sleeps


#: botocore's attempts per request for the clients fetch and publish make (standard mode).
BOTOCORE_ATTEMPTS = 5


def listing(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n != "lost+found")


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"concurrency": True}, TypeError, "concurrency must be an int, not bool"),
    ({"concurrency": 1.5}, TypeError, "concurrency must be an int, not float"),
    ({"concurrency": 0}, ValueError, "concurrency must be 1 to 256, not 0"),
    ({"concurrency": -3}, ValueError, "concurrency must be 1 to 256, not -3"),
    ({"range_size": 0}, ValueError, "range_size must be 1 MiB to 1024 MiB"),
    ({"range_size": -MiB}, ValueError, "range_size must be 1 MiB to 1024 MiB"),
    ({"range_size": 512 * 1024}, ValueError, "not 524288 bytes"),
    ({"range_size": True}, TypeError, "range_size must be an int (bytes), not bool"),
    ({"range_size": float(MiB)}, TypeError, "range_size must be an int (bytes), not float"),
    ({"attempts": 0}, ValueError, "attempts must be at least 1, not 0"),
    ({"max_restarts": -1}, ValueError, "max_restarts must be at least 0"),
])
def test_bad_options_are_refused_before_any_connection(s3, here_fs, tcp_proxy, kwargs, error,
                                                        words):
    data, sizes = engine_program(71, (2 * MiB,))
    put_program(s3.client, s3.bucket, "o", {"model.pte": (data, sizes)})
    proxy = tcp_proxy(s3.endpoint.url)
    client = S3Endpoint(proxy.url).client()
    with pytest.raises(error) as info:
        fetch(f"s3://{s3.bucket}/o/model.pte", here_fs / "model.pte", client=client, **kwargs)
    assert words in str(info.value)
    assert proxy.connections == 0, "a request was sent before the options were checked"
    assert listing(here_fs) == []
    # The same fetch with good options works through that proxy.
    fetch(f"s3://{s3.bucket}/o/model.pte", here_fs / "model.pte", client=client)
    assert (here_fs / "model.pte").read_bytes() == data


@pytest.mark.parametrize(("flags", "words"), [
    (["--concurrency", "0"], "--concurrency 0: concurrency must be 1 to 256, not 0"),
    (["--concurrency", "-3"], "--concurrency -3: concurrency must be 1 to 256, not -3"),
    (["--concurrency", "1.5"], "--concurrency 1.5: not a whole number"),
    (["--range-size", "0"], "--range-size 0: range_size must be 1 MiB to 1024 MiB"),
    (["--range-size", "512K"], "--range-size 512K: range_size must be 1 MiB to 1024 MiB"),
    (["--range-size", "lots"], "--range-size lots:"),
])
def test_cli_bad_flags_are_one_line_and_a_nonzero_exit(s3env, here_fs, tcp_proxy, capsys,
                                                      flags, words):
    proxy = tcp_proxy(s3env.endpoint.url)
    rc = main(["fetch", f"s3://{s3env.bucket}/o/model.pte", os.fspath(here_fs / "model.pte"),
               "--endpoint-url", proxy.url, "--no-progress", *flags])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.count("\n") == 1 and err.startswith("trtet-store fetch: "), err
    assert words in err, err
    assert "Traceback" not in err
    assert proxy.connections == 0
    assert listing(here_fs) == []


def test_the_resume_command_repeats_every_option_given():
    cmd = resume_command("s3://b/k/m.pte", "/d/m.pte", reuse=["/old/m.pte"],
                         endpoint_url="http://127.0.0.1:9000", concurrency=7,
                         range_size=3 * MiB, if_replaced="error")
    assert cmd == ("trtet-store fetch s3://b/k/m.pte /d/m.pte --reuse /old/m.pte --endpoint-url "
                   "http://127.0.0.1:9000 --concurrency 7 --range-size 3145728 "
                   "--if-replaced error")
    # A path with a space stays one word.
    assert resume_command("s3://b/k", "/a b/m.pte").endswith("'/a b/m.pte'")


def test_a_wrong_port_says_it_could_not_connect_to_host_port(s3env, here_fs, no_waiting):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(EndpointUnreachableError) as info:
        fetch(f"s3://{s3env.bucket}/o/model.pte", here_fs / "model.pte", endpoint_url=url)
    assert not isinstance(info.value, FetchInterruptedError)
    assert f"could not connect to 127.0.0.1:{port}" in str(info.value)
    assert info.value.address == f"127.0.0.1:{port}"
    assert "endpoint" in str(info.value)
    assert listing(here_fs) == []
    # Each of fetch's tries is botocore's attempts, backing off between them, and fetch's
    # own backoff comes only between its tries: not a retry loop nested in another.
    groups = "".join("b" if who.startswith("botocore") else "t" if who.startswith("trtet_store")
                     else "?" for who, _ in no_waiting.asked).split("t")
    assert all(len(g) <= BOTOCORE_ATTEMPTS - 1 and set(g) <= {"b"} for g in groups), \
        no_waiting.asked
    assert no_waiting.by("botocore"), "botocore's retries did not run"
    # ... and bounded: what the fetch would have waited (all of its time, a closed port
    # refusing at once) stays within the bound its wall time used to be held to.
    assert no_waiting.total < 30, no_waiting.asked


def test_a_wrong_port_in_the_cli_is_one_line(s3env, here_fs, capsys, no_waiting):
    port = free_port()
    rc = main(["fetch", f"s3://{s3env.bucket}/o/model.pte", os.fspath(here_fs / "model.pte"),
               "--endpoint-url", f"http://127.0.0.1:{port}", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("\n") == 1, err
    assert f"could not connect to 127.0.0.1:{port}" in err, err
    assert no_waiting.by("botocore"), "botocore's retries did not run"
    assert no_waiting.total < 30, no_waiting.asked


def test_the_publishers_s3_says_it_could_not_connect_to_host_port(s3env, no_waiting):
    from trtet_store.remote.s3 import S3, Transient

    port = free_port()
    s3 = S3(f"http://127.0.0.1:{port}", retries=2)
    with pytest.raises(EndpointUnreachableError) as info:
        s3.check_bucket(s3env.bucket)
    assert f"could not connect to 127.0.0.1:{port}" in str(info.value)
    # Still a Transient to publish: a server gone mid-upload keeps the upload for a resume.
    assert isinstance(info.value, Transient)
    # retries=2: botocore's two attempts, one backoff between them, none of ours on top.
    assert len(no_waiting.by("botocore")) == 1, no_waiting.asked
    assert no_waiting.by("trtet_store") == [], no_waiting.asked


def test_a_server_that_goes_away_mid_fetch_is_still_an_interruption_with_its_resume(
        s3, here_fs):
    """Once the server has answered, a refused connection is a blip: retried, then resumable."""
    data, sizes = engine_program(72, (4 * MiB,))
    url = f"s3://{s3.bucket}/g/model.pte"
    put_program(s3.client, s3.bucket, "g", {"model.pte": (data, sizes)})
    client = s3.endpoint.client(retries={"max_attempts": 1}, connect_timeout=2)
    address = s3.endpoint.url.removeprefix("http://")

    def progress(p):
        if p.downloaded >= MiB and s3.server.process is not None:
            s3.server.stop()  # nothing listens on its port any more (the fixture restarts it)

    with pytest.raises(FetchInterruptedError) as info:
        fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1,
              attempts=2, progress=progress)
    assert f"could not connect to {address}" in str(info.value)
    assert "--endpoint-url " + s3.endpoint.url in info.value.resume
    assert not (here_fs / "model.pte").exists()


def test_a_head_that_keeps_failing_says_how_to_resume_with_every_option(s3, here_fs):
    """The manifest is read, then every HeadObject fails (a link that drops): resumable."""
    from botocore.exceptions import ConnectionClosedError

    data, sizes = engine_program(73, (2 * MiB,))
    url = f"s3://{s3.bucket}/h/model.pte"
    put_program(s3.client, s3.bucket, "h", {"model.pte": (data, sizes)})

    class DroppingHeads:
        """The real client, whose HeadObject calls all fail as a dropped connection does."""

        meta = s3.client.meta

        def __getattr__(self, name):
            return getattr(s3.client, name)

        def head_object(self, **kwargs):
            raise ConnectionClosedError(endpoint_url=f"{s3.endpoint.url}/{kwargs['Key']}")

    with pytest.raises(FetchInterruptedError) as info:
        fetch(url, here_fs / "model.pte", client=DroppingHeads(), range_size=2 * MiB,
              attempts=2)
    assert "HeadObject" in str(info.value)
    assert info.value.resume == (f"trtet-store fetch {url} {here_fs / 'model.pte'} "
                                 f"--endpoint-url {s3.endpoint.url} --range-size {2 * MiB}")
    assert f"run `{info.value.resume}` to continue" in str(info.value)
    assert listing(here_fs) == []
