"""Fetch waits out a server that restarts, for a bounded time, and says how long (issue 45 item 22).

botocore's standard mode spends its 5 attempts in under a second, so a
server restarted within a second or two failed the fetch. A fetch's own
client now tries a failed request again with backoff for
:data:`~trtet_store.remote.download.reader.RETRY_WINDOW` seconds: a real
SeaweedFS stopped mid-fetch and started again ~2 s later is waited out, and
a server that never comes back fails within the window plus one try, the
tries and seconds in the one line the CLI prints.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tcp_proxy import TcpProxy
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.remote.download.reader import RETRY_WINDOW
from trtet_store.remote.download.receive import fetch

ROOT = Path(__file__).resolve().parent.parent


def test_a_server_restarted_mid_fetch_is_waited_out(s3env, here_fs):
    """The endpoint (a proxy in front of SeaweedFS) stops listening mid-fetch, for ~2 s."""
    data, sizes = engine_program(91, (8 * MiB,))
    url = f"s3://{s3env.bucket}/r/model.pte"
    put_program(s3env.client, s3env.bucket, "r", {"model.pte": (data, sizes)})
    target = (s3env.endpoint.url.split("//")[1].split(":")[0],
              int(s3env.endpoint.url.rsplit(":", 1)[1]))
    proxies = [TcpProxy(target).start()]
    down: dict[str, float] = {}

    def restart_later() -> None:
        time.sleep(2.0)
        proxies.append(TcpProxy(target, port=proxies[0].port).start())
        down["up"] = time.monotonic()

    def progress(p) -> None:
        if p.downloaded >= 2 * MiB and "at" not in down:
            down["at"] = time.monotonic()
            proxies[0].close()  # connections refused (and the open ones cut) from now on
            threading.Thread(target=restart_later, daemon=True).start()

    try:
        start = time.monotonic()
        report = fetch(url, here_fs / "model.pte", endpoint_url=proxies[0].url,
                       range_size=MiB, concurrency=1, progress=progress)
        took = time.monotonic() - start
    finally:
        for proxy in proxies:
            proxy.close()
    assert "at" in down and "up" in down  # it was down, and the fetch outlived it
    assert took >= 2.0
    assert (here_fs / "model.pte").read_bytes() == data
    assert report.bytes_downloaded <= len(data) + MiB  # went on, not again from zero
    assert sorted(os.listdir(here_fs)) == ["model.pte"]


def test_a_dead_server_fails_within_the_window_and_says_how_long(s3env, here_fs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused
    env = {**os.environ, **s3env.endpoint.environ(), "PYTHONPATH": os.fspath(ROOT)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trtet_store", "fetch", f"s3://{s3env.bucket}/o/model.pte",
         os.fspath(here_fs / "model.pte"), "--endpoint-url", f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    took = time.monotonic() - start
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("trtet-store fetch: ") and f"could not connect to 127.0.0.1:{port}" \
        in line, line
    assert "(gave up after " in line, line
    said = line.rpartition("(gave up after ")[2]
    tries, _, rest = said.partition(" tries over ")
    seconds = float(rest.removesuffix(" s)"))
    assert int(tries) >= 5, line
    assert RETRY_WINDOW / 2 <= seconds <= RETRY_WINDOW, line  # backed off, and bounded
    assert took < RETRY_WINDOW + 15, took
    assert os.listdir(here_fs) == []
