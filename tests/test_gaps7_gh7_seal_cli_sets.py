"""``trtet-store fetch-set --trusted-key`` (cli/sets.py) with a key file that cannot be used
(a garbled one, another user's): one line saying what is wrong with the key, exit 1, no
traceback, and no "run the same fetch-set again" (running it again would fail the same way);
nothing is created at the destination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.cli import main

DEAD = "http://127.0.0.1:9"  # never asked: the key is refused first


@pytest.mark.parametrize("kind", ["garbled", "theirs"])
def test_a_bad_trusted_key_file_is_said_in_one_line_without_a_resume(
        tmp_path: Path, capsys, kind: str) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    key = keys / "team.key.pub"
    if kind == "garbled":
        key.write_bytes(b"not a PEM key\n")
    else:
        from trtet_store.remote.keys import keygen

        keygen(keys / "team.key")
        os.chown(key, 65534, 65534)
    out = tmp_path / "out"
    rc = main(["fetch-set", "s3://bucket-x/set/", str(out), "--trusted-key", str(key),
               "--endpoint-url", DEAD])
    err = capsys.readouterr().err
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and os.fspath(key) in lines[0], err
    assert "again" not in err and "Traceback" not in err, err
    assert not out.exists()
