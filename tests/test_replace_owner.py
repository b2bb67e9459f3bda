"""Issue 44 follow-up: replacing another user's file in a sticky directory others may
write to does not hand them the new file.

Replacing a destination keeps its mode and owner (a root ``save`` over a user's
file stays the user's, documented). In a directory that group or others may
write to (mode 1777, like /tmp), anyone can create the destination first: a
real other uid (a forked child that drops to 65534) makes ``model.pte`` mode
0666, then root fetches (or writes) over it. The new file must be root's, its
mode the old one less group/other write, so the attacker cannot rewrite the
program root is about to run. Elsewhere (a directory only its owner writes,
or a non-sticky one where anyone who may write may replace any file anyway)
the old owner is kept as before (tests/test_writer_edges.py: a 0777 mount).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from test_staging_dir_attacks import NOBODY, as_nobody, program, shared_dir, state, victim

from trtet_store import write_file


def planted(dest: Path) -> None:
    def plant() -> None:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, b"nobody's bytes")
        os.fchmod(fd, 0o666)
        os.close(fd)

    as_nobody(plant)
    assert os.lstat(dest).st_uid == NOBODY


def test_a_fetch_over_another_users_file_in_a_1777_directory_is_ours(s3env, make_fs):
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, _ = victim(mnt)
    dest = shared / "model.pte"
    url = program(s3env)
    planted(dest)
    home_before = state(home)
    proc = subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "fetch", url, os.fspath(dest),
         "--endpoint-url", s3env.endpoint.url, "--no-progress"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.fspath(Path(__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr
    for name in ("model.pte", "model.ptd"):
        st = os.lstat(shared / name)
        assert (st.st_uid, st.st_gid) == (0, 0), name
        assert stat.S_IMODE(st.st_mode) & 0o022 == 0, (name, oct(st.st_mode))
    assert stat.S_IMODE(os.lstat(dest).st_mode) == 0o644  # 0666 less group/other write
    assert state(home) == home_before


def test_a_write_over_another_users_file_in_a_1777_directory_is_ours(make_fs):
    mnt = make_fs("btrfs", 256)
    shared = shared_dir(mnt)
    dest = shared / "model.pte"
    planted(dest)
    write_file(dest, [b"root's program" * 100])
    st = os.lstat(dest)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    assert dest.read_bytes() == b"root's program" * 100


def test_a_root_write_over_a_users_file_in_their_own_directory_keeps_their_owner(make_fs):
    """The documented behaviour, kept: the directory only its owner writes."""
    mnt = make_fs("xfs", 320)
    home = mnt / "user"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, NOBODY)
    dest = home / "model.pte"
    dest.write_bytes(b"old")
    os.chown(dest, NOBODY, NOBODY)
    os.chmod(dest, 0o640)
    write_file(dest, [b"new program" * 100])
    st = os.lstat(dest)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o640)
