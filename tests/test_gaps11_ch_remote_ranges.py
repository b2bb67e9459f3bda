"""remote/download/ranges.py: RangeDownload._one_range retries only a body cut short.

The contract (``_one_range``): "Only a body cut short is retried here; a request
botocore's retries did not get through is an interruption at once" (the retry
window of the reader, wait_out, is the one policy for those; a per-range retry on
top would multiply it by ``attempts``). Here SeaweedFS is stopped mid-fetch (at a
progress tick) and the client has one botocore attempt and no retry window (a
client the caller made): the range in flight and the next one fail to connect,
and the fetch is a FetchInterruptedError after ONE GetObject send per range, not
``attempts`` of them (counted on the client's own before-send event), with no
retry logged, and nothing placed.
"""

from __future__ import annotations

import logging

import pytest
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import FetchInterruptedError


def test_one_range_does_not_retry_a_get_that_failed_to_connect(s3, here_fs, caplog):
    data, sizes = engine_program(83, (4 * MiB,))
    url = f"s3://{s3.bucket}/r8/model.pte"
    put_program(s3.client, s3.bucket, "r8", {"model.pte": (data, sizes)})
    client = s3.endpoint.client(retries={"total_max_attempts": 1}, connect_timeout=2)
    sends: list[str] = []
    stopped: list[int] = []

    def count(request, **_):
        if request.method == "GET" and "Range" in request.headers:
            sends.append(request.headers["Range"])

    client.meta.events.register("before-send.s3.GetObject", count)

    def progress(p):
        if p.downloaded >= MiB and not stopped:
            stopped.append(len(sends))
            s3.server.stop()  # the fixture starts it again after the test

    caplog.set_level(logging.INFO, logger="trtet_store.remote.download.receive")
    with pytest.raises(FetchInterruptedError) as info:
        fetch(url, here_fs / "model.pte", client=client, range_size=MiB, concurrency=1,
              attempts=5, progress=progress)
    assert stopped, "the server was never stopped"
    after = sends[stopped[0]:]
    # Each range after the stop is sent once (botocore's one attempt), never once per
    # of the 5 attempts.
    assert after and max(after.count(r) for r in after) == 1, after
    assert "; retry 1 of" not in caplog.text, caplog.text
    assert info.value.resume
    assert not (here_fs / "model.pte").exists()
