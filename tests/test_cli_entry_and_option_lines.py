"""The command as a user starts it (issue 45 items 9, 10, 12).

``python -m trtet_store`` is the command as ``python -m trtet_store.cli`` is
(help and version both ways); a negative ``--older-than`` and a malformed
``--endpoint-url`` are refused in one line that names the option and says
what to give, exit code 2, before any request. Each runs as a subprocess and
reads stderr as a user sees it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import trtet_store

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str, module: str = "trtet_store", cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.fspath(ROOT), "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


@pytest.mark.parametrize("module", ["trtet_store", "trtet_store.cli"])
def test_python_m_trtet_store_is_the_command_with_help_and_version(module):
    version = run("--version", module=module)
    assert (version.returncode, version.stdout, version.stderr) == \
        (0, f"trtet-store {trtet_store.__version__}\n", "")
    helped = run("--help", module=module)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: trtet-store [-h] [--version]")
    for command in ("fetch", "publish", "cache", "compile-and-save"):
        assert command in helped.stdout
    sub = run("cache", "--help", module=module)
    assert sub.returncode == 0 and sub.stdout.startswith("usage: trtet-store cache"), sub.stderr


@pytest.mark.parametrize("age", [["--older-than", "-1d"], ["--older-than=-1d"],
                                 ["--older-than", "-0.5h"]])
def test_a_negative_age_is_one_line_naming_the_option(age):
    done = run("cache", "prune", "--remote", "s3://bucket/team", *age,
               "--endpoint-url", "http://127.0.0.1:9")
    assert done.returncode == 2
    value = age[-1].split("=")[-1]
    assert done.stderr == (f"trtet-store cache prune: argument --older-than: an age cannot be "
                           f"negative: {value!r}; give how long ago, e.g. 7d (0s: everything)\n")
    assert done.stdout == ""


def _listening_port() -> tuple[socket.socket, int]:
    """A port that accepts connections and records them: a request would be seen."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0)
    return sock, sock.getsockname()[1]


# Every command that takes --endpoint-url, with what else it needs to get that far.
COMMANDS = {
    "fetch": ["fetch", "s3://bucket/m.pte", "{tmp}/m.pte"],
    "publish": ["publish", "{tmp}/m.pte", "s3://bucket/m.pte"],
    "publish --list": ["publish", "--list", "s3://bucket/m.pte"],
    "publish --abort": ["publish", "--abort", "s3://bucket/m.pte"],
    "compile-and-save": ["compile-and-save", "{tmp}/m.py:f", "{tmp}/out.pte",
                         "--engine-cache-remote", "s3://bucket/team"],
    "cache list": ["cache", "--dir", "{tmp}/cache", "list", "--remote", "s3://bucket/t"],
    "cache prune": ["cache", "prune", "--remote", "s3://bucket/t", "--older-than", "7d"],
    "cache push": ["cache", "--dir", "{tmp}/cache", "push", "--remote", "s3://bucket/t"],
    "cache pull": ["cache", "--dir", "{tmp}/cache", "pull", "k", "--remote", "s3://bucket/t"],
}


NOT_URLS = [
    ("127.0.0.1:{port}", "no http:// or https://"),
    ("ftp://127.0.0.1:{port}", "the scheme is 'ftp'"),
    ("http://127.0.0.1:port", "Port could not be cast to integer value as 'port'"),
    ("http://:{port}", "no host"),
]


@pytest.mark.parametrize(("command", "url", "why"), [
    *[(c, "notaurl", "no http:// or https://") for c in sorted(COMMANDS)],
    *[("fetch", url, why) for url, why in NOT_URLS],
    *[("cache list", url, why) for url, why in NOT_URLS],
])
def test_a_malformed_endpoint_url_is_one_line_before_any_request(command, url, why, tmp_path):
    listener, port = _listening_port()
    try:
        (tmp_path / "m.pte").write_bytes(b"program")
        (tmp_path / "m.py").write_text("raise SystemExit('imported')\n")
        before = sorted(os.listdir(tmp_path))
        url = url.format(port=port)
        argv = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
        done = run(*argv, "--endpoint-url", url, cwd=tmp_path)
        prog = " ".join(["trtet-store", *[w for w in command.split() if not w.startswith("-")]])
        assert done.stderr == (f"{prog}: argument --endpoint-url: {url!r} is not an endpoint "
                               f"URL ({why}); give http(s)://host[:port], e.g. "
                               "http://127.0.0.1:8333\n")
        assert done.returncode == 2
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection was made: judged before any request
        assert sorted(os.listdir(tmp_path)) == before  # nothing written
    finally:
        listener.close()


def test_a_good_endpoint_url_is_taken_as_given():
    from trtet_store.cli._common import endpoint_url_arg

    for url in ("http://127.0.0.1:8333", "https://s3.example.com", "http://[::1]:9000/",
                "https://minio.local:9000/path"):
        assert endpoint_url_arg(url) == url
