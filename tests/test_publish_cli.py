"""``trtet-store publish``: publish, --replace, --resume, --list and --abort, errors in one line."""

from __future__ import annotations

import json
import os

from versions import needs_file_backed_data

from trtet_store.cli import main
from trtet_store.io.units import MiB


def test_publish_replace_resume_list_and_abort(s3env, tmp_path, capsys):
    pte, ptd = tmp_path / "model.pte", tmp_path / "w.ptd"
    pte.write_bytes(os.urandom(6 * MiB + 1))
    ptd.write_bytes(os.urandom(1000))
    url = f"s3://{s3env.bucket}/cli/model.pte"
    common = ["--endpoint-url", s3env.endpoint.url, "--journal-dir", str(s3env.journal_dir),
              "--no-progress"]
    assert main(["publish", str(pte), str(ptd), url, "--part-size", "5M", *common]) == 0
    out = capsys.readouterr().out
    assert "cli/model.pte" in out and "manifest cli/model.pte.trtet.json" in out
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="cli/w.ptd")["Body"].read()
    assert got == ptd.read_bytes()

    # Exists: refused without --replace, in one line that says what to do.
    assert main(["publish", str(pte), str(ptd), url, *common]) == 1
    err = capsys.readouterr().err
    assert "KeyExistsError" in err and "--replace" in err
    assert main(["publish", str(pte), str(ptd), url, "--replace", "--json", "--part-size",
                 "5M", *common]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_sent"] == 0 and report["bytes_unchanged"] == report["bytes_total"]

    # --resume with nothing to resume fails and sends nothing.
    assert main(["publish", str(pte), url, "--resume", *common]) == 1
    assert "no interrupted publish" in capsys.readouterr().err

    # An abandoned upload is listed, then aborted.
    upload = s3env.client.create_multipart_upload(Bucket=s3env.bucket, Key="cli/model.pte")
    assert main(["publish", "--list", f"s3://{s3env.bucket}/cli/", *common[:2]]) == 0
    assert upload["UploadId"] in capsys.readouterr().out
    assert main(["publish", "--abort", url, *common]) == 0
    assert upload["UploadId"] in capsys.readouterr().out
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_errors_are_one_line(s3env, tmp_path, capsys):
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"x")
    assert main(["publish", str(pte), "s3://no-such-bucket-trtet/m.pte", "--endpoint-url",
                 s3env.endpoint.url, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtet-store publish: BucketNotFoundError") and "\n" not in err
    assert main(["publish", str(pte), f"s3://{s3env.bucket}/m.pte", "--part-size", "1M",
                 "--endpoint-url", s3env.endpoint.url, "--no-progress"]) == 1
    assert "PartSizeError" in capsys.readouterr().err


def test_recover_names_an_interrupted_publish(s3env, tmp_path, capsys, monkeypatch, tcp_proxy):
    """``trtet-store recover`` names the uploads a stopped publish left open, and the way out."""
    import pytest
    from tcp_proxy import Fault

    import trtet_store
    from trtet_store.remote import UploadKeptError

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    work = tmp_path / "out"  # recover DIR names the publishes of DIR's files
    work.mkdir()
    pte = work / "model.pte"
    pte.write_bytes(os.urandom(6 * MiB))
    proxy = tcp_proxy(s3env.endpoint.url)
    proxy.add(Fault("request", "flip", at=1, times=100,
                    match=lambda m: m.method == "PUT" and "partNumber=" in m.target))
    url = f"s3://{s3env.bucket}/r/model.pte"
    with pytest.raises(UploadKeptError):
        trtet_store.publish(pte, url, endpoint_url=proxy.url, part_size=5 * MiB)
    assert main(["recover", str(work)]) == 0
    err = capsys.readouterr().err
    assert f"interrupted publish {url}" in err and "--abort" in err
    assert main(["publish", "--abort", url, "--endpoint-url", proxy.url]) == 0
    assert "aborted" in capsys.readouterr().out
    assert main(["recover", str(work)]) == 0
    assert "interrupted publish" not in capsys.readouterr().err
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


FACTORY = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), \\
        (torch.randn(2, 16),)
"""


@needs_file_backed_data  # the engines go to engines.ptd (external_engine_data)
def test_compile_and_save_publish_sends_what_save_program_writes_and_writes_nothing(
        s3env, tmp_path, capsys, monkeypatch):
    """``compile-and-save --publish`` without OUT: the objects equal compile-and-save OUT's files.

    The TensorRT build is stubbed at its seam (the same engine bytes both
    times); OUT is written by ``compile_and_save`` (``save_program``) and, with
    ``--publish`` too, published as files. No ``.pte``/``.ptd`` (nor the
    staging store) is left locally by the publish without OUT.
    """
    from digests import digest, file_digest

    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "model.py").write_text(FACTORY)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the default staging place
    url = f"s3://{s3env.bucket}/c/m.pte"
    target = f"{tmp_path / 'model.py'}:make"
    common = ["--no-progress", "--external-engine-data", "engines"]
    try:
        with installed(FakeBuilder(engine_sizes=(3 * MiB,), seeds=(7,))):
            assert main(["compile-and-save", target, "--publish", url, "--endpoint-url",
                         s3env.endpoint.url, *common]) == 0
        assert "manifest c/m.pte.trtet.json" in capsys.readouterr().out
        assert list(work.iterdir()) == []  # no output, no staging left behind

        # With OUT as well: written there (save_program), and those files published.
        out = tmp_path / "local" / "m.pte"
        out.parent.mkdir()
        with installed(FakeBuilder(engine_sizes=(3 * MiB,), seeds=(7,))):
            assert main(["compile-and-save", target, str(out), "--publish",
                         f"s3://{s3env.bucket}/w/m.pte", "--endpoint-url", s3env.endpoint.url,
                         *common]) == 0
        assert "manifest w/m.pte.trtet.json" in capsys.readouterr().out
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    written = sorted(p for p in out.parent.iterdir() if p.suffix in (".pte", ".ptd"))
    assert [p.name for p in written] == ["engines.ptd", "m.pte"]
    for path in written:
        for prefix in ("c", "w"):
            body = s3env.client.get_object(Bucket=s3env.bucket,
                                           Key=f"{prefix}/{path.name}")["Body"]
            assert digest(body.read()) == file_digest(path), (prefix, path.name)

    # Again without --replace: refused in one line before the build (the key is checked
    # first: nothing built, nothing written), the published objects kept ...
    first = FakeBuilder(engine_sizes=(3 * MiB,), seeds=(8,))
    with installed(first):
        assert main(["compile-and-save", target, "--publish", url, "--endpoint-url",
                     s3env.endpoint.url, *common]) == 1
    trt.unregister_engines(list(trt._engines.values()))
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtet-store compile-and-save: KeyExistsError") and "\n" not in err
    assert err.endswith("(checked before the build: nothing built or written)"), err
    body = s3env.client.get_object(Bucket=s3env.bucket, Key="c/m.pte")["Body"].read()
    assert digest(body) == file_digest(out)
    assert first.built == []
    assert list(work.iterdir()) == []

    # ... and the run with --replace builds, publishes, and leaves nothing behind.
    again = FakeBuilder(engine_sizes=(3 * MiB,), seeds=(9,))
    try:
        with installed(again):
            assert main(["compile-and-save", target, "--publish", url, "--endpoint-url",
                         s3env.endpoint.url, "--replace", *common]) == 0
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert len(again.built) == 1
    assert list(work.iterdir()) == []


def test_another_programs_ptd_is_refused_in_one_line(s3env, tmp_path, capsys):
    """b.pte beside a.pte, both with a cpu.ptd: --replace does not help; the line says why."""
    common = ["--endpoint-url", s3env.endpoint.url, "--journal-dir", str(s3env.journal_dir),
              "--no-progress"]
    made = {}
    for program in ("a", "b"):
        d = tmp_path / program
        d.mkdir()
        made[program] = [d / f"{program}.pte", d / "cpu.ptd"]
        for p in made[program]:
            p.write_bytes(os.urandom(1000))
    url = f"s3://{s3env.bucket}/p/"
    assert main(["publish", *map(str, made["a"]), url + "a.pte", *common]) == 0
    capsys.readouterr()
    assert main(["publish", *map(str, made["b"]), url + "b.pte", "--replace", *common]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtet-store publish: OwnedByOtherProgramError") and "\n" not in err
    assert f"cpu.ptd belongs to {url}a.pte" in err and f"e.g. {url}b/b.pte" in err
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="p/cpu.ptd")["Body"].read()
    assert got == made["a"][1].read_bytes()
    assert main(["publish", *map(str, made["b"]), url + "b/b.pte", *common]) == 0
