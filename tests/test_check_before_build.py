"""compile-and-save checks its remote destinations before the build (with real TensorRT,
the build takes minutes to hours): ``--publish`` the bucket, the credentials and an
existing key without ``--replace``; ``--engine-cache-remote`` the key files, the bucket
and the credentials. Each refusal is one line; the factory never ran, the stub builder
built nothing, nothing was written here or in the bucket. On SeaweedFS.

Before: the build ran, the program was written, and then "BucketNotFoundError: ...
(the files are written: publish them with ...)"; a trusted key that did not exist was
"FileNotFoundError: [Errno 2] No such file or directory: '/nope.pub'".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trtet_store.cli import main

FACTORY = '''\
import pathlib

import torch


def make():
    pathlib.Path(__file__).with_name("factory-ran").write_text("ran")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
'''

BEFORE = "(checked before the build: nothing built or written)"


@pytest.fixture
def builder(monkeypatch):
    """The stub builder compile-and-save uses (as TRTET_STUB_TENSORRT=1 gives), held here
    so the test can count its builds."""
    from trtet_store.cli import compile as compile_cli
    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed

    built = FakeBuilder()
    monkeypatch.setattr(compile_cli, "stub_builder",
                        lambda backend: installed(built, refitter=FakeRefitter()))
    return built


def _said(err: str) -> list[str]:
    """stderr's lines but the stub builder's notice (printed first, as for every build)."""
    return [x for x in err.splitlines() if "=1: engines are built by the stub" not in x]


def _tree(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(top.rglob("*"))}


def _objects(s3) -> list[str]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])
    return sorted(o["Key"] for o in got)


def _cases(s3, keys: Path) -> dict[str, tuple[list[str], str]]:
    url = f"s3://{s3.bucket}"
    return {
        "publish, no bucket": (
            ["out/a.pte", "--publish", "s3://no-such-bucket/a.pte"],
            "--publish s3://no-such-bucket/a.pte: BucketNotFoundError: bucket "
            f"'no-such-bucket' does not exist at {s3.endpoint.url}"),
        "publish, key exists": (
            ["out/a.pte", "--publish", f"{url}/m/a.pte"],
            f"KeyExistsError: {url}/m/a.pte already exist; pass --replace to publish a new "
            "version"),
        "publish without OUT, manifest exists": (
            ["--publish", f"{url}/n/a.pte", "--store", "store"],
            f"KeyExistsError: {url}/n/a.pte.trtet.json already exist; pass --replace to "
            "publish a new version"),
        "engine-cache-remote, no bucket": (
            ["out/a.pte", "--engine-cache=cache", "--engine-cache-remote",
             "s3://no-such-bucket/tier"],
            "--engine-cache-remote s3://no-such-bucket/tier: BucketNotFoundError: bucket "
            f"'no-such-bucket' does not exist at {s3.endpoint.url}"),
        "engine-cache-remote, no trusted key file": (
            ["out/a.pte", "--engine-cache=cache", "--engine-cache-remote", f"{url}/tier",
             "--trusted-key", str(keys / "missing.pub")],
            f"--trusted-key {keys / 'missing.pub'}: no such file"),
        "engine-cache-remote, no signing key file": (
            ["out/a.pte", "--engine-cache=cache", "--engine-cache-remote", f"{url}/tier",
             "--signing-key", str(keys / "missing.key")],
            f"--signing-key {keys / 'missing.key'}: no such file"),
    }


CASES = ["publish, no bucket", "publish, key exists", "publish without OUT, manifest exists",
         "engine-cache-remote, no bucket", "engine-cache-remote, no trusted key file",
         "engine-cache-remote, no signing key file"]


@pytest.mark.parametrize("case", CASES)
def test_refused_before_the_build(case, s3env, builder, tmp_path, monkeypatch, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.py").write_text(FACTORY)
    (work / "out").mkdir()
    monkeypatch.chdir(work)
    s3env.client.put_object(Bucket=s3env.bucket, Key="m/a.pte", Body=b"another program")
    s3env.client.put_object(Bucket=s3env.bucket, Key="n/a.pte.trtet.json", Body=b"{}")
    argv, said = _cases(s3env, tmp_path / "keys")[case]
    files, objects = _tree(work), _objects(s3env)

    code = main(["compile-and-save", "m.py:make", *argv, "--no-progress",
                 "--endpoint-url", s3env.endpoint.url])
    err = capsys.readouterr().err
    assert code == 1, err
    assert _said(err) == [f"trtet-store compile-and-save: {said} {BEFORE}"]
    assert builder.built == [] and not (work / "factory-ran").exists()
    assert _tree(work) == files and _objects(s3env) == objects


@pytest.mark.parametrize("where", ["--publish", "--engine-cache-remote"])
def test_wrong_credentials_refused_before_the_build(where, s3env, builder, tmp_path,
                                                    monkeypatch, capsys) -> None:
    (tmp_path / "m.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    url = f"s3://{s3env.bucket}/" + ("m/a.pte" if where == "--publish" else "tier")
    extra = [] if where == "--publish" else ["--engine-cache=cache"]
    code = main(["compile-and-save", "m.py:make", "a.pte", where, url, *extra,
                 "--no-progress", "--endpoint-url", s3env.endpoint.url])
    err = capsys.readouterr().err
    [err] = _said(err)
    assert code == 1
    assert err.startswith(f"trtet-store compile-and-save: {where} {url}: AccessDeniedError: "
                          f"HeadBucket s3://{s3env.bucket} at {s3env.endpoint.url} was "
                          "refused: access denied"), err
    assert err.endswith(BEFORE), err
    assert builder.built == [] and sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]
    assert _objects(s3env) == []


def test_with_replace_and_a_usable_tier_it_builds_and_publishes(s3env, builder, tmp_path,
                                                                monkeypatch, capsys) -> None:
    """The control: the same commands with what they need do build (the counter counts)."""
    (tmp_path / "m.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    s3env.client.put_object(Bucket=s3env.bucket, Key="m/a.pte", Body=b"another program")
    url = f"s3://{s3env.bucket}"
    code = main(["compile-and-save", "m.py:make", "a.pte", "--publish", f"{url}/m/a.pte",
                 "--replace", "--engine-cache=cache", "--engine-cache-remote", f"{url}/tier",
                 "--no-progress", "--endpoint-url", s3env.endpoint.url])
    err = capsys.readouterr().err
    assert code == 0, err
    assert len(builder.built) == 1 and (tmp_path / "factory-ran").exists()
    assert "m/a.pte.trtet.json" in _objects(s3env)
