"""The CLI's one progress bar (``cli._common.ProgressBar``) takes every progress shape of the API.

An object with ``.done``/``.total`` (publish, fetch, io's Progress), one with
a ``.phase`` too (the benchmark's BenchProgress), ``(done, total)`` and
``(phase, done, total)``: the same bar states for the same updates, a bar
per phase. One rule for every command (issue 45 item 21): a bar only when
stderr is a terminal, none on a pipe; a terminal that reports size 0x0 gets
a bar of the default width (tests/test_cli_progress_terminal.py runs the
commands so).
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios
from types import SimpleNamespace

import pytest

from trtet_store.cli._common import DEFAULT_WIDTH, ProgressBar


class Terminal:
    """sys.stderr on a real pseudo-terminal (24 x 120) while entered; :meth:`drawn` reads it.

    Entered in the test itself: pytest puts its own sys.stderr back between a
    fixture's setup and the test's call.
    """

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        os.set_blocking(self.master, False)
        self.stream = open(slave, "w", buffering=1)  # noqa: SIM115 - closed by close()
        self.saved = None

    def __enter__(self) -> Terminal:
        self.saved, sys.stderr = sys.stderr, self.stream
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self.saved

    def drawn(self) -> str:
        self.stream.flush()
        out = b""
        while True:
            try:
                out += os.read(self.master, 65536)
            except BlockingIOError:
                return out.decode(errors="replace")

    def close(self) -> None:
        self.stream.close()
        os.close(self.master)


@pytest.fixture
def terminal():
    term = Terminal()
    yield term
    term.close()


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
def test_a_phase_gets_its_own_bar_in_either_shape(shape, terminal):
    with terminal, ProgressBar("x", leave=False) as bar:
        seen = _feed(bar, shape)
    assert seen == [("stage", 0, 100), ("stage", 40, 100), ("stage", 100, 100),
                    ("write", 10, 50), ("write", 50, 50)]
    assert bar.bar is None  # closed on leaving


@pytest.mark.parametrize("shape", ["object", "two arguments"])
def test_updates_without_a_phase_drive_one_bar_labelled_by_the_command(shape, terminal):
    with terminal, ProgressBar("fetch") as bar:
        seen = _feed(bar, shape)
    # One bar throughout: it follows the total when it changes (a restarted fetch) and
    # goes back when done does.
    assert seen == [("fetch", 0, 100), ("fetch", 40, 100), ("fetch", 100, 100),
                    ("fetch", 10, 50), ("fetch", 50, 50)]


def test_postfix_on_a_terminal_and_nothing_when_disabled(terminal):
    with terminal, ProgressBar("publish", lambda p: f"sent {p.sent}") as bar:
        for i in range(1, 201):
            bar(SimpleNamespace(done=i, total=200, sent=i))
        assert bar.bar.postfix == "sent 200"
    draws = [line for line in terminal.drawn().replace("\r", "\n").splitlines()
             if line.startswith("publish")]
    assert draws and "200/200" in draws[-1] and "sent 200" in draws[-1], draws
    with terminal:
        off = ProgressBar("publish", enabled=False)
        off(SimpleNamespace(done=1, total=2))
    assert off.bar is None and terminal.drawn() == ""


def test_no_bar_off_a_terminal(capsys):
    """stderr a pipe or a file (capsys): no bar is made, nothing is printed, for any shape."""
    with ProgressBar("fetch", lambda p: "x") as bar:
        bar(SimpleNamespace(done=0, total=10))
        bar(SimpleNamespace(done=10, total=10))
        bar(5, 10)
        bar("stage", 10, 10)
        assert bar.bar is None
    assert capsys.readouterr().err == ""


def test_a_terminal_of_size_zero_gets_a_bar_of_the_default_width(terminal):
    fcntl.ioctl(terminal.stream.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    assert os.get_terminal_size(terminal.stream.fileno()).columns == 0
    with terminal, ProgressBar("fetch") as bar:
        bar(SimpleNamespace(done=0, total=100))
        bar(SimpleNamespace(done=100, total=100))
    lines = [x for x in terminal.drawn().replace("\r", "\n").splitlines() if x.strip()]
    assert lines and lines[-1].startswith("fetch: 100%|"), lines
    assert len(lines[-1]) == DEFAULT_WIDTH, lines[-1]


def _wait(waited: float, over: bool = False):
    from trtet_store.cache.tier import LeaseWait

    return LeaseWait("trt-k", "h" * 32, "builder7", 42, None, waited, over)


def test_a_wait_is_a_line_of_its_own_and_the_next_bar_is_a_bar(terminal, capsys):
    """Issue 45 item 17: the wait's line counts the seconds; a later update gets a real bar."""
    with terminal, ProgressBar("writing", leave=False) as bar:
        bar.waiting(_wait(3))
        bar.waiting(_wait(65))
        assert bar.bar.desc == "waiting 1:05 for builder7 (pid 42) to build trt-k"
        bar(SimpleNamespace(done=1, total=2))  # the wait ended without saying so: a new bar
        assert (bar.bar.desc, bar.bar.n, bar.bar.total) == ("writing", 1, 2)
        assert bar.bar.bar_format != "{desc}"
        bar.waiting(_wait(1, over=True))  # the end of a wait no longer shown: the bar stays
        assert bar.bar is not None and bar.bar.desc == "writing"
    drawn = terminal.drawn()
    assert "waiting 0:03 for builder7 (pid 42) to build trt-k" in drawn
    assert "waiting 1:05 for builder7" in drawn
    with terminal, ProgressBar("writing") as bar:
        bar.waiting(_wait(3))
        bar.waiting(_wait(5, over=True))
        assert bar.bar is None
    with ProgressBar("writing") as bar:  # off a terminal (capsys): nothing
        bar.waiting(_wait(3))
        assert bar.bar is None
    assert capsys.readouterr().err == ""
