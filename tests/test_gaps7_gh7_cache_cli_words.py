"""The CLI's own words (``trtet_store.cli._common.cli_words``) and ``fetch --trusted-key``.

``cli_words`` turns a library message's argument spelling into the CLI's flag
(``replace=True (--replace)`` -> ``--replace``; ``backend='xnnpack'`` -> ``--backend
xnnpack``); ``fail()`` and ``report_error()`` say every message through it, so a user of
the CLI never reads a Python keyword. ``KeyExistsError.of`` is the one text of "already
exists" both say. And ``trtet-store fetch --trusted-key PATH`` with a key that cannot be
used says one line naming it (exit 1, no traceback, nothing written), before any request.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.cli import _common, main
from trtet_store.cli._common import cli_words
from trtet_store.remote.errors import KeyExistsError


@pytest.mark.parametrize(("text", "said"), [
    ("s3://b/k already exist; pass replace=True (--replace) to publish a new version",
     "s3://b/k already exist; pass --replace to publish a new version"),
    ("pass if_exists='replace' to build again", "pass --replace to build again"),
    ('pass if_exists="replace" to build again', "pass --replace to build again"),
    ("or replace=True", "or --replace"),
    ("pass backend='xnnpack' instead", "pass --backend xnnpack instead"),
    ('with backend="tensorrt"', "with --backend tensorrt"),
    ("a program built with immutable_weights=False", "a program built with --refittable"),
    ("the engine_cache applies to TensorRT only", "the --engine-cache applies to TensorRT only"),
    ("replace=Truer and backend='cuda' stay", "replace=Truer and backend='cuda' stay"),
])
def test_cli_words_say_each_argument_as_its_flag(text: str, said: str) -> None:
    assert cli_words(text) == said
    assert _common.cli_words(said) == said  # said twice: the same


def test_key_exists_error_of_says_one_text_both_ways(capsys: pytest.CaptureFixture) -> None:
    exc = KeyExistsError.of("bkt", ["m/model.pte", "m/model.pte.trtet.json"])
    assert str(exc) == ("s3://bkt/m/model.pte, s3://bkt/m/model.pte.trtet.json already "
                        "exist; pass replace=True (--replace) to publish a new version")
    assert _common.fail("publish", str(exc)) == 1
    err = capsys.readouterr().err
    assert err == ("trtet-store publish: s3://bkt/m/model.pte, s3://bkt/m/model.pte.trtet.json"
                   " already exist; pass --replace to publish a new version\n"), err


def test_fetch_with_a_trusted_key_that_cannot_be_used_says_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    bad = tmp_path / "team.key.pub"
    bad.write_text("not a key\n")
    bad.chmod(0o644)
    out = tmp_path / "out"
    out.mkdir()
    code = main(["fetch", "s3://nobucket/m/model.pte", os.fspath(out / "model.pte"),
                 "--endpoint-url", "http://127.0.0.1:9", "--trusted-key", os.fspath(bad),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("trtet-store fetch: ") and err.count("\n") == 1, err
    assert os.fspath(bad) in err and "Traceback" not in err, err
    assert os.listdir(out) == []
