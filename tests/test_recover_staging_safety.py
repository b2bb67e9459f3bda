"""Issue 44 follow-up: recover never reads or writes through an unsafe ``.trtet-staging``.

fetch checks ``DIR/.trtet-staging`` before it calls recover; ``trtet_store.recover``
and ``trtet-store recover DIR`` called alone now check it too. In a mode 1777
directory another user (uid 65534, a forked child that drops to it, or a link
``lchown``-ed to it) plants the staging directory: a link to a root-only
directory holding a blob-named file (which recover would list, reading its
sidecar and locks, as an orphan), a directory of their own, or one of ours left
group-writable. Each is refused in one line, before anything is read; the
victim's digests and every listing are byte-identical.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_staging_dir_attacks import NOBODY, as_nobody, shared_dir, state, victim

from trtet_store import recover
from trtet_store.io import STAGING_DIR, UnsafeDirectoryError

#: A blob of a dead store (no lock file): recover lists it as an orphan.
BLOB = "0123456789abcdef-0.blob"


def planted_victim(mnt: Path) -> Path:
    home, _ = victim(mnt)
    (home / BLOB).write_bytes(b"root's staged engine bytes\n" * 100)
    os.chmod(home / BLOB, 0o600)
    return home


def run_cli(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "recover", os.fspath(directory)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.fspath(Path(__file__).parents[1])})


def test_recover_refuses_a_staging_link_and_reads_nothing_through_it(make_fs):
    mnt = make_fs("ext4", 128)
    shared = shared_dir(mnt)
    home = planted_victim(mnt)
    staging = shared / STAGING_DIR
    os.symlink(home, staging)
    os.lchown(staging, NOBODY, NOBODY)
    home_before, shared_before = state(home), state(shared)
    with pytest.raises(UnsafeDirectoryError) as err:
        recover(shared)
    assert str(err.value) == (
        f"refusing the staging directory {staging}: it is a symbolic link; "
        "remove it (trtet_store did not make it), then recover again")
    proc = run_cli(shared)
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"trtet-store recover: UnsafeDirectoryError: {err.value}"]
    assert state(home) == home_before
    assert state(shared) == shared_before


def test_recover_refuses_a_staging_dir_another_user_made(make_fs):
    mnt = make_fs("xfs", 320)
    shared = shared_dir(mnt)
    staging = shared / STAGING_DIR

    def plant() -> None:
        os.mkdir(staging, 0o755)
        os.chmod(staging, 0o755)
        (staging / BLOB).write_bytes(b"nobody's bytes\n")

    as_nobody(plant)
    before = state(shared)
    with pytest.raises(UnsafeDirectoryError, match=f"owned by uid {NOBODY}, not by you"):
        recover(shared)
    proc = run_cli(shared)
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert state(shared) == before


def test_recover_refuses_a_group_writable_staging_dir_of_ours(make_fs):
    mnt = make_fs("btrfs", 256)
    shared = shared_dir(mnt)
    staging = shared / STAGING_DIR
    staging.mkdir()
    os.chmod(staging, 0o1777)  # sticky does not help: others can still plant names
    (staging / BLOB).write_bytes(b"root's bytes\n")
    before = state(shared)
    with pytest.raises(UnsafeDirectoryError, match="writable by group or others"):
        recover(shared)
    assert state(shared) == before


def test_recover_still_lists_orphans_in_a_staging_dir_of_ours(make_fs):
    """The check refuses only what is unsafe: a 0700 staging directory of ours is read."""
    mnt = make_fs("ext4", 128)
    shared = shared_dir(mnt)
    staging = shared / STAGING_DIR
    staging.mkdir(mode=0o700)
    (staging / BLOB).write_bytes(b"root's bytes\n")
    outcomes = recover(shared)
    assert [(o.action, o.journal) for o in outcomes] == [("orphan", staging / BLOB)]
