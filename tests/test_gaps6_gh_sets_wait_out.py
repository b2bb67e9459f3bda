"""fetch's one retry policy (``s3.wait_out``, ``S3(retry_window=)``), each bound on its own.

No server is needed: the function tried is a counter that fails the way the
S3 layer says a request failed. A body cut short is the caller's to retry
(raised at the first try), a refusal is raised at once, a window of 0 is
botocore's retries alone, the wait never runs past the window, each delay is
capped, and the message the user reads says the tries and seconds (an
unreachable endpoint keeps its address). An ``S3`` made with a retry window
applies it to each call; one made without does not.
"""

from __future__ import annotations

from typing import Any

import pytest

from trtet_store.remote.errors import RemoteError
from trtet_store.remote.s3 import (
    FIRST_DELAY,
    MAX_DELAY,
    S3,
    ReadInterrupted,
    Transient,
    Unreachable,
    backoff,
    wait_out,
)


class Failing:
    """A request that fails with ``exc`` the first ``times`` calls, then answers."""

    def __init__(self, exc: BaseException, times: int = 10**9) -> None:
        self.exc, self.times, self.calls = exc, times, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise self.exc
        return "ok"


def test_a_body_cut_short_is_raised_at_the_first_try() -> None:
    fn = Failing(ReadInterrupted("connection lost while reading"))
    with pytest.raises(ReadInterrupted):
        wait_out(fn, 5.0)
    assert fn.calls == 1


def test_a_refusal_is_raised_at_once_and_a_blip_is_waited_out() -> None:
    fn = Failing(RemoteError("AccessDenied"))
    with pytest.raises(RemoteError):
        wait_out(fn, 5.0)
    assert fn.calls == 1
    fn = Failing(Transient("503 SlowDown"), times=2)
    assert wait_out(fn, 5.0) == "ok" and fn.calls == 3


class FakeClock:
    """``time`` for ``s3.wait_out``: ``monotonic`` reads a counter that only ``sleep`` moves."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_window_of_zero_is_botocore_s_retries_alone() -> None:
    exc = Transient("503 SlowDown")
    fn = Failing(exc)
    with pytest.raises(Transient) as caught:
        wait_out(fn, 0)
    assert fn.calls == 1 and caught.value is exc  # as it was, nothing added


def test_the_wait_never_runs_past_the_window_and_says_the_tries_and_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No jitter: delays 0.25, 0.5, 1, 2 s. In a 1 s window the third delay would end at
    1.75 s, past it: given up after 3 tries over 0.75 s, not slept on to 1.75 s."""
    import trtet_store.remote.s3 as s3

    monkeypatch.setattr(s3.random, "uniform", lambda a, b: b)
    # The clock is the test's: a sleep moves it by what was asked, nothing else does, so
    # a loaded machine's stalls cannot move a try across the window's end.
    clock = FakeClock()
    monkeypatch.setattr(s3, "time", clock)
    fn = Failing(Transient("503 SlowDown"))
    with pytest.raises(Transient) as caught:
        wait_out(fn, 1.0)
    assert clock.slept == [0.25, 0.5]  # a delay that would end past the window is not slept
    said = str(caught.value)
    assert said.startswith("503 SlowDown (gave up after 3 tries over 0."), said
    assert fn.calls == 3


def test_an_unreachable_endpoint_keeps_its_address_when_given_up() -> None:
    fn = Failing(Unreachable("could not connect to 127.0.0.1:9", "127.0.0.1:9"))
    with pytest.raises(Unreachable) as caught:
        wait_out(fn, 0.3)
    assert caught.value.address == "127.0.0.1:9"
    assert "(gave up after " in str(caught.value)


def test_each_delay_doubles_from_the_first_and_is_capped() -> None:
    for attempt in range(12):
        top = min(MAX_DELAY, FIRST_DELAY * 2 ** attempt)
        for _ in range(20):
            d = backoff(attempt)
            assert top * 0.5 <= d <= top, (attempt, d)
    assert max(backoff(30) for _ in range(50)) <= MAX_DELAY


class _Client:
    """A botocore-shaped client whose every call fails as a server restarting would."""

    class meta:  # noqa: N801 - botocore's attribute name
        endpoint_url = "http://127.0.0.1:9"

    def __init__(self, fails: int) -> None:
        self.fails, self.calls = fails, 0

    def head_bucket(self, **kw: Any) -> dict:
        self.calls += 1
        if self.calls <= self.fails:
            from botocore.exceptions import EndpointConnectionError
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b")
        return {}


def test_an_s3_with_a_retry_window_tries_each_call_again_and_one_without_does_not() -> None:
    pytest.importorskip("botocore")
    client = _Client(fails=2)
    S3(client=client, retry_window=5.0).check_bucket("b")
    assert client.calls == 3
    client = _Client(fails=2)
    with pytest.raises(Transient):
        S3(client=client).check_bucket("b")
    assert client.calls == 1
