"""Issue 44, finding 2: fetch never writes through a staging directory it did not make.

In a mode 1777 directory (like /tmp, or a team's scratch directory) another
user can create ``.trtet-staging`` before us, and every name a fetch uses in
it is computable (``fetch-<sha256(dest)[:16]>.journal.tmp``). The attacker
here is a real other uid: a forked child that drops to 65534 (``nobody``),
or a link ``lchown``-ed to it. The fetch runs as root, through the CLI in a
subprocess where the attack is the trial's, against SeaweedFS (``s3``).

Each test proves that nothing outside the named place changed: the digests
of the victim's files and the victim directory's listing, byte-identical;
and that the refusal came before any request (a counting proxy saw no
connection).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from attacker import NOBODY, as_nobody, shared_dir
from attacker import tree as state
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, engine_program, put_program

from trtet_store.io import (
    STAGING_DIR,
    RecordFile,
    SafeDir,
    UnsafeDirectoryError,
    UnsafeLockFileError,
    read_records,
    write_atomic,
)
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.errors import FetchVerificationError
from trtet_store.testing.proxy import CountingProxy
from trtet_store.testing.s3server import S3Endpoint

ENGINES = (2 * MiB, MiB + 5)


def victim(root: Path) -> tuple[Path, Path]:
    """A root-only directory (0700) with a root-only file (0600): what the attacker aims at."""
    home = root / "root-only"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    secret = home / "shadow.conf"
    secret.write_bytes(b"root:secret-hash:19000:0:99999:7:::\n" * 50)
    os.chmod(secret, 0o600)
    return home, secret


def program(s3, prefix: str = "m") -> str:
    data, sizes = engine_program(3, ENGINES)
    put_program(s3.client, s3.bucket, prefix, {"model.pte": (data, sizes),
                                               "model.ptd": (engine_bytes(4, 3000), [3000])})
    return f"s3://{s3.bucket}/{prefix}/model.pte"


def test_cli_fetch_refuses_a_staging_dir_another_user_made_and_never_writes_its_planted_link(
        s3env, make_fs):
    """The trial's attack: nobody's .trtet-staging (0755) with the journal's temp name
    linked to a root-only file. root's ``trtet-store fetch`` refuses, before any request."""
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, secret = victim(mnt)
    dest = shared / "model.pte"
    staging = shared / STAGING_DIR
    url = program(s3env)

    def plant() -> None:
        os.mkdir(staging, 0o755)
        os.chmod(staging, 0o755)
        os.symlink(secret, staging / f"fetch-{fetch_id(dest)}.journal.tmp")

    as_nobody(plant)
    assert os.lstat(staging).st_uid == NOBODY
    home_before, shared_before = state(home), state(shared)
    with CountingProxy.for_url(s3env.endpoint.url) as proxy:
        proc = subprocess.run(
            [sys.executable, "-m", "trtet_store.cli", "fetch", url, os.fspath(dest),
             "--endpoint-url", proxy.endpoint_url, "--no-progress"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": os.fspath(Path(__file__).parents[1])})
        connections = proxy.connections
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        f"trtet-store fetch: UnsafeDirectoryError: refusing the staging directory {staging}: "
        f"it is owned by uid {NOBODY}, not by you (uid 0); remove it, or fetch into another "
        "directory"]
    assert state(home) == home_before  # the root-only file: byte-identical, nothing beside it
    assert state(shared) == shared_before  # nothing written in the attacker's directory
    assert connections == 0  # refused before any request, let alone a download


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775], ids=["0777", "1777", "0775"])
def test_a_staging_dir_of_ours_that_others_may_write_is_refused(s3, here_fs, mode):
    url = program(s3)
    staging = here_fs / STAGING_DIR
    staging.mkdir()
    os.chmod(staging, mode)
    with pytest.raises(UnsafeDirectoryError, match=rf"refusing the staging directory {staging}: "
                       rf"it is writable by group or others \(mode {mode:o}\); remove it"):
        fetch(url, here_fs / "model.pte", client=s3.client)
    assert sorted(os.listdir(here_fs)) == [STAGING_DIR] and os.listdir(staging) == []


