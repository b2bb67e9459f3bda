"""publish_set's and fetch_set's refusals of their arguments, before any request is made.

Every call here points at a port nothing listens on: a check dropped lets
the call go on to the network, where it fails another way (an unreachable
endpoint), so each test asserts the exact refusal and that nothing was
created locally. And the resume command a failed fetch-set prints repeats
every option given (``--link``, ``--store``, ``--replace-needed``, the
machine's facts), so that the rerun is the same fetch.
"""

from __future__ import annotations

import math
import os
import shlex
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from attacker import listing

from trtet_store.sets import fetch_set, publish_set
from trtet_store.sets.fetch import fetch_set_command
from trtet_store.sets.machine import Machine

DEAD = "http://127.0.0.1:9"  # discard port: nothing answers
URL = "s3://bucket/llm/v3/"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "model.pte").write_bytes(b"pte")
    return d


def _publish(src: Path, **kw: Any) -> Any:
    members = kw.pop("members", {"a": [src / "model.pte"]})
    return publish_set(members, URL, endpoint_url=DEAD, **kw)


@pytest.mark.parametrize("grace,exc,said", [
    (-1, ValueError, "gc_grace must be a finite number of seconds >= 0, not -1"),
    (-0.001, ValueError, "gc_grace must be a finite number of seconds >= 0, not -0.001"),
    (timedelta(seconds=-1), ValueError, "gc_grace must be a finite number of seconds >= 0"),
    (math.inf, ValueError, "gc_grace must be a finite number of seconds >= 0, not inf"),
    (math.nan, ValueError, "gc_grace must be a finite number of seconds >= 0, not nan"),
    (True, TypeError, "gc_grace must be seconds (a number) or a timedelta, not True"),
    ("3600", TypeError, "gc_grace must be seconds (a number) or a timedelta, not '3600'"),
])
def test_a_gc_grace_that_is_no_span_of_time_is_refused(src: Path, grace: Any, exc: type,
                                                       said: str) -> None:
    before = listing(src)
    with pytest.raises(exc) as caught:
        _publish(src, gc_grace=grace)
    assert str(caught.value).startswith(said), caught.value
    assert listing(src) == before


@pytest.mark.parametrize("grace", [0, 0.0, timedelta(0)])
def test_a_gc_grace_of_zero_is_allowed(src: Path, grace: Any) -> None:
    """Zero is no refusal: the call goes on to the server (unreachable here)."""
    with pytest.raises(Exception) as caught:
        _publish(src, gc_grace=grace)
    assert "gc_grace" not in str(caught.value), caught.value


@pytest.mark.parametrize("members,exc,said", [
    ({}, TypeError, "members must be a non-empty mapping of member name -> program"),
    ([("a", "x")], TypeError, "members must be a non-empty mapping of member name -> program"),
    ({".a": None}, ValueError, f"publish_set {URL}: member name '.a' starts with a dot"),
    ({"a/b": None}, ValueError, f"publish_set {URL}: member name 'a/b' is not a plain file "
                                "name"),
    ({"a\u2028b": None}, ValueError, f"publish_set {URL}: member name 'a\\u2028b' holds a "
                                     "control character (U+2028"),
])
def test_members_no_set_may_hold_are_refused_before_anything_is_read(
        src: Path, members: Any, exc: type, said: str) -> None:
    with pytest.raises(exc) as caught:
        _publish(src, members=members)
    assert str(caught.value).startswith(said), caught.value


@pytest.mark.parametrize("resume", [1, None, "yes"])
def test_resume_must_be_a_bool(src: Path, resume: Any) -> None:
    with pytest.raises(TypeError) as caught:
        _publish(src, resume=resume)
    assert str(caught.value) == f"resume must be True or False, not {resume!r}"


@pytest.mark.parametrize("kw,exc,said", [
    ({"member": 7}, TypeError, "member must be a str or None, not 7"),
    ({"machine": "sm89"}, TypeError, "machine must be a Machine, not str"),
    ({"link": 1}, TypeError, "link must be True or False, not 1"),
    ({"replace_needed": "no"}, TypeError, "replace_needed must be True or False, not 'no'"),
])
def test_fetch_set_arguments_of_another_type_are_refused(tmp_path: Path, kw: dict,
                                                         exc: type, said: str) -> None:
    with pytest.raises(exc) as caught:
        fetch_set(URL, tmp_path / "dest", endpoint_url=DEAD, **kw)
    assert str(caught.value) == said
    assert os.listdir(tmp_path) == []


def test_fetch_set_into_a_directory_whose_parent_is_missing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        fetch_set(URL, tmp_path / "no" / "dest", endpoint_url=DEAD)
    assert str(caught.value) == (f"{tmp_path / 'no'} is not a directory (the destination's "
                                 "parent must exist)")
    assert os.listdir(tmp_path) == []


def test_the_resume_command_repeats_every_option_given(tmp_path: Path) -> None:
    got = shlex.split(fetch_set_command(
        URL, tmp_path / "d", "sm89", machine=Machine("8.9", "10.3"), store=tmp_path / "s",
        link=True, endpoint_url="http://h:1", replace_needed=True,
        trusted_keys=[tmp_path / "t.pub"]))
    assert got == ["trtet-store", "fetch-set", URL, os.fspath(tmp_path / "d"),
                   "--member", "sm89", "--store", os.fspath(tmp_path / "s"), "--link",
                   "--replace-needed", "--compute-capability", "8.9", "--tensorrt", "10.3",
                   "--endpoint-url", "http://h:1", "--trusted-key", os.fspath(tmp_path / "t.pub")]
    # Nothing asked for, nothing said: the same machine picks the same member.
    assert shlex.split(fetch_set_command(URL, tmp_path / "d")) == [
        "trtet-store", "fetch-set", URL, os.fspath(tmp_path / "d")]


def test_the_resume_command_parses_back_to_the_same_fetch(tmp_path: Path) -> None:
    """What the command says, the CLI reads as the same options."""
    from trtet_store.cli import build_parser

    words = shlex.split(fetch_set_command(URL, tmp_path / "d", "sm89", store=tmp_path / "s",
                                          link=True, replace_needed=True,
                                          machine=Machine("8.9", None)))
    args = build_parser().parse_args(words[1:])
    assert (args.member, os.fspath(args.store), args.link, args.replace_needed) == (
        "sm89", os.fspath(tmp_path / "s"), True, True)
