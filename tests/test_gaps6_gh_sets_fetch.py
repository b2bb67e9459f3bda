"""fetch_set's failure advice, given the state each branch is for.

A server that answered and then went away is an interruption: run the same
fetch-set again (tested in test_sets_fetch_faults.py). An endpoint that never
answered at all (a wrong host or port) is not: the error stays the
endpoint's own, naming the address to check, with no rerun advice and
nothing created.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import trtet_store.sets.fetch as set_fetch
from trtet_store.remote.errors import EndpointUnreachableError, FetchInterruptedError
from trtet_store.sets import fetch_set


def test_an_endpoint_that_never_answered_is_said_as_such_not_as_an_interruption(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(set_fetch, "RETRY_WINDOW", 0.3)  # the policy; the state needs no 20 s
    for var, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(var, value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused
    with pytest.raises(EndpointUnreachableError) as caught:
        fetch_set("s3://bucket/rel/", tmp_path / "dest", "a",
                  endpoint_url=f"http://127.0.0.1:{port}")
    assert not isinstance(caught.value, FetchInterruptedError), caught.value
    said = str(caught.value)
    assert f"could not connect to 127.0.0.1:{port}" in said and "fetch-set" not in said, said
    assert os.listdir(tmp_path) == []