def test_a_staging_dir_that_is_a_link_is_refused_and_nothing_lands_in_its_target(
        s3, make_fs, tcp_proxy):
    """The link (nobody's, in a 1777 directory) points at root's own directory. The fetch
    would fail verification (a byte flipped on every ranged GET) and, through the link,
    leave its .run files, journal and lock there while saying "nothing local was changed":
    it is refused first, with the link named, and nothing is written there."""
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, secret = victim(mnt)
    url = program(s3)
    link = shared / STAGING_DIR
    os.symlink(home, link)
    os.lchown(link, NOBODY, NOBODY)
    home_before, shared_before = state(home), state(shared)
    ranged = lambda m: "range" in (m.request.headers if m.request else {})  # noqa: E731
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "flip", at=100, match=ranged,
                                              times=1000)])
    with pytest.raises(UnsafeDirectoryError) as caught:
        fetch(url, shared / "model.pte", client=S3Endpoint(proxy.url).client(read_timeout=5),
              range_size=MiB, attempts=2)
    assert str(caught.value) == (f"refusing the staging directory {link}: it is a symbolic "
                                 "link; remove it, or fetch into another directory")
    assert not isinstance(caught.value, FetchVerificationError)
    assert "nothing local was changed" not in str(caught.value)
    assert state(home) == home_before  # no .run, journal or lock in the link's target
    assert state(shared) == shared_before


def test_a_dangling_staging_link_is_refused_before_any_request(s3, make_fs):
    """A link to a name that does not exist yet (fetch would create the target through it)."""
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, _ = victim(mnt)
    url = program(s3)
    link = shared / STAGING_DIR
    os.symlink(home / "made-by-fetch", link)
    os.lchown(link, NOBODY, NOBODY)
    home_before, shared_before = state(home), state(shared)
    with CountingProxy.for_url(s3.endpoint.url) as proxy:
        with pytest.raises(UnsafeDirectoryError, match="it is a symbolic link"):
            fetch(url, shared / "model.pte", client=S3Endpoint(proxy.endpoint_url).client())
        connections = proxy.connections
    assert connections == 0
    assert state(home) == home_before and state(shared) == shared_before


def test_a_journal_temp_name_planted_as_a_link_in_our_own_staging_is_never_written_through(
        s3, make_fs):
    """Our own 0700 .trtet-staging, holding a link at the journal's temp name (and at its
    journal's name): the fetch replaces the links, never follows them, and succeeds."""
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, secret = victim(mnt)
    url = program(s3)
    dest = shared / "model.pte"
    staging = shared / STAGING_DIR
    staging.mkdir(mode=0o700)
    tmp_link = staging / f"fetch-{fetch_id(dest)}.journal.tmp"
    os.symlink(secret, tmp_link)
    home_before = state(home)
    report = fetch(url, dest, client=s3.client, range_size=MiB)
    assert report.verified
    assert state(home) == home_before  # the root-only file: byte-identical
    assert sorted(os.listdir(shared)) == ["model.ptd", "model.pte"]  # link and staging gone


def test_record_file_replaces_a_planted_temp_link_and_refuses_a_linked_journal(tmp_path):
    victim_file = tmp_path / "victim"
    victim_file.write_bytes(b"keep me\n")
    journal = tmp_path / "j" / "x.journal"
    journal.parent.mkdir(mode=0o700)
    os.symlink(victim_file, journal.parent / "x.journal.tmp")
    rf = RecordFile(journal)
    rf.start([{"a": 1}])
    rf.append({"b": 2})
    rf.close()
    assert victim_file.read_bytes() == b"keep me\n"
    assert not journal.is_symlink() and read_records(journal) == [{"a": 1}, {"b": 2}]
    assert sorted(os.listdir(journal.parent)) == ["x.journal"]
    # A journal that is a link is not appended to, nor read through.
    journal.unlink()
    os.symlink(victim_file, journal)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        rf.reopen()
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        read_records(journal)
    assert victim_file.read_bytes() == b"keep me\n"


