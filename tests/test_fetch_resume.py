"""fetch killed with SIGKILL at random moments, then resumed: only what is missing is downloaded.

The fetcher runs in a child process (one range in flight, 1 MiB ranges, a
link slowed by its progress callback) through a loopback proxy that counts
every response body byte: an independent measure of what was downloaded.
After every kill the destination holds the old version or nothing, and at
the end the new version byte-identical, with nothing else left in the
directory.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, engine_program, put_program

import trtet_store
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint

KILLS = 20

CHILD = r"""
import sys, time
import boto3
from botocore.config import Config
from trtet_store.remote.download.receive import fetch

url, dest, endpoint, key, secret = sys.argv[1:6]
client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                      aws_secret_access_key=secret, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}))


def progress(p):
    # One line per MiB received (and one when all is in): the parent kills on these.
    print("all" if p.done == p.total else "got", flush=True)
    time.sleep(0.01)


print("ready", flush=True)
report = fetch(url, dest, client=client, concurrency=1, range_size=1 << 20, progress=progress)
print("done", report.bytes_downloaded, report.bytes_resumed, flush=True)
"""


def start_child(url: str, dest: Path, endpoint: S3Endpoint) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, os.fspath(dest), endpoint.url, endpoint.access_key,
         endpoint.secret_key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def kill_after(proc: subprocess.Popen, lines: int, delay: float, until: str = "got") -> None:
    """SIGKILL ``proc`` ``delay`` seconds after its ``lines``-th line starting with ``until``."""
    seen = 0
    while seen < lines:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fetch ended before the kill: {proc.stderr.read()}")
        if line.startswith(until):
            seen += 1
    time.sleep(delay)
    assert proc.poll() is None, "the fetch ended before the kill"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_sigkill_at_random_moments_then_resume_downloads_the_program_about_once(
        s3, here_fs, tcp_proxy):
    rnd = random.Random(20261202)
    old, sizes = engine_program(21, (2 * MiB,))
    # 64 one-MiB ranges: 20 kills, each after at most 3 ranges, never finish it.
    data, new_sizes = engine_program(22, (30 * MiB, 24 * MiB))
    ptd = engine_bytes(23, 10 * MiB)
    url = f"s3://{s3.bucket}/k/model.pte"
    put_program(s3.client, s3.bucket, "k", {"model.pte": (old, sizes),
                                             "model.ptd": (b"o" * 10, [10])})
    fetch(url, here_fs / "model.pte", client=s3.client)
    put_program(s3.client, s3.bucket, "k", {"model.pte": (data, new_sizes),
                                             "model.ptd": (ptd, [len(ptd)])})
    manifest = s3.client.head_object(Bucket=s3.bucket, Key="k/model.pte.trtet.json")
    proxy = tcp_proxy(s3.endpoint.url)
    endpoint = S3Endpoint(proxy.url)
    total = len(data) + len(ptd)
    orphans_seen = False
    runs = 0
    for kill in range(KILLS):
        proc = start_child(url, here_fs / "model.pte", endpoint)
        runs += 1
        # In the set-up (no range yet), or mid-range after 1 to 3 ranges.
        kill_after(proc, rnd.randint(0, 3), rnd.uniform(0.0, 0.3 if kill % 4 == 0 else 0.05))
        # The old set, whole, after every kill.
        assert (here_fs / "model.pte").read_bytes() == old
        assert (here_fs / "model.ptd").read_bytes() == b"o" * 10
        if not orphans_seen:
            found = [o for o in trtet_store.recover(here_fs)
                     if o.action == "orphan" and "trtet_fetch" in o.detail]
            orphans_seen = bool(found)
    # Then kills once every byte is in: inside the verification, the write, the cleanup.
    write_kills = 0
    for delay in (0.0, 0.05, 0.1, 0.2, 0.4):
        proc = start_child(url, here_fs / "model.pte", endpoint)
        runs += 1
        try:
            kill_after(proc, 1, delay, until="all")
        except AssertionError:
            proc.wait()
            break  # it finished first: the rest of the fetch is tested below
        write_kills += 1
        sets = ((here_fs / "model.pte").read_bytes(), (here_fs / "model.ptd").read_bytes())
        assert sets in ((old, b"o" * 10), (data, ptd))
    proc = start_child(url, here_fs / "model.pte", endpoint)
    runs += 1
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (here_fs / "model.pte").read_bytes() == data
    assert (here_fs / "model.ptd").read_bytes() == ptd
    staging = here_fs / ".trtet-staging"
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"], (
        sorted(os.listdir(staging)) if staging.exists() else None)
    assert orphans_seen, "recover never listed a killed fetch's staged runs"
    got = proxy.body_bytes[("response", "GET")]
    kills = KILLS + write_kills
    # The program, plus at most the one range in flight per kill, plus a manifest per run.
    bound = total + kills * MiB + runs * manifest["ContentLength"]
    print(f"\n{kills} kills ({write_kills} after the last byte): {got} bytes downloaded for a "
          f"{total}-byte program (bound {bound})")
    assert got <= bound


def test_a_network_failure_says_how_to_resume_and_the_resume_downloads_only_the_rest(
        s3, here_fs, tcp_proxy):
    data, sizes = engine_program(31, (8 * MiB,))
    url = f"s3://{s3.bucket}/n/model.pte"
    put_program(s3.client, s3.bucket, "n", {"model.pte": (data, sizes)})
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    # Every ranged GET after the first four is reset, however often it is retried.
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                              skip=4, times=10_000)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    try:
        fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1,
              attempts=2)
    except FetchInterruptedError as exc:
        assert f"trtet-store fetch {url} {here_fs / 'model.pte'}" in str(exc)
        assert exc.resume.startswith("trtet-store fetch ")
    else:
        raise AssertionError("the fetch did not fail")
    assert not (here_fs / "model.pte").exists()
    proxy.clear()
    before = proxy.body_bytes[("response", "GET")]
    said = []
    report = fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1,
                   progress=said.append)
    assert (here_fs / "model.pte").read_bytes() == data
    # The four ranges that got through: the 16 KiB header piece and three 1 MiB ranges.
    assert report.bytes_resumed == sizes[0] + 3 * MiB
    # Progress counts them before a byte is downloaded, and on every line after.
    first = next((i for i, p in enumerate(said) if p.resumed), None)
    assert first is not None, said[:3]
    assert said[first].downloaded == 0 and said[first].done == report.bytes_resumed, said
    assert all(p.resumed == report.bytes_resumed for p in said[first:])
    assert said[-1].done == said[-1].total == len(data)
    assert report.bytes_downloaded == len(data) - report.bytes_resumed
    assert (proxy.body_bytes[("response", "GET")] - before
            <= len(data) - report.bytes_resumed + 64 * 1024)
    assert sorted(os.listdir(here_fs)) == ["model.pte"]


def test_a_fetch_killed_inside_adopt_finds_its_run_by_inode(s3, here_fs, tcp_proxy):
    """The state a kill between adopt's rename and its sidecar leaves: a blob without metadata."""
    data, sizes = engine_program(32, (6 * MiB,))
    url = f"s3://{s3.bucket}/a/model.pte"
    put_program(s3.client, s3.bucket, "a", {"model.pte": (data, sizes)})
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                              skip=3, times=10_000)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError):
        fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1,
              attempts=1)
    staging = here_fs / ".trtet-staging"
    (run,) = staging.glob("fetch-*.run")  # given back to its own name by the failed fetch
    # What adopt's rename into a store of a process killed right then leaves.
    run.rename(staging / "0123456789abcdef-1.blob")
    report = fetch(url, here_fs / "model.pte", client=s3.client, range_size=MiB, concurrency=1)
    assert (here_fs / "model.pte").read_bytes() == data
    assert report.bytes_resumed == sizes[0] + 2 * MiB
    assert sorted(os.listdir(here_fs)) == ["model.pte"]
