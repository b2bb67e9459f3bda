"""``trtet-store compile-and-save``'s flags reach the call (trtet_store/cli/compile.py,
``cmd_compile_and_save``, ``_lowering``): each given a non-default value, its effect seen.

The CLI builds ``compile_and_save``'s keywords and its ``LoweringOptions`` (``_lowering``)
from the flags one by one; a flag dropped on the way is silently ignored (``--etrecord``
writes no ETRecord, ``--segment-alignment`` aligns at the default, ``--engine-cache-verify
full`` trusts seals). The real ``compile_and_save`` runs (stub TensorRT builder, as
``TRTET_STUB_TENSORRT=1`` gives), wrapped only to record what it was handed. And
``--signing-key`` / ``--trusted-key`` without ``--engine-cache-remote`` are refused in one
line before anything is built or written (a key given to nothing is a user's mistake that
would otherwise publish nothing signed and trust everything).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtet_store.cli import main

pytestmark = pytest.mark.executorch(reason="compile-and-save lowers a model (stub builder)")

FACTORY = '''\
import pathlib

import torch


def make():
    pathlib.Path(__file__).with_name("factory-ran").write_text("ran")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
'''


@pytest.fixture
def builder(monkeypatch):
    """The stub builder compile-and-save uses (as TRTET_STUB_TENSORRT=1 gives), counted."""
    from trtet_store.cli import compile as compile_cli
    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed

    built = FakeBuilder()
    monkeypatch.setattr(compile_cli, "stub_builder",
                        lambda backend: installed(built, refitter=FakeRefitter()))
    return built


@pytest.fixture
def handed(monkeypatch):
    """What cmd_compile_and_save handed the real trtet_store.compile_and_save."""
    import trtet_store

    real = trtet_store.compile_and_save
    calls: list[dict] = []

    def recording(source, inputs, out, **kwargs):
        calls.append(dict(kwargs))
        return real(source, inputs, out, **kwargs)

    monkeypatch.setattr(trtet_store, "compile_and_save", recording)
    return calls


def test_cmd_compile_and_save_hands_each_flag_on(builder, handed, here_fs, monkeypatch,
                                                 capsys) -> None:
    """--etrecord, --segment-alignment, --store, --timeout, --engine-cache DIR and
    --engine-cache-verify full: each reaches compile_and_save, and its effect is there."""
    monkeypatch.chdir(here_fs)
    (here_fs / "m.py").write_text(FACTORY)
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "m.py:make", "out/a.pte", "--etrecord",
                 "--segment-alignment", "16384", "--store", "stage", "--timeout", "7",
                 "--engine-cache=cache", "--engine-cache-verify", "full", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    [kw] = handed
    lowering = kw["lowering"]
    # _lowering: --etrecord is the lowering's generate_etrecord, and the file is written.
    assert lowering.generate_etrecord is True and lowering.backend == "tensorrt"
    assert (here_fs / "out" / "a_etrecord.bin").stat().st_size > 0
    # The keywords: each flag's value, not the default.
    assert kw["segment_alignment"] == 16384
    assert kw["timeout"] == 7
    assert Path(kw["store"]) == Path("stage")
    assert kw["engine_cache"].hit_verify == "full"
    assert Path(kw["engine_cache"].directory).resolve() == (here_fs / "cache").resolve()
    assert len(builder.built) == 1
    # --segment-alignment 16384 aligned the segments (the default with TensorRT is 4096).
    code = main(["inspect", "out/a.pte", "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert code == 0
    assert shown["header"]["segment_base_offset"] % 16384 == 0


def test_cmd_compile_and_save_defaults_write_no_etrecord(builder, handed, here_fs,
                                                         monkeypatch, capsys) -> None:
    """The control: without the flags, none of it (no ETRecord, the default alignment, no
    cache, no store given)."""
    monkeypatch.chdir(here_fs)
    (here_fs / "m.py").write_text(FACTORY)
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "m.py:make", "out/a.pte", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    [kw] = handed
    assert kw["lowering"].generate_etrecord is False
    assert not {"segment_alignment", "timeout", "store", "engine_cache"} & set(kw)
    assert sorted(p.name for p in (here_fs / "out").iterdir()) == ["a.pte"]


@pytest.mark.parametrize("flag", ["--signing-key", "--trusted-key"])
def test_cmd_compile_and_save_refuses_a_key_without_engine_cache_remote(
        flag, builder, handed, here_fs, monkeypatch, capsys) -> None:
    """A key given without --engine-cache-remote is refused in one line: nothing built,
    nothing written, compile_and_save never called (the key file is never read)."""
    monkeypatch.chdir(here_fs)
    (here_fs / "m.py").write_text(FACTORY)
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "m.py:make", "out/a.pte", "--engine-cache=cache", flag,
                 str(here_fs / "no-such.key"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--signing-key and --trusted-key need --engine-cache-remote s3://BUCKET" in err
    assert handed == [] and builder.built == []
    assert list((here_fs / "out").iterdir()) == [] and not (here_fs / "cache").exists()


@pytest.mark.parametrize("flag", [["--keep-versions", "2"], ["--versioned"]])
def test_cmd_compile_and_save_versioned_says_the_path_through_its_link(
        flag, builder, handed, here_fs, monkeypatch, capsys) -> None:
    """A versioned write (--versioned, or --keep-versions alone) says where the program is
    (``_written``): OUT itself does not exist, the path through the link it switched does,
    and the line names where the link points now."""
    import os

    monkeypatch.chdir(here_fs)
    (here_fs / "m.py").write_text(FACTORY)
    (here_fs / "out").mkdir()
    code = main(["compile-and-save", "m.py:make", "out/a.pte", *flag, "--no-progress"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    [kw] = handed
    assert kw["versioned"] == (2 if flag[0] == "--keep-versions" else True)
    link = here_fs / "out" / "a"
    target = os.readlink(link)
    first = printed.out.splitlines()[0]
    assert first == f"wrote {link / 'a.pte'} ({link} -> {target})", first
    assert (link / "a.pte").is_file() and not (here_fs / "out" / "a.pte").exists()


@pytest.mark.parametrize("how", ["factory", "method"])
def test_cmd_compile_and_save_publish_without_out_refuses_local_flags_first(
        how, s3env, builder, handed, here_fs, monkeypatch, capsys) -> None:
    """--publish without OUT (a FACTORY alone, or --method alone): --etrecord is refused
    before anything else, a usage error: no request to the bucket, the factory never run,
    nothing built or written (the no-OUT test counts --method's positionals as none)."""
    monkeypatch.chdir(here_fs)
    (here_fs / "m.py").write_text(FACTORY)
    source = ["m.py:make"] if how == "factory" else ["--method", "forward=m.py:make"]
    url = f"s3://{s3env.bucket}/p/a.pte"
    code = main(["compile-and-save", *source, "--publish", url, "--etrecord",
                 "--endpoint-url", s3env.endpoint.url, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--etrecord need OUT (they write local files); --publish without OUT writes " \
           "none" in err, err
    assert not (here_fs / "factory-ran").exists(), "the factory ran before the refusal"
    assert handed == [] and builder.built == []
    assert sorted(p.name for p in here_fs.iterdir()) == ["m.py"]
    got = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    assert got == []
