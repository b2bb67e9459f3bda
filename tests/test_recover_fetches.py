"""``trtet-store recover DIR`` names the fetches a failure left staged, and discards them (item 20).

A fetch is cut for real: through a loopback proxy that resets every ranged
GET after the first four, against the test S3 server. Its run file, journal
and lock file stay in ``DIR/.trtet-staging``. ``recover`` must list it with
the command that resumes it and the one that discards it, and change
nothing; the resume command, run as printed, must finish the fetch;
``--discard-fetches`` must remove exactly that fetch's files, and never
those of a fetch that holds its lock.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_program, put_program

from trtet_store.io import STAGING_DIR, ConcurrentWriteError
from trtet_store.remote.download.interrupted import (
    StagingLinkError,
    discard_fetch,
    interrupted_fetches,
)
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint

REPO = Path(__file__).resolve().parents[1]

HOLD_LOCK = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def ranged(m) -> bool:
    return "range" in (m.request.headers if m.request else {})


def cut_fetch(s3, tcp_proxy, dest: Path, prefix: str) -> tuple[str, bytes]:
    """A fetch into ``dest`` whose ranged GETs after the first four are all reset."""
    data, sizes = engine_program(91, (8 * MiB,))
    url = f"s3://{s3.bucket}/{prefix}/model.pte"
    put_program(s3.client, s3.bucket, prefix, {"model.pte": (data, sizes)})
    proxy = tcp_proxy(s3.endpoint.url, [Fault("response", "reset", at=1000, match=ranged,
                                              skip=4, times=10_000)])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError):
        fetch(url, dest, client=client, range_size=MiB, concurrency=1, attempts=2)
    assert not dest.exists()
    return url, data


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every path under ``directory`` (links not followed): its mode, and its bytes' digest."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            st = os.lstat(path)
            digest = xxhash.xxh3_128_hexdigest(path.read_bytes()) if path.is_file() and \
                not path.is_symlink() else None
            out[os.fspath(path.relative_to(directory))] = (st.st_mode, st.st_size, digest)
    return out


def cli(*argv: str | os.PathLike, env: dict | None = None) -> subprocess.CompletedProcess:
    """``trtet-store ARGV`` in a child process."""
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", *map(os.fspath, argv)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def s3_env(s3) -> dict:
    env = dict(os.environ, PYTHONPATH=os.fspath(REPO), AWS_ACCESS_KEY_ID=s3.endpoint.access_key,
               AWS_SECRET_ACCESS_KEY=s3.endpoint.secret_key,
               AWS_DEFAULT_REGION=s3.endpoint.region, AWS_ENDPOINT_URL=s3.endpoint.url)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        env.pop(var, None)
    return env


def hold_lock(lock: Path) -> subprocess.Popen:
    """Another process holding ``lock``'s flock, as a running fetch does, until it is ended."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, os.fspath(lock)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(30)


def test_recover_lists_a_cut_fetch_changes_nothing_and_its_resume_command_finishes_it(
        s3, here_fs, tcp_proxy):
    dest = here_fs / "model.pte"
    url, data = cut_fetch(s3, tcp_proxy, dest, "r1")
    before = snapshot(here_fs)
    staged = [n for n in before if n.startswith(f"{STAGING_DIR}/") and n.endswith(".run")]
    assert len(staged) == 1, before  # the failed fetch gave its run back to its own name
    done = cli("recover", here_fs, env=s3_env(s3))
    assert done.returncode == 0, done.stderr
    assert "nothing to recover" not in done.stdout, done.stdout
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("interrupted fetch ")]
    resume = f"trtet-store fetch {url} {dest}"
    discard = f"trtet-store recover {here_fs} --discard-fetches"
    assert line.startswith(f"interrupted fetch {url} -> {dest} (3.0 of 8.0 MiB staged, since "), \
        line
    assert line.endswith(f"): resume: {resume}; discard: {discard}"), line
    assert snapshot(here_fs) == before, "recover changed the directory"
    # The resume command, as printed (its endpoint from the environment, as the user's).
    words = shlex.split(line.split("resume: ", 1)[1].split("; discard: ", 1)[0])
    assert words[:2] == ["trtet-store", "fetch"]
    resumed = cli(*words[1:], "--json", env=s3_env(s3))
    assert resumed.returncode == 0, resumed.stderr
    assert dest.read_bytes() == data
    assert sorted(os.listdir(here_fs)) == ["model.pte"]
    again = cli("recover", here_fs)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{here_fs}: nothing to recover", again.stdout


