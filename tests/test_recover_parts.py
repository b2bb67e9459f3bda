"""``trtet-store recover DIR`` names the half-written files (``.part``) a killed run left in
``DIR/.trtet-staging``, with their sizes and the flag that removes them (``--discard-parts``);
a running store's part is neither named nor removed.

Before: "DIR: nothing to recover", beside a killed build's 384 MiB ``.part`` file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trtet_store.cli import main

KILLED = """
import os, sys
from trtet_store.io import BlobStore
store = BlobStore(sys.argv[1])
with open(store.directory / f"{store.token}-cacheabc.blob.part", "wb") as f:
    f.truncate(384 << 20)  # sparse: a killed build's engine, half-written
os._exit(9)  # killed: no close, no clean-up
"""


def _killed_run(staging: Path) -> Path:
    subprocess.run([sys.executable, "-c", KILLED, str(staging)], check=False, timeout=120,
                   env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                        "PATH": "/usr/bin:/bin"})
    [part] = staging.glob("*-cacheabc.blob.part")
    return part


def test_recover_names_a_killed_runs_part_and_its_size(tmp_path, capsys) -> None:
    from trtet_store.io import BlobStore

    out = tmp_path / "out"
    staging = out / ".trtet-staging"
    running = BlobStore(staging)  # a live store's part: its own, never named
    live = running.directory / f"{running.token}-cachedef.blob.part"
    live.write_bytes(b"x" * 4096)
    part = _killed_run(staging)
    try:
        assert main(["recover", str(out)]) == 0
        said = capsys.readouterr().out
        assert said == (f"{part}: 384.0 MiB half-written by a killed run (a .part: never "
                        "used)\n"
                        f"1 half-written file(s) of killed runs, 384.0 MiB: remove them with "
                        f"trtet-store recover {out} --discard-parts\n"), said
        assert part.exists() and live.exists()  # named only
        assert main(["recover", str(out), "--discard-parts"]) == 0
        said = capsys.readouterr().out
        assert said == f"1 half-written file(s) of killed runs removed (384.0 MiB) from {staging}\n"
        assert not part.exists() and live.read_bytes() == b"x" * 4096
        assert main(["recover", str(out)]) == 0
        assert capsys.readouterr().out == f"{out}: nothing to recover\n"
    finally:
        running.close()
