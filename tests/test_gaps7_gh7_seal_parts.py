"""io.orphans.stale_parts and ``trtet-store recover DIR`` (cli/recover.py ``_parts``): the
half-written ``.part`` files of dead stores, looked at without following a link.

A link planted at a dead store's ``.part`` name is not a half-written file of
ours: it is neither named with its target's size nor followed by
``--discard-parts`` (the link itself may go; its target stays, byte for byte). A
``.part`` whose name carries no store's token is no store's: never named.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtet_store.cli import main
from trtet_store.io.orphans import stale_parts

DEAD = "0123456789abcdef"  # a store token with no lock file: its store is gone


def test_stale_parts_does_not_follow_a_link_at_a_parts_name(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    staging = out / ".trtet-staging"
    staging.mkdir(parents=True, mode=0o700)
    target = tmp_path / "victim.bin"
    target.write_bytes(b"v" * 5_000_000)
    link = staging / f"{DEAD}-cachelink.blob.part"
    os.symlink(target, link)
    real = staging / f"{DEAD}-cachereal.blob.part"
    real.write_bytes(b"r" * 3 * 1024 * 1024)
    for name in ("notes.part", "abc-cachex.blob.part"):  # no store's token in the name
        (staging / name).write_bytes(b"a user's own file")

    assert stale_parts(staging) == [(real, 3 * 1024 * 1024)]
    assert stale_parts(tmp_path / "missing") == []
    assert stale_parts(real) == []  # a file, not a directory: no parts in it
    assert main(["recover", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"{real}: 3.0 MiB half-written" in said and "1 half-written file(s)" in said
    assert "link" not in said and "4.8 MiB" not in said and "nothing to recover" not in said, said

    assert main(["recover", str(out), "--discard-parts"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("1 half-written file(s) of killed runs removed (3.0 MiB)"), said
    assert not real.exists()
    assert target.read_bytes() == b"v" * 5_000_000  # never followed
    assert (staging / "notes.part").read_bytes() == b"a user's own file"
    assert sorted(os.listdir(staging)) == ["abc-cachex.blob.part", "notes.part"]
