"""Fetch never writes a .ptd through a link another user planted (issue 44, finding 3).

In a mode 1777 directory on the root disk, uid 65534 (a child process that
drops to it with setresgid/setresuid) plants ``cpu.ptd -> <root-only>/victim``
(a 0600 root file in a 0700 root directory) and ``gpu.ptd -> <root-only>/new``
(dangling). Root then runs ``trtet-store fetch`` (a subprocess) of an honest
program that names both: rc 0, the victim byte-identical, nothing created in
the root-only directory (its listing byte-identical), and ``cpu.ptd`` /
``gpu.ptd`` are now regular files of root's with the published bytes.

A link at a manifest's name is not read either: pointed at a file that holds
the published bytes, its bytes are downloaded, not reused through it, and the
fetch does not call the link "up to date".

The documented exception stays: the destination path itself, when it is a
link, is written through to its target (docs/concepts/tensorrt-programs.md, "a symlink
destination is written through to its target").
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from attacker import listing
from digests import file_digest
from test_fetch_support import MiB, put_program

from trtet_store.remote.download.receive import fetch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacker is another uid: root")

NOBODY = 65534


def as_nobody(code: str) -> None:
    """Run ``code`` (Python) as uid/gid 65534, in a child process that drops to it first."""
    drop = (f"import os\nos.setgroups([])\nos.setresgid({NOBODY}, {NOBODY}, {NOBODY})\n"
            f"os.setresuid({NOBODY}, {NOBODY}, {NOBODY})\nassert os.geteuid() == {NOBODY}\n")
    subprocess.run([sys.executable, "-c", drop + code], check=True, timeout=60)


@pytest.fixture
def scene(here_fs: Path) -> dict[str, Path]:
    """A 1777 shared directory, and a root-only directory with a 0600 victim file."""
    shared = here_fs / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private = here_fs / "root-only"
    private.mkdir(mode=0o700)
    victim = private / "victim"
    victim.write_bytes(b"root's secret configuration\n")
    os.chmod(victim, 0o600)
    return {"shared": shared, "private": private, "victim": victim}


def honest(s3, prefix: str) -> dict[str, bytes]:
    files = {"model.pte": os.urandom(MiB + 3), "cpu.ptd": os.urandom(MiB + 5),
             "gpu.ptd": os.urandom(7000)}
    put_program(s3.client, s3.bucket, prefix, {n: (d, [len(d)]) for n, d in files.items()})
    return files


def test_a_planted_link_and_a_dangling_link_are_replaced_never_written_through(
        s3env, scene):
    shared, private, victim = scene["shared"], scene["private"], scene["victim"]
    files = honest(s3env, "honest")
    as_nobody(f"os.symlink({os.fspath(victim)!r}, {os.fspath(shared / 'cpu.ptd')!r})\n"
              f"os.symlink({os.fspath(private / 'new')!r}, {os.fspath(shared / 'gpu.ptd')!r})")
    assert os.lstat(shared / "cpu.ptd").st_uid == NOBODY  # the attacker's links
    victim_before, private_before = file_digest(victim), listing(private)
    done = subprocess.run(
        [sys.executable, "-m", "trtet_store.cli", "fetch", f"s3://{s3env.bucket}/honest/model.pte",
         str(shared / "model.pte"), "--endpoint-url", s3env.endpoint.url, "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done
    # Nothing outside the shared directory changed: the victim, and its directory's listing.
    assert file_digest(victim) == victim_before
    assert listing(private) == private_before  # no 'new', no temp file beside the victim
    for name in ("cpu.ptd", "gpu.ptd"):
        st = os.lstat(shared / name)
        assert stat.S_ISREG(st.st_mode), (name, oct(st.st_mode))
        assert (st.st_uid, st.st_gid) == (0, 0), (name, st.st_uid)  # root's, not the link's
        assert (shared / name).read_bytes() == files[name]
    assert (shared / "model.pte").read_bytes() == files["model.pte"]
    assert sorted(os.listdir(shared)) == ["cpu.ptd", "gpu.ptd", "model.pte"]


def test_a_link_at_a_ptd_name_is_never_read_as_an_earlier_version(s3env, scene):
    shared = scene["shared"]
    files = honest(s3env, "same")
    # The attacker's own copy of the published bytes, and links to it at every name.
    copy, source = shared / "their-copy", scene["shared"].parent / "published-cpu.ptd"
    source.write_bytes(files["cpu.ptd"])  # world-readable: anyone can download the bytes
    as_nobody(f"open({os.fspath(copy)!r}, 'wb').write(open({os.fspath(source)!r}, 'rb').read())\n"
              f"os.symlink({os.fspath(copy)!r}, {os.fspath(shared / 'cpu.ptd')!r})")
    url = f"s3://{s3env.bucket}/same/model.pte"
    report = fetch(url, shared / "model.pte", client=s3env.client)
    cpu = next(o for o in report.objects if o.name == "cpu.ptd")
    assert cpu.bytes_reused == 0 and cpu.bytes_downloaded == len(files["cpu.ptd"])
    assert stat.S_ISREG(os.lstat(shared / "cpu.ptd").st_mode)
    assert os.lstat(shared / "cpu.ptd").st_uid == 0
    assert (shared / "cpu.ptd").read_bytes() == files["cpu.ptd"]
    assert copy.read_bytes() == files["cpu.ptd"] and os.stat(copy).st_uid == NOBODY


def test_the_destination_itself_as_a_link_is_written_through_as_documented(s3env, here_fs):
    files = honest(s3env, "dest")
    real = here_fs / "elsewhere"
    real.mkdir()
    (here_fs / "model.pte").symlink_to(real / "model.pte")
    fetch(f"s3://{s3env.bucket}/dest/model.pte", here_fs / "model.pte", client=s3env.client)
    assert (here_fs / "model.pte").is_symlink()
    assert (real / "model.pte").read_bytes() == files["model.pte"]
    # Its .ptd files go beside the path given (the link's directory), as regular files.
    assert stat.S_ISREG(os.lstat(here_fs / "cpu.ptd").st_mode)
    assert not (real / "cpu.ptd").exists()


def test_a_link_at_an_empty_ptd_name_is_not_up_to_date(s3env, scene):
    """An empty .ptd's name linked to /dev/null (size 0, like the object) is still replaced."""
    shared = scene["shared"]
    pte = os.urandom(MiB + 3)
    put_program(s3env.client, s3env.bucket, "v1", {"model.pte": (pte, [len(pte)])})
    fetch(f"s3://{s3env.bucket}/v1/model.pte", shared / "model.pte", client=s3env.client)
    as_nobody(f"os.symlink('/dev/null', {os.fspath(shared / 'empty.ptd')!r})")
    put_program(s3env.client, s3env.bucket, "v2", {"model.pte": (pte, [len(pte)]),
                                                   "empty.ptd": (b"", [0])})
    report = fetch(f"s3://{s3env.bucket}/v2/model.pte", shared / "model.pte",
                   client=s3env.client)
    assert not report.up_to_date
    st = os.lstat(shared / "empty.ptd")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and st.st_uid == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