def test_discard_fetches_removes_exactly_the_staged_runs_and_journal(s3, here_fs, tcp_proxy):
    dest = here_fs / "model.pte"
    cut_fetch(s3, tcp_proxy, dest, "r2")
    # Neighbours that are not the fetch's: a file beside the destination, one in staging.
    (here_fs / "model.ptd").write_bytes(b"keep me")
    (here_fs / STAGING_DIR / "notes.txt").write_bytes(b"not a fetch's")
    before = snapshot(here_fs)
    fid = fetch_id(dest)
    ours = {n for n in before if n.startswith(f"{STAGING_DIR}/fetch-{fid}")}
    assert {n.rsplit(".", 1)[1] for n in ours} == {"run", "journal", "lock"}, ours
    done = cli("recover", here_fs, "--discard-fetches")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"discarded fetch {url_of(s3, 'r2')} -> {dest} (3.0 of 8.0 "
                                  "MiB staged: 1 staged file(s) and its journal removed)"), \
        done.stdout
    after = snapshot(here_fs)
    assert after == {k: v for k, v in before.items() if k not in ours}
    listed = cli("recover", here_fs)
    assert listed.stdout.strip() == f"{here_fs}: nothing to recover", listed.stdout


def url_of(s3, prefix: str) -> str:
    return f"s3://{s3.bucket}/{prefix}/model.pte"


def test_a_fetch_holding_its_lock_is_listed_running_and_never_discarded(s3, here_fs, tcp_proxy):
    dest = here_fs / "model.pte"
    cut_fetch(s3, tcp_proxy, dest, "r3")
    lock = here_fs / STAGING_DIR / f"fetch-{fetch_id(dest)}.lock"
    (listed_idle,) = interrupted_fetches(here_fs)
    assert not listed_idle.running
    before = snapshot(here_fs)
    holder = hold_lock(lock)
    try:
        shown = cli("recover", here_fs)
        assert shown.returncode == 0, shown.stderr
        assert f"fetch {url_of(s3, 'r3')} -> {dest} is running (3.0 of 8.0 MiB staged): not " \
            "discarded; wait for it to finish" in shown.stdout, shown.stdout
        refused = cli("recover", here_fs, "--discard-fetches")
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert refused.stderr.strip() == (f"fetch {url_of(s3, 'r3')} -> {dest} is running (3.0 "
                                          "of 8.0 MiB staged): not discarded; wait for it to "
                                          "finish"), refused.stderr
        assert snapshot(here_fs) == before
        # Listed while idle, started since: discard takes the lock, so it refuses too.
        with pytest.raises(ConcurrentWriteError, match="is running; wait for it to finish"):
            discard_fetch(here_fs, listed_idle)
        assert snapshot(here_fs) == before, "discard removed a running fetch's files"
    finally:
        release(holder)
    assert snapshot(here_fs) == before


