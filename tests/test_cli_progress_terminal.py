"""One progress rule for every command, as a user sees it (issue 45 item 21).

``fetch``, ``publish`` and ``cache push`` run as subprocesses against the
test S3 server: with stderr a pipe, no bar line at all (no 0 % or 100 %);
with stderr a real pseudo-terminal, a bar, and on one that reports size 0x0
(as ``script -q`` gives) a bar of the default width, not blank lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from terminal import run_on_terminal

from trtet_store.cli._common import DEFAULT_WIDTH
from trtet_store.io.units import MiB

ROOT = Path(__file__).resolve().parent.parent


def _env(s3) -> dict[str, str]:
    return {**os.environ, **s3.endpoint.environ(), "PYTHONPATH": os.fspath(ROOT)}


def run_on(stderr: str, argv: list, env: dict, size: tuple[int, int] = (0, 0)
           ) -> tuple[int, str]:
    """The command with stderr a ``"pipe"`` or a ``"terminal"`` of ``size`` (rows, columns)."""
    command = [sys.executable, "-m", "trtet_store", *map(os.fspath, argv)]
    if stderr == "pipe":
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                              cwd=ROOT)
        return done.returncode, done.stderr
    code, _out, err = run_on_terminal(command, size=size, cwd=ROOT, env=env)
    return code, err


def _draws(err: str, label: str) -> list[str]:
    """The bar's drawings: tqdm rewrites its line with carriage returns."""
    return [x for x in re.split(r"[\r\n]+", err) if x.startswith(f"{label}:")]


def _commands(s3, tmp_path: Path, n: int) -> dict[str, list]:
    src = tmp_path / "model.pte"
    if not src.exists():
        src.write_bytes(os.urandom(6 * MiB))
    url = f"s3://{s3.bucket}/p{n}/model.pte"
    ep = ["--endpoint-url", s3.endpoint.url]
    return {"publish": ["publish", src, url, *ep, "--journal-dir", tmp_path / "journal"],
            "fetch": ["fetch", url, tmp_path / f"got{n}.pte", *ep]}


@pytest.mark.parametrize("where", ["pipe", "terminal 0x0", "terminal 24x100"])
def test_fetch_and_publish_draw_a_bar_on_a_terminal_only(s3, tmp_path, where):
    env = _env(s3)
    commands = _commands(s3, tmp_path, 1)
    size = (0, 0) if where == "terminal 0x0" else (24, 100)
    for label in ("publish", "fetch"):  # publish first: fetch reads what it published
        rc, err = run_on(where.split()[0], commands[label], env, size)
        assert rc == 0, err
        draws = _draws(err, label)
        if where == "pipe":
            assert draws == [] and "%|" not in err, err  # no 0 % / 100 % lines on a pipe
            continue
        assert draws and draws[-1].startswith(f"{label}: 100%|"), err[-500:]
        width = DEFAULT_WIDTH if where == "terminal 0x0" else 100
        # tqdm fills the width (a resized terminal's bar keeps its last column free)
        assert width - 1 <= len(draws[-1].rstrip()) <= width, (len(draws[-1]), draws[-1])
    assert (tmp_path / "got1.pte").read_bytes() == (tmp_path / "model.pte").read_bytes()
