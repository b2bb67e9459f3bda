"""A test S3 server that goes bad is restarted once, then given up at once (not waited out).

A SeaweedFS that started answering errors made every later test wait about a
minute in retries before failing. ``ServerWatch`` (the ``s3`` fixture's)
makes each test's bucket with one request asked once; a server that does not
answer is restarted once, and one that is still bad after that is given up:
every later test fails at once, with the server's log. These tests run their
own server (never the session's), on the real binary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from trtet_store.testing.s3server import S3Server, S3ServerError, ServerWatch


@pytest.fixture
def own_server():
    directory = Path(tempfile.mkdtemp(prefix="trtet-s3w-", dir="/tmp"))
    server = S3Server(directory)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_healthy_server_costs_one_request_and_no_restart(own_server):
    watch = ServerWatch(own_server)
    pid = own_server.pid
    bucket = watch.bucket()
    own_server.endpoint.client().head_bucket(Bucket=bucket)  # it was made
    watch.after_failure(bucket)  # a test that failed for its own reasons: the server is fine
    assert watch.restarts == 0 and watch.given_up is None
    assert own_server.pid == pid
    # The probe leaves nothing in the test's bucket.
    assert own_server.endpoint.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_a_dead_server_is_restarted_once_and_a_bad_one_given_up_at_once(own_server):
    watch = ServerWatch(own_server)
    watch.bucket()
    # It dies behind the fixture's back (a crash): the next test's bucket restarts it.
    os.kill(own_server.pid, signal.SIGKILL)
    own_server.process.wait(10)
    bucket = watch.bucket()
    assert watch.restarts == 1 and watch.given_up is None
    own_server.endpoint.client().head_bucket(Bucket=bucket)

    # Now it answers, but refuses every write (our identity may only list and read),
    # and a restart does not cure it: given up, with its log.
    config = json.loads((own_server.directory / "s3.json").read_text())
    config["identities"][0]["actions"] = ["List", "Read"]
    (own_server.directory / "s3.json").write_text(json.dumps(config))
    own_server.restart()
    with pytest.raises(S3ServerError) as info:
        watch.bucket()
    said = str(info.value)
    assert watch.restarts == 2
    assert "stopped answering and a restart did not help" in said, said
    assert "CreateBucket" in said and "after a restart" in said, said
    assert f"{own_server.directory}/log" in said and said.endswith(own_server.log_tail()), said
    # Every later test fails at once: no request, no retries, no restart.
    start = time.monotonic()
    for _ in range(3):
        with pytest.raises(S3ServerError, match="stopped answering"):
            watch.bucket()
    assert time.monotonic() - start < 1.0  # a hang guard: no request is made at all
    assert watch.restarts == 2
