"""compile-and-save from a shell with the stub builder (issue 45 item 13).

``TRTET_STUB_TENSORRT=1`` puts :mod:`trtet_store.testing.stub_tensorrt` at the
TensorRT seam for one ``trtet-store compile-and-save``: the whole path after
the build runs for real. Run as a user runs it (a process of its own, stdout
and stderr as printed): a build, then a local hit, then on a second cache a
remote hit through SeaweedFS. The variable's misuses are refused in one line
before anything is written.

Each command is the CLI's ``main`` in a warm child (tests/warm.py: a process forked
from a server that imported torch, ExecuTorch and the stub once), not a fresh
interpreter: nothing here is about imports or the console script (test_cli_entry_and_option_lines
and test_first_hour keep those fresh).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import warm

from trtet_store.cli.stub_builder import ENV

ROOT = Path(__file__).resolve().parent.parent

FACTORY = '''\
import torch


def make():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
'''

STUB_LINE = (f"trtet-store compile-and-save: {ENV}=1: engines are built by the stub builder "
             "(a test aid, no TensorRT): the programs hold no runnable engine")


def _run(cwd: Path, *argv: object, stub: str | None = "1", s3=None, prelude: str = ""
         ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.fspath(ROOT)
    if stub is not None:
        env[ENV] = stub
    if s3 is not None:
        env.update(s3.endpoint.environ())
    code = f"{prelude}import sys; from trtet_store.cli import main; sys.exit(main())"
    return warm.run(code, argv, timeout=600, cwd=cwd, env=env)


def _engine_lines(out: str) -> list[str]:
    return [x.strip().split(": ", 1)[1] for x in out.splitlines()
            if x.strip().startswith("engine ")]


def test_compile_and_save_from_the_shell_builds_then_hits_then_hits_remotely(s3, tmp_path):
    (tmp_path / "m.py").write_text(FACTORY)
    (tmp_path / "out").mkdir()
    remote = ["--engine-cache-remote", f"s3://{s3.bucket}/team",
              "--endpoint-url", s3.endpoint.url, "--no-progress"]

    built = _run(tmp_path, "compile-and-save", "m.py:make", "out/a.pte",
                 "--engine-cache", tmp_path / "cache-a", *remote, s3=s3)
    assert built.returncode == 0, built.stderr
    assert built.stderr.count(STUB_LINE) == 1, built.stderr
    [event] = _engine_lines(built.stdout)
    said, timing = event.split("; ", 1)  # the build's own words, then its timing cache's
    assert said.startswith("miss, cached (") and said.endswith(", published"), built.stdout
    assert timing == "timing cache: cold", built.stdout  # the first build of this key

    hit = _run(tmp_path, "compile-and-save", "m.py:make", "out/b.pte",
               "--engine-cache", tmp_path / "cache-a", *remote, s3=s3)
    assert hit.returncode == 0, hit.stderr
    [event] = _engine_lines(hit.stdout)
    assert event.startswith("hit, "), hit.stdout

    # A second machine: an empty cache, the same bucket. Nothing is built: downloaded.
    far = _run(tmp_path, "compile-and-save", "m.py:make", "out/c.pte",
               "--engine-cache", tmp_path / "cache-b", *remote, s3=s3)
    assert far.returncode == 0, far.stderr
    [event] = _engine_lines(far.stdout)
    assert event.startswith("remote-hit, 4.0 MiB downloaded, "), far.stdout
    # The same stub engine, byte for byte, in all three programs.
    a, b, c = ((tmp_path / "out" / n).read_bytes() for n in ("a.pte", "b.pte", "c.pte"))
    assert a == b == c


@pytest.mark.parametrize(("value", "argv", "prelude", "said"), [
    ("yes", [], "", f"{ENV}='yes': set it to 1 to build engines with the stub TensorRT "
     "builder (a test aid), or unset it"),
    ("1", ["--backend", "xnnpack"], "", f"{ENV}=1 stands in for the TensorRT build, and "
     f"--backend xnnpack builds no engines: unset {ENV}"),
    # (the warm child has the stub imported: hidden from sys.modules and its package)
    ("1", [], "import sys; sys.modules['trtet_store.testing.stub_tensorrt'] = None; "
     "import trtet_store.testing as t; t.__dict__.pop('stub_tensorrt', None); ",
     f"{ENV}=1 needs the stub builder, trtet_store.testing.stub_tensorrt, and its "
     "requirements (torch, xxhash): import of trtet_store.testing.stub_tensorrt halted; None "
     f"in sys.modules; install them or unset {ENV}"),
])
def test_the_stub_is_refused_in_one_line_where_it_cannot_serve(tmp_path, value, argv,
                                                               prelude, said):
    (tmp_path / "m.py").write_text(FACTORY)
    (tmp_path / "out").mkdir()
    done = _run(tmp_path, "compile-and-save", "m.py:make", "out/a.pte", "--engine-cache",
                tmp_path / "cache", *argv, stub=value, prelude=prelude)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"trtet-store compile-and-save: {said}", done.stderr
    assert [x for x in done.stderr.splitlines() if x.startswith("trtet-store")] == \
        [f"trtet-store compile-and-save: {said}"]
    assert done.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["m.py", "out"]  # no cache, no staging
    assert os.listdir(tmp_path / "out") == []


def test_the_stub_is_documented_in_the_commands_help(tmp_path):
    done = _run(tmp_path, "compile-and-save", "--help", stub=None)
    assert done.returncode == 0, done.stderr
    assert f"Test aid: {ENV}=1 builds the engines with the stub TensorRT" in \
        " ".join(done.stdout.split()), done.stdout
