"""remote/download/options.py: check_options and FetchConfig hold each bound exactly.

The contract (options.py's docstring): ``concurrency`` 1 to MAX_CONCURRENCY (256),
``range_size`` MIN_RANGE_SIZE (1 MiB) to MAX_RANGE_SIZE (1 GiB) in bytes, ``attempts``
at least 1, ``max_restarts`` and ``wait_replaced`` at least 0 (NaN refused), bools
refused as counts. Memory is ``(concurrency + 2) x range_size``: a bound one over
its cap is real memory. Each bound is tried exactly at the limit (accepted) and one
past it (refused), in both check_options and FetchConfig, and the refusal comes
before fetch() reads, creates or sends anything (a dead endpoint, an empty dir).
"""

from __future__ import annotations

import math
import os

import pytest

from trtet_store import FetchConfig
from trtet_store.io.units import GiB, MiB
from trtet_store.remote.download.options import (
    MAX_CONCURRENCY,
    MAX_RANGE_SIZE,
    MIN_RANGE_SIZE,
    check_options,
)
from trtet_store.remote.download.receive import fetch

DEAD = "http://127.0.0.1:9"  # nothing answers: a request would be an interruption, not this


def test_the_bounds_are_the_documented_ones() -> None:
    assert (MiB, GiB, 256) == (MIN_RANGE_SIZE, MAX_RANGE_SIZE, MAX_CONCURRENCY)


@pytest.mark.parametrize("size", [MIN_RANGE_SIZE, MAX_RANGE_SIZE])
def test_check_options_takes_a_range_size_exactly_at_each_bound(size: int) -> None:
    check_options(range_size=size)
    assert FetchConfig(range_size=size).range_size == size


@pytest.mark.parametrize("size", [MIN_RANGE_SIZE - 1, MAX_RANGE_SIZE + 1, 2 * MAX_RANGE_SIZE,
                                  MAX_RANGE_SIZE + MIN_RANGE_SIZE, 0, -MiB])
def test_check_options_refuses_a_range_size_one_past_either_bound(size: int) -> None:
    with pytest.raises(ValueError, match=rf"range_size must be 1 MiB to 1024 MiB .*not {size} "):
        check_options(range_size=size)
    with pytest.raises(ValueError, match="range_size must be"):
        FetchConfig(range_size=size)


def test_check_options_takes_concurrency_at_its_cap_and_refuses_one_over() -> None:
    check_options(concurrency=MAX_CONCURRENCY)
    check_options(concurrency=1)
    for bad in (MAX_CONCURRENCY + 1, 0, -1):
        with pytest.raises(ValueError, match=rf"concurrency must be 1 to 256, not {bad}$"):
            check_options(concurrency=bad)
        with pytest.raises(ValueError, match="concurrency must be"):
            FetchConfig(concurrency=bad)


@pytest.mark.parametrize("name,bad", [("attempts", 0), ("attempts", -1),
                                      ("max_restarts", -1)])
def test_check_options_refuses_counts_below_their_floor(name: str, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be at least"):
        check_options(**{name: bad})


def test_check_options_takes_the_floors_themselves() -> None:
    check_options(attempts=1, max_restarts=0, wait_replaced=0.0)
    check_options(wait_replaced=-0.0)  # -0.0 is 0 seconds


@pytest.mark.parametrize("name", ["concurrency", "range_size", "attempts", "max_restarts"])
@pytest.mark.parametrize("bad", [True, False, 1.0, float("nan"), "4"])
def test_check_options_refuses_a_count_that_is_not_an_int(name: str, bad: object) -> None:
    with pytest.raises(TypeError, match=rf"{name} must be an int"):
        check_options(**{name: bad})


@pytest.mark.parametrize("bad", [float("nan"), -float("nan"), -1e-9, -math.inf])
def test_check_options_refuses_a_wait_replaced_below_zero_or_nan(bad: float) -> None:
    with pytest.raises(ValueError, match="wait_replaced must be at least 0 seconds"):
        check_options(wait_replaced=bad)


@pytest.mark.parametrize("kw", [dict(range_size=MAX_RANGE_SIZE + 1),
                                dict(range_size=MAX_RANGE_SIZE + MIN_RANGE_SIZE),
                                dict(concurrency=MAX_CONCURRENCY + 1),
                                dict(config=FetchConfig(), range_size=MAX_RANGE_SIZE + 1)])
def test_fetch_refuses_an_option_past_its_cap_before_any_request_or_file(tmp_path, kw) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises((ValueError, TypeError)):
        fetch("s3://bucket/p/model.pte", out / "model.pte", endpoint_url=DEAD, **kw)
    assert os.listdir(out) == []  # no staging directory, no lock, no journal


# --- resume_command and client_endpoint (options.py) ---------------------------------------

def test_resume_command_repeats_every_option_not_at_its_default_and_nothing_else() -> None:
    import shlex

    from trtet_store.remote.download.options import (
        DEFAULT_CONCURRENCY,
        DEFAULT_RANGE_SIZE,
        resume_command,
    )

    bare = resume_command("s3://b/p/m.pte", "/o/m.pte", concurrency=DEFAULT_CONCURRENCY,
                          range_size=DEFAULT_RANGE_SIZE, if_replaced="restart",
                          replace_needed=False, program_only=False)
    assert shlex.split(bare) == ["trtet-store", "fetch", "s3://b/p/m.pte", "/o/m.pte"]
    full = resume_command("s3://b/p/m.pte", "/o dir/m.pte", reuse=["/old/a.pte", "/old/b.pte"],
                          endpoint_url="http://h:1", concurrency=7, range_size=3 * MiB,
                          if_replaced="error", trusted_keys=["/k/team.pub"],
                          replace_needed=True, program_only=True)
    assert shlex.split(full) == [
        "trtet-store", "fetch", "s3://b/p/m.pte", "/o dir/m.pte", "--reuse", "/old/a.pte",
        "--reuse", "/old/b.pte", "--endpoint-url", "http://h:1", "--concurrency", "7",
        "--range-size", str(3 * MiB), "--if-replaced", "error", "--trusted-key", "/k/team.pub",
        "--replace-needed", "--program-only"]


def test_client_endpoint_names_a_custom_endpoint_and_not_aws_own() -> None:
    import boto3

    from trtet_store.remote.download.options import client_endpoint

    aws = boto3.client("s3", region_name="eu-west-1", aws_access_key_id="x",
                       aws_secret_access_key="y")
    assert client_endpoint(aws) is None  # AWS's own needs no flag
    mine = boto3.client("s3", region_name="eu-west-1", endpoint_url="http://127.0.0.1:8333",
                        aws_access_key_id="x", aws_secret_access_key="y")
    assert client_endpoint(mine) == "http://127.0.0.1:8333"
    assert client_endpoint(object()) is None
