"""A resumed fetch adopts only staged run files that are regular files of ours
(trtet_store/remote/download/staging.py, ``_resume_or_start``, ``_own_file``; download.staging).

A fetch cut mid-way leaves its run files (``fetch-<fetch_id>-OBJ-OFFSET-SIZE.run``) and its
journal in the staging directory; the resume takes each file back with the ranges the journal
says it holds. A run file there that is a symbolic link, or a file another uid owns, is not one
a fetch of ours left: it is removed (a link itself, never followed) and its run fetched again
from scratch. Taken as ours, a link is renamed into the store (the file it names is what
``adopt`` stat()s) and the fetch fails on it; another uid's file becomes the fetched program
(owned by that uid, its bytes trusted by the journal's ranges).

The state is set up for real: a loopback proxy cuts one ranged GET (``attempts=1``) so the
first fetch stops with its run files staged; then one run file is swapped for a link to a
victim file of the same size, or for a same-content copy owned by uid 65534.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attacker import tree
from tcp_proxy import Fault
from test_fetch_support import MiB, engine_bytes, put_program

from trtet_store.io import STAGING_DIR
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.errors import FetchInterruptedError
from trtet_store.testing.s3server import S3Endpoint

RANGE = 4 * MiB
NOBODY = 65534


def range_from(key: str, offset: int):
    def match(m) -> bool:
        return (m.request is not None and m.target.split("?")[0].endswith(key)
                and m.request.headers.get("range", "").startswith(f"bytes={offset}-"))
    return match


@pytest.fixture
def cut_fetch(s3, here_fs, tcp_proxy):
    """A fetch of a two-object program stopped by a cut in model.pte's second range: its
    run files and journal staged. Returns (url, dest, data, ptd, staged run files)."""
    data = engine_bytes(1201, 2 * RANGE + MiB + 17)
    ptd = engine_bytes(1202, RANGE + 5)
    put_program(s3.client, s3.bucket, "p", {"model.pte": (data, [len(data)]),
                                             "model.ptd": (ptd, [len(ptd)])})
    url = f"s3://{s3.bucket}/p/model.pte"
    dest = here_fs / "model.pte"
    proxy = tcp_proxy(s3.endpoint.url, [
        Fault("response", "cut", at=MiB + 100, match=range_from("p/model.pte", RANGE))])
    client = S3Endpoint(proxy.url).client(retries={"max_attempts": 1}, read_timeout=5)
    with pytest.raises(FetchInterruptedError):
        fetch(url, dest, client=client, range_size=RANGE, concurrency=1, attempts=1)
    staging = here_fs / STAGING_DIR
    runs = sorted(staging.glob(f"fetch-{fetch_id(dest)}-*.run"))
    assert runs, sorted(os.listdir(staging))
    return url, dest, data, ptd, runs


def resume(s3, tcp_proxy, url: str, dest: Path):
    again = tcp_proxy(s3.endpoint.url)
    report = fetch(url, dest, client=S3Endpoint(again.url).client(), range_size=RANGE,
                   concurrency=1)
    return report, again.body_bytes[("response", "GET")]


def test_a_staged_run_file_replaced_by_a_link_is_removed_not_followed(
        s3, here_fs, tcp_proxy, cut_fetch) -> None:
    """A run file swapped for a link to a victim file of its size: the resume removes the
    link (the victim byte-identical, where it was), fetches that run again, and succeeds."""
    url, dest, data, ptd, runs = cut_fetch
    victims = here_fs / "victims"
    victims.mkdir()
    run = runs[0]
    victim = victims / "precious"
    victim.write_bytes(b"v" * run.stat().st_size)
    before = tree(victims)
    run.unlink()
    run.symlink_to(victim)
    report, _ = resume(s3, tcp_proxy, url, dest)
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    assert tree(victims) == before  # not moved, not written, not removed
    assert not run.is_symlink() and not run.exists()
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte", "victims"]
    assert report.bytes_resumed < len(data) + len(ptd)


def test_a_staged_run_file_another_uid_owns_is_not_adopted(
        s3, here_fs, tcp_proxy, cut_fetch) -> None:
    """A run file replaced by a same-content copy owned by uid 65534: not taken back (it is
    removed, its run fetched again), so the program placed is a file of ours, not theirs."""
    url, dest, data, ptd, runs = cut_fetch
    run = max(runs, key=lambda p: p.stat().st_size)
    body = run.read_bytes()
    mode = run.stat().st_mode & 0o7777
    run.unlink()
    run.write_bytes(body)
    os.chmod(run, mode)
    os.chown(run, NOBODY, NOBODY)
    _, downloaded = resume(s3, tcp_proxy, url, dest)
    assert dest.read_bytes() == data and (here_fs / "model.ptd").read_bytes() == ptd
    for name in ("model.pte", "model.ptd"):
        st = (here_fs / name).stat()
        assert st.st_uid == os.geteuid(), (name, st.st_uid)
    assert not run.exists()
    # That run was fetched again in full: at least its size came over the wire.
    assert downloaded >= len(body)
    assert sorted(os.listdir(here_fs)) == ["model.ptd", "model.pte"]
