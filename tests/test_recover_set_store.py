"""``trtet-store recover DIR`` names the set store's partial download a killed ``fetch-set`` left.

``fetch-set`` downloads each blob into its content store beside DIR
(``DIR/../.trtet-blobs``), staged in the store's own ``.trtet-staging``. A
real child is SIGKILLed inside a blob's download (tests/sets_kill_child.py);
``recover DIR`` must name that download (the blob, its URL, the bytes staged
of its size) as it names a plain fetch's, change nothing, and
``--discard-fetches`` must remove exactly its staged files and journal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sets_helpers import write, xxh
from test_sets_kill import run_child

from trtet_store.io import STAGING_DIR
from trtet_store.io.units import MiB
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set

REPO = Path(__file__).resolve().parents[1]
SHARED, OWN = 6 * MiB, MiB + 17


def recover_cli(*argv: str | os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", "recover", *map(str, argv)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {os.fspath(p.relative_to(directory)): (p.lstat().st_mode, p.lstat().st_size)
            for p in sorted(directory.rglob("*"))}


def test_recover_names_and_discards_a_killed_fetch_sets_download_in_the_store(s3env, here_fs):
    url = f"s3://{s3env.bucket}/rel/"
    shared = write(here_fs / "src" / "foundation.ptd", SHARED, 1)
    pte = write(here_fs / "src" / "a" / "model.pte", OWN, 2)
    publish_set({"a": [pte, shared]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    machine = here_fs / "machine"
    machine.mkdir()
    dest = machine / "a"
    # model.pte's blob (2 ranges), then 2 of foundation.ptd's 6: killed there.
    child = run_child({"op": "fetch", "phase": "download", "url": url, "member": "a",
                       "dest": str(dest), "endpoint": s3env.endpoint.url, "after": 4})
    assert child.stdout.strip() == "killed" and child.returncode == -9, child.stderr[-2000:]
    store = machine / ".trtet-blobs"
    staging = store / STAGING_DIR
    before = listing(machine)
    assert any(n.endswith(".journal") for n in os.listdir(staging))

    done = recover_cli(dest)
    assert done.returncode == 0, done.stderr
    line = (f"interrupted download of a killed fetch-set in the set store {store}: blob "
            f"{xxh(shared)} from {url}blobs/{xxh(shared)} (2.0 of 6.0 MiB staged, since ")
    named = [ln for ln in done.stdout.splitlines() if ln.startswith(line)]
    assert len(named) == 1, done.stdout
    found = named[0]
    assert re.search(r"resume: run the same `trtet-store fetch-set` again \(it downloads only "
                     r"what is missing\); discard: trtet-store recover \S+ --discard-fetches$",
                     found), found
    assert "nothing to recover" not in done.stdout
    assert listing(machine) == before  # naming it changed nothing

    done = recover_cli(dest, "--discard-fetches")
    assert done.returncode == 0, done.stderr
    assert (f"discarded the set store's download of blob {xxh(shared)} from {url}blobs/"
            f"{xxh(shared)} (2.0 of 6.0 MiB staged: ") in done.stdout, done.stdout
    assert not staging.exists() or os.listdir(staging) == []
    after = listing(machine)
    assert {k: v for k, v in before.items() if not k.startswith(".trtet-blobs/.trtet-staging")} \
        == after  # the store's blob, seals and the empty member directory are as they were
    assert recover_cli(dest).stdout.strip() == f"{dest}: nothing to recover"
