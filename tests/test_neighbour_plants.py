"""Issue 44 follow-up: a fetch reads its directory's other programs and data never
through a link, and never blocks on a FIFO.

In a mode 1777 directory where root fetched ``a.pte``/``cpu.ptd`` (real
ExecuTorch programs, tests/programs.py, on SeaweedFS), another user (uid 65534,
a forked child that drops to it) plants ``.ptd``/``.pte`` names: a FIFO (whose
plain open waits forever for a writer) and links to root-only files. The next
fetch (the CLI, in a subprocess with a timeout) completes, or refuses under the
rule for neighbours that cannot be read, in bounded time; the victim's files
are byte-identical and the plants are left as they were.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from test_fetch_neighbours import built, put  # noqa: F401 - the fixture, shared
from test_staging_dir_attacks import as_nobody, shared_dir, state, victim
from versions import needs_file_backed_data

from trtet_store.remote.download.receive import fetch

pytestmark = needs_file_backed_data


def cli_fetch(url: str, dest: Path, s3) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "fetch", url, os.fspath(dest),
         "--endpoint-url", s3.endpoint.url, "--no-progress"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.fspath(Path(__file__).parents[1])})


def test_a_fifo_and_a_link_at_ptd_names_never_block_a_fetch(s3env, make_fs, built):  # noqa: F811
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, secret = victim(mnt)
    dest = shared / "a.pte"
    fetch(put(s3env, "m", "a.pte", built["a"]), dest, client=s3env.client)
    url = put(s3env, "m", "a.pte", built["g"])  # the newer version: gpu.ptd, not cpu.ptd

    def plant() -> None:
        os.mkfifo(shared / "zz.ptd", 0o666)
        os.symlink(secret, shared / "yy.ptd")

    as_nobody(plant)
    home_before = state(home)
    proc = cli_fetch(url, dest, s3env)  # a blocked open: TimeoutExpired, the test fails
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == built["g"]["program.pte"]
    assert (shared / "gpu.ptd").read_bytes() == built["g"]["gpu.ptd"]
    assert not (shared / "cpu.ptd").exists()  # a's data, dropped by the new manifest
    assert stat.S_ISFIFO((shared / "zz.ptd").lstat().st_mode)
    assert os.readlink(shared / "yy.ptd") == os.fspath(secret)
    assert state(home) == home_before


def test_a_link_at_a_pte_name_is_a_program_that_cannot_be_read(s3env, make_fs, built):  # noqa: F811
    """Followed, the link's target (a root-only program that needs gpu.ptd) would let the
    fetch replace cpu.ptd; not followed, it is unreadable and so taken to need cpu.ptd."""
    mnt = make_fs("xfs", 320)
    shared = shared_dir(mnt)
    home, _ = victim(mnt)
    (home / "g.pte").write_bytes(built["g"]["program.pte"])
    dest = shared / "a.pte"
    fetch(put(s3env, "m", "a.pte", built["a"]), dest, client=s3env.client)
    url = put(s3env, "m", "a.pte", built["b"])  # other weights in cpu.ptd
    as_nobody(lambda: os.symlink(home / "g.pte", shared / "z.pte"))
    home_before, shared_before = state(home), state(shared)
    proc = cli_fetch(url, dest, s3env)
    assert proc.returncode == 1, proc.stderr
    assert (f"z.pte could not be read (OSError: [Errno 40] it is a symbolic link (not "
            f"followed): '{shared / 'z.pte'}'), so it is taken to need it") in proc.stderr
    assert state(home) == home_before
    assert state(shared) == shared_before
    shutil.rmtree(shared / ".trtet-staging", ignore_errors=True)
