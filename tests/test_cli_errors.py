"""Issue 34 item 15 (and 19's progress bars): every CLI error is one line, through the real entry.

The CLI has one error table (``cli._common.ERROR_TABLE``): each command's
failure, and whatever a command does not catch itself (botocore's
``NoCredentialsError``), is printed as ``trtet-store COMMAND: line`` with a
non-zero exit and no traceback. The cases of the issue run the console entry
in a child process (``python -m trtet_store.cli``), against the real S3
test server, with the credentials removed where that is the case.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from digests import file_digest

from trtet_store.cli import main
from trtet_store.cli._common import explain
from trtet_store.io.units import MiB

FACTORY = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), \\
        (torch.randn(2, 16),)
"""


def _env(credentials: bool, s3) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION=s3.endpoint.region)
    if credentials:
        env.update(AWS_ACCESS_KEY_ID=s3.endpoint.access_key,
                   AWS_SECRET_ACCESS_KEY=s3.endpoint.secret_key)
    return env


def _cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", *map(os.fspath, argv)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("case", "words"), [
    ("fetch-no-credentials", "no AWS credentials found: set AWS_ACCESS_KEY_ID"),
    ("publish-no-credentials", "no AWS credentials found"),
    ("fetch --concurrency 0", "--concurrency 0: concurrency must be 1 to 256"),
    ("fetch --concurrency -3", "--concurrency -3: concurrency must be 1 to 256"),
    ("fetch --range-size 0", "--range-size 0: range_size must be 1 MiB"),
    ("fetch --range-size 512K", "--range-size 512K: range_size must be 1 MiB"),
])
def test_each_listed_case_is_one_line_and_a_nonzero_exit(s3, tmp_path, case, words):
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(1000))
    url = f"s3://{s3.bucket}/e/model.pte"
    endpoint = ["--endpoint-url", s3.endpoint.url, "--no-progress"]
    command, *flags = case.split()
    if command == "publish-no-credentials":
        argv = ["publish", pte, url, *endpoint]
    else:
        argv = ["fetch", url, tmp_path / "out" / "model.pte", *endpoint, *flags]
    (tmp_path / "out").mkdir()
    proc = _cli(argv, _env("no-credentials" not in command, s3), tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trtet-store {argv[0]}: "), proc.stderr
    assert words in lines[0], lines[0]
    assert list((tmp_path / "out").iterdir()) == []  # nothing written
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount", 0) == 0


def test_a_bare_enospc_names_the_file_and_the_free_space(tmp_path):
    exc = OSError(errno.ENOSPC, "No space left on device", os.fspath(tmp_path / "m.pte"))
    (line,) = explain(exc, "compile-and-save", out=tmp_path / "m.pte")
    assert f"writing {tmp_path / 'm.pte'}" in line and "MiB available" in line
    assert "staged engines are kept" in line
    (line,) = explain(ValueError("bad"), "fetch")
    assert line == "ValueError: bad"


def test_compile_and_save_refused_by_a_neighbour_is_one_line(tmp_path, capsys):
    factory = tmp_path / "model.py"
    factory.write_text(FACTORY)
    out = tmp_path / "out"
    out.mkdir()
    common = ["compile-and-save", f"{factory}:make", "--backend", "xnnpack",
              "--external-engine-data", "cpu", "--no-progress"]
    assert main([*common, os.fspath(out / "a.pte")]) == 0
    capsys.readouterr()
    before = {p.name: file_digest(p) for p in out.iterdir()}
    assert main([*common, os.fspath(out / "b.pte")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trtet-store compile-and-save: "), err
    assert "NeededByAnotherError" in err and "--replace-needed" in err, err
    assert {p.name: file_digest(p) for p in out.iterdir()} == before
    assert main([*common, os.fspath(out / "b.pte"), "--replace-needed"]) == 0


def test_progress_to_a_pipe_draws_no_bar(s3env, tmp_path):
    """Item 19, then issue 45 item 21: a real fetch of 32 ranges, stderr a pipe: no bar line."""
    import trtet_store

    src = tmp_path / "model.pte"
    src.write_bytes(os.urandom(32 * MiB))
    url = f"s3://{s3env.bucket}/p/model.pte"
    trtet_store.publish(src, url, endpoint_url=s3env.endpoint.url)
    proc = _cli(["fetch", url, tmp_path / "got.pte", "--endpoint-url", s3env.endpoint.url,
                 "--range-size", "1M"], _env(True, s3env), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert file_digest(tmp_path / "got.pte") == file_digest(src)
    # Text mode reads tqdm's carriage returns as line ends: one line per draw.
    draws = sum(line.startswith("fetch:") for line in proc.stderr.splitlines())
    assert draws == 0, proc.stderr[-300:]