def test_safedir_creates_only_new_files_and_write_atomic_never_follows(tmp_path):
    victim_file = tmp_path / "victim"
    victim_file.write_bytes(b"keep me\n")
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    os.symlink(victim_file, d / "planted")
    with SafeDir.open(d) as sd:
        with pytest.raises(FileExistsError):
            sd.create("planted")
        fd = sd.create_replacing("planted")
        os.write(fd, b"ours")
        os.close(fd)
        with pytest.raises(FileExistsError):
            sd.write_atomic("planted", b"x", replace=False)
        sd.write_atomic("new", b"small")
    assert victim_file.read_bytes() == b"keep me\n"
    assert (d / "planted").read_bytes() == b"ours" and not (d / "planted").is_symlink()
    os.symlink(victim_file, d / "target")
    write_atomic(d / "target", b"replaced")
    assert victim_file.read_bytes() == b"keep me\n"
    assert (d / "target").read_bytes() == b"replaced"
    assert sorted(os.listdir(d)) == ["new", "planted", "target"]  # no temp file left
    assert (d / "new").read_bytes() == b"small"


@pytest.mark.parametrize("case", ["link", "foreign", "group-writable"])
def test_safedir_refuses_a_link_another_users_directory_and_a_group_writable_one(
        tmp_path, case):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    d = tmp_path / "d"
    if case == "link":
        os.symlink(real, d)
        problem = "it is a symbolic link"
    elif case == "foreign":
        d.mkdir(mode=0o700)
        os.chown(d, NOBODY, NOBODY)
        problem = f"it is owned by uid {NOBODY}, not by you"
    else:
        d.mkdir()
        os.chmod(d, 0o770)
        problem = r"it is writable by group or others \(mode 770\)"
    with pytest.raises(UnsafeDirectoryError, match=problem):
        SafeDir.open(d)
    with pytest.raises(UnsafeDirectoryError, match=problem):
        write_atomic(d / "f", b"x")
    assert os.listdir(real) == []
    if case != "link":
        assert os.listdir(d) == []


def test_safedir_accepts_a_sticky_directory_of_ours_but_staging_does_not(tmp_path):
    from trtet_store.io import staging_directory

    d = tmp_path / "sticky"
    d.mkdir()
    os.chmod(d, 0o1777)
    SafeDir.open(d).close()
    with pytest.raises(UnsafeDirectoryError, match="mode 1777"):
        staging_directory(d)


def test_missing_parents_are_made_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        SafeDir.open(tmp_path / "a" / "b", create=True).close()
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "a").st_mode & 0o777) == oct(0o700)
    assert oct(os.stat(tmp_path / "a" / "b").st_mode & 0o777) == oct(0o700)


def test_a_dangling_lock_link_in_our_own_staging_creates_nothing_at_its_target(s3, make_fs):
    """A link at the fetch's lock name pointing at a name in root's directory: opening the
    lock with O_CREAT through it would create that file. The fetch fails (UnsafeLockFileError,
    errno ELOOP), naming the lock and saying to remove it, and nothing appears there."""
    mnt = make_fs("ext4", 256)
    shared = shared_dir(mnt)
    home, _ = victim(mnt)
    url = program(s3)
    dest = shared / "model.pte"
    staging = shared / STAGING_DIR
    staging.mkdir(mode=0o700)
    lock = staging / f"fetch-{fetch_id(dest)}.lock"
    os.symlink(home / "created-through-the-lock", lock)
    home_before = state(home)
    with pytest.raises(UnsafeLockFileError, match="it is a symbolic link .*; remove it") \
            as caught:
        fetch(url, dest, client=s3.client, range_size=MiB)
    assert caught.value.filename == os.fspath(lock)
    assert state(home) == home_before
    assert not dest.exists()


def test_the_publish_journal_refuses_a_linked_directory_and_never_truncates_through_its_lock(
        tmp_path):
    from trtet_store.remote.upload.journal import Journal, journal_path

    victim_file = tmp_path / "victim"
    victim_file.write_bytes(b"keep me\n")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    linked = tmp_path / "linked"
    os.symlink(real, linked)
    j = Journal(journal_path(linked, "b", "k/m.pte"))
    with pytest.raises(UnsafeDirectoryError, match=f"refusing the publish journal directory "
                       f"{linked}: it is a symbolic link; remove it, or pass another journal_dir"):
        j.lock("s3://b/k/m.pte", "k/m.pte")
    assert os.listdir(real) == []
    # A lock file that is a hard link to another file (planted in a sticky directory of
    # ours that others may write to): locked, but its pid line is not written through it.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    j = Journal(journal_path(sticky, "b", "k/m.pte"))
    os.link(victim_file, j.lock_path)
    j.lock("s3://b/k/m.pte", "k/m.pte")
    j.unlock()
    assert victim_file.read_bytes() == b"keep me\n"
