"""fetch's ``wait_replaced`` (``check_options``): NaN is refused like a negative wait.

``wait_replaced`` bounds how long a fetch waits for the manifest of a publish in progress
(``time.monotonic() < deadline``). NaN compares false with everything: ``< 0`` lets it
through, and the wait would end at once, as if no time had been given. It is refused
with the other bad options (``FetchConfig``'s, ``max_restarts``), before any connection
(counted by a loopback proxy in front of SeaweedFS) and before anything is created.
"""

from __future__ import annotations

import math
import os

import pytest
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.remote.download.options import check_options
from trtet_store.remote.download.receive import fetch
from trtet_store.testing.s3server import S3Endpoint

BAD = [math.nan, -math.nan, -1.0, -math.inf, -1]


@pytest.mark.parametrize("wait", BAD)
def test_check_options_refuses_a_nan_or_negative_wait_replaced(wait) -> None:
    with pytest.raises(ValueError, match="wait_replaced must be at least 0 seconds"):
        check_options(wait_replaced=wait)


@pytest.mark.parametrize(("wait", "kind"), [(True, "bool"), (False, "bool"), ("30", "str"),
                                           (None, "NoneType")])
def test_check_options_refuses_a_wait_replaced_that_is_no_number(wait, kind) -> None:
    with pytest.raises(TypeError, match=f"wait_replaced must be a number of seconds, not {kind}"):
        check_options(wait_replaced=wait)


@pytest.mark.parametrize("wait", [0, 0.0, 30.0, math.inf])
def test_check_options_takes_a_wait_of_zero_or_more(wait) -> None:
    check_options(wait_replaced=wait)


def test_fetch_with_a_nan_wait_replaced_sends_and_creates_nothing(s3, here_fs, tcp_proxy):
    data, sizes = engine_program(73, (2 * MiB,))
    put_program(s3.client, s3.bucket, "w", {"model.pte": (data, sizes)})
    proxy = tcp_proxy(s3.endpoint.url)
    client = S3Endpoint(proxy.url).client()
    url = f"s3://{s3.bucket}/w/model.pte"
    with pytest.raises(ValueError, match="wait_replaced must be at least 0 seconds, not nan"):
        fetch(url, here_fs / "model.pte", client=client, wait_replaced=math.nan)
    assert proxy.connections == 0, "a request was sent before wait_replaced was checked"
    assert sorted(os.listdir(here_fs)) == []
    fetch(url, here_fs / "model.pte", client=client, wait_replaced=0.5)  # a good one works
    assert (here_fs / "model.pte").read_bytes() == data