def test_a_staging_link_is_not_followed(here_fs):
    """A ``.trtet-staging`` that is a link to a directory with a journal: named, never read."""
    elsewhere = here_fs / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fetch-0123456789abcdef.journal").write_text(
        '{"fetch": 1, "url": "s3://b/k/m.pte", "dest": "/x/m.pte", "version": "v", '
        '"runs": [[0, 0, 1048576]]}\n')
    (elsewhere / "fetch-0123456789abcdef-0-0-1048576.run").write_bytes(b"\0" * 10)
    os.symlink(elsewhere, here_fs / STAGING_DIR)
    before = snapshot(here_fs)
    with pytest.raises(StagingLinkError):
        interrupted_fetches(here_fs)
    for argv in (("recover", here_fs), ("recover", here_fs, "--discard-fetches")):
        done = cli(*argv)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "interrupted fetch" not in done.stdout and "discarded" not in done.stdout
        # recover(DIR) itself refuses the unsafe staging directory first, as fetch does.
        assert done.stderr.strip() == (
            f"trtet-store recover: UnsafeDirectoryError: refusing the staging directory "
            f"{here_fs / STAGING_DIR}: it is a symbolic link; remove it (trtet_store did not "
            "make it), then recover again"), done.stderr
        assert snapshot(here_fs) == before


def test_names_from_a_journal_are_shown_quoted_one_line_each(here_fs):
    """A journal's url and dest are data: a newline or an escape in them cannot forge lines."""
    staging = here_fs / STAGING_DIR
    staging.mkdir(mode=0o700)
    dest = "/x/a\nb\x1b[2J.pte"
    (staging / "fetch-0123456789abcdef.journal").write_text(
        '{"fetch": 1, "url": "s3://b/k/m.pte", "dest": "/x/a\\nb\\u001b[2J.pte", "version": '
        '"v", "runs": [[0, 0, 1048576]]}\n')
    done = cli("recover", here_fs)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert "\x1b" not in line
    assert line.startswith(f"interrupted fetch s3://b/k/m.pte -> {dest!r} (0.0 of 1.0 MiB "
                           "staged, since "), line


def test_discard_fetches_gives_up_a_killed_fetch_s_orphan_blobs_too(s3, here_fs):
    """A fetch killed with SIGKILL leaves its runs as orphan blobs (not ``.run`` files)."""
    from test_fetch_resume import kill_after, start_child

    data, sizes = engine_program(92, (8 * MiB,))
    url = url_of(s3, "r4")
    put_program(s3.client, s3.bucket, "r4", {"model.pte": (data, sizes)})
    (here_fs / "model.ptd").write_bytes(b"keep me")
    proc = start_child(url, here_fs / "model.pte", s3.endpoint)
    kill_after(proc, 3, 0.0)
    staging = here_fs / STAGING_DIR
    assert any(n.endswith(".blob") for n in os.listdir(staging)), os.listdir(staging)
    listed = cli("recover", here_fs)
    assert f"interrupted fetch {url} -> {here_fs / 'model.pte'} (" in listed.stdout, listed.stdout
    assert "staged file(s) of interrupted fetches kept: see the interrupted fetches below" \
        in listed.stdout, listed.stdout
    assert "run the same export again" not in listed.stdout, listed.stdout
    blobs = [n for n in os.listdir(staging) if n.endswith(".blob")]
    done = cli("recover", here_fs, "--discard-fetches")
    assert done.returncode == 0, done.stderr
    assert f"discarded fetch {url} -> {here_fs / 'model.pte'} (" in done.stdout, done.stdout
    assert f"MiB staged: {len(blobs)} staged file(s) and its journal removed)" in done.stdout, \
        done.stdout
    assert sorted(os.listdir(here_fs)) == ["model.ptd"], (
        sorted(os.listdir(staging)) if staging.exists() else None)
    assert (here_fs / "model.ptd").read_bytes() == b"keep me"
    again = cli("recover", here_fs)
    assert again.stdout.strip() == f"{here_fs}: nothing to recover", again.stdout


def test_recover_json_keeps_stdout_json_and_names_the_fetch_on_stderr(s3, here_fs, tcp_proxy):
    dest = here_fs / "model.pte"
    url, _ = cut_fetch(s3, tcp_proxy, dest, "r5")
    done = cli("recover", here_fs, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert f"interrupted fetch {url} -> {dest} (3.0 of 8.0 MiB staged, since " in done.stderr
