"""The CLI's one progress bar (``cli._common.ProgressBar``) takes every progress shape of the API.

An object with ``.done``/``.total`` (publish, fetch, io's Progress), one with
a ``.phase`` too (the benchmark's BenchProgress), ``(done, total)`` and
``(phase, done, total)``: the same bar states for the same updates, a bar
per phase, and off a terminal few lines (tests/test_cli_errors.py checks the
at-most-one-line-per-LOG_INTERVAL rule through a real fetch).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trtet_store.cli._common import ProgressBar

UPDATES = [("stage", 0, 100), ("stage", 40, 100), ("stage", 100, 100),
           ("write", 10, 50), ("write", 50, 50)]


def _feed(bar: ProgressBar, shape: str) -> list[tuple[str, int, float]]:
    """Feed UPDATES in ``shape``; the (desc, n, total) of the bar after each."""
    seen = []
    for phase, done, total in UPDATES:
        if shape == "object":
            bar(SimpleNamespace(done=done, total=total))
        elif shape == "object with phase":
            bar(SimpleNamespace(phase=phase, done=done, total=total))
        elif shape == "two arguments":
            bar(done, total)
        else:
            bar(phase, done, total)
        seen.append((bar.bar.desc, bar.bar.n, bar.bar.total))
    return seen


@pytest.mark.parametrize("shape", ["object with phase", "three arguments"])
def test_a_phase_gets_its_own_bar_in_either_shape(shape, capsys):
    with ProgressBar("x", leave=False) as bar:
        seen = _feed(bar, shape)
    assert seen == [("stage", 0, 100), ("stage", 40, 100), ("stage", 100, 100),
                    ("write", 10, 50), ("write", 50, 50)]
    assert bar.bar is None  # closed on leaving


@pytest.mark.parametrize("shape", ["object", "two arguments"])
def test_updates_without_a_phase_drive_one_bar_labelled_by_the_command(shape, capsys):
    with ProgressBar("fetch") as bar:
        seen = _feed(bar, shape)
    # One bar throughout: it follows the total when it changes (a restarted fetch) and
    # goes back when done does.
    assert seen == [("fetch", 0, 100), ("fetch", 40, 100), ("fetch", 100, 100),
                    ("fetch", 10, 50), ("fetch", 50, 50)]


def test_postfix_and_disabled_and_few_lines_off_a_terminal(capsys):
    with ProgressBar("publish", lambda p: f"sent {p.sent}") as bar:
        for i in range(1, 201):
            bar(SimpleNamespace(done=i, total=200, sent=i))
        assert bar.bar.postfix == "sent 200"
    err = capsys.readouterr().err
    draws = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("publish")]
    assert 1 <= len(draws) <= 3, draws  # stderr is no terminal here: not one per update
    assert "200/200" in draws[-1] and "sent 200" in draws[-1]
    off = ProgressBar("publish", enabled=False)
    off(SimpleNamespace(done=1, total=2))
    assert off.bar is None and capsys.readouterr().err == ""
