"""fetch-set / publish-set with a key file that cannot be used: one line, exit 1.

A trusted key others may write (or a key of another user) is a
KeyFileError (a ValueError, not an OSError): said in one line naming the
file and the fix, no traceback, nothing created, and no "run the same
fetch-set again" (running it again cannot help).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from trtet_store.cli import main  # noqa: E402
from trtet_store.remote.keys import keygen  # noqa: E402

DEAD = "http://127.0.0.1:9"


@pytest.fixture
def pub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", os.fspath(tmp_path / "no-config"))
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    keygen(d / "team.key")
    os.chmod(d / "team.key.pub", 0o666)
    return d / "team.key.pub"


def test_fetch_set_with_a_trusted_key_others_may_write_says_so_in_one_line(
        pub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["fetch-set", "s3://bucket/llm/v3/", os.fspath(out), "--member", "a",
                 "--trusted-key", os.fspath(pub), "--endpoint-url", DEAD])
    err = capsys.readouterr().err
    assert code == 1, (code, err)
    assert f"trusted key {pub} has mode 0666: other users could replace it; chmod go-w it" \
        in err, err
    assert "Traceback" not in err and "fetch-set again" not in err and "--trusted-key" not in \
        err.split("chmod go-w it", 1)[1], err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["keys"]


def test_publish_set_with_a_signing_key_others_may_read_says_so_in_one_line(
        pub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = pub.parent / "team.key"
    os.chmod(key, 0o640)
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pte").write_bytes(b"pte")
    code = main(["publish-set", "s3://bucket/llm/v3/", "--member", "a",
                 os.fspath(src / "model.pte"),
                 "--signing-key", os.fspath(key), "--endpoint-url", DEAD])
    err = capsys.readouterr().err
    assert code in (1, 2), (code, err)
    assert f"signing key {key} has mode 0640: other users could read it; chmod 600 it" in err, err
    assert "Traceback" not in err
