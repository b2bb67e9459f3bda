"""remote/download/reader.py: Reader._call tells a server that went away from one never there.

The contract (reader.py's docstring): a request that failed through the retries is a
FetchInterruptedError (the fetch adds the command that resumes it), "except a failure
to connect before the server ever answered, which is a wrong endpoint or a server
down (EndpointUnreachableError)". Here the real SeaweedFS answers the manifest's
GetObject and is stopped right after it (a hook on the client's own after-call
event), so the HeadObject through ``Reader.head`` -> ``Reader._call`` cannot connect:
that is an interruption with its resume command (``--endpoint-url``), not "wrong
endpoint". An endpoint that never answered stays EndpointUnreachableError.
Nothing is placed either way.
"""

from __future__ import annotations

import os

import pytest
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import EndpointUnreachableError, FetchInterruptedError


def test_reader_call_a_head_after_the_server_answered_then_went_away_is_resumable(
        s3, here_fs):
    data, sizes = engine_program(81, (MiB,))
    url = f"s3://{s3.bucket}/gone/model.pte"
    put_program(s3.client, s3.bucket, "gone", {"model.pte": (data, sizes)})
    client = s3.endpoint.client(retries={"max_attempts": 1}, connect_timeout=2)

    def stop_after_manifest(**_):
        if s3.server.process is not None:
            s3.server.stop()  # the fixture starts it again after the test

    client.meta.events.register("after-call.s3.GetObject", stop_after_manifest)
    with pytest.raises(FetchInterruptedError) as info:
        fetch(url, here_fs / "model.pte", client=client)
    assert not isinstance(info.value, EndpointUnreachableError)
    assert "HeadObject" in str(info.value)
    assert "--endpoint-url " + s3.endpoint.url in info.value.resume
    assert os.listdir(here_fs) == []


def test_reader_call_an_endpoint_that_never_answered_is_unreachable(s3, here_fs):
    client = s3.endpoint.client(retries={"max_attempts": 1}, connect_timeout=2)
    client.meta.events.register(
        "before-send.s3.*", lambda request, **_: setattr(
            request, "url", request.url.replace(s3.endpoint.url, "http://127.0.0.1:9")))
    with pytest.raises(EndpointUnreachableError) as info:
        fetch(f"s3://{s3.bucket}/gone/model.pte", here_fs / "model.pte", client=client)
    assert not isinstance(info.value, FetchInterruptedError)
    assert os.listdir(here_fs) == []
