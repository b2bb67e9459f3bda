"""remote.s3.wait_out's log line: the try it is about to make is named by its number.

The first failure is try 1, so the line logged before the wait says "try 2" (and "try 3"
after the second): what a user reading the INFO log of a restarting server counts by.
"""

from __future__ import annotations

import logging

import pytest

import trtet_store.remote.s3 as s3
from trtet_store.remote.s3 import Transient, wait_out


def test_the_wait_logs_the_number_of_the_try_it_will_make(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(s3.random, "uniform", lambda a, b: a)  # the shortest delays
    calls = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise Transient("503 SlowDown")
        return "ok"

    with caplog.at_level(logging.INFO, logger="trtet_store.remote"):
        assert wait_out(fn, 5.0) == "ok"
    said = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert len(said) == 2 and len(calls) == 3, said
    assert said[0].startswith("503 SlowDown; trying again in ") and said[0].endswith("(try 2)")
    assert said[1].endswith("(try 3)"), said
