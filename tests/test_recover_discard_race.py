"""``trtet-store recover DIR --discard-fetches`` when a fetch starts between the listing and
the discard: the discard takes the fetch's lock, finds it held, removes nothing, and the
command fails (exit 1) saying so. The race is set up for real: the listing is wrapped so
that, once it has seen the fetch idle, another process takes the fetch's lock (as a fetch
resumed by hand would) before the discard runs."""

from __future__ import annotations

from sets_helpers import write
from test_recover_fetches import cut_fetch, hold_lock, release, snapshot
from test_sets_kill import run_child

from trtet_store import cli
from trtet_store.io import STAGING_DIR
from trtet_store.io.units import MiB
from trtet_store.remote.download import interrupted
from trtet_store.remote.download.interrupted import fetch_lock_name
from trtet_store.remote.download.staging import fetch_id
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def test_a_fetch_started_after_the_listing_fails_the_discard_and_keeps_its_files(
        s3, here_fs, tcp_proxy, monkeypatch, capsys):
    dest = here_fs / "model.pte"
    cut_fetch(s3, tcp_proxy, dest, "race")
    lock = here_fs / STAGING_DIR / f"fetch-{fetch_id(dest)}.lock"
    before = snapshot(here_fs)
    holders = []
    listed = interrupted.interrupted_fetches

    def listing_then_a_fetch_starts(directory):
        found = listed(directory)
        assert [f.running for f in found] == [False]
        holders.append(hold_lock(lock))  # the fetch resumed, after we looked
        return found

    monkeypatch.setattr(interrupted, "interrupted_fetches", listing_then_a_fetch_starts)
    try:
        code = cli.main(["recover", str(here_fs), "--discard-fetches"])
        out, err = capsys.readouterr()
        assert holders, "the listing was not the one wrapped"
        assert code == 1, (out, err)
        assert "is running; wait for it to finish, then discard again" in err, err
        assert "discarded fetch" not in out, out
        assert snapshot(here_fs) == before, "the discard removed a running fetch's files"
    finally:
        for holder in holders:
            release(holder)
    assert snapshot(here_fs) == before


def test_a_set_store_download_resumed_after_the_listing_fails_the_discard(
        s3env, here_fs, monkeypatch, capsys):
    # The same race in the set store beside DIR, where a killed fetch-set leaves its
    # partial download (set up as tests/test_recover_set_store.py does).
    url = f"s3://{s3env.bucket}/rel/"
    shared = write(here_fs / "src" / "foundation.ptd", 6 * MiB, 1)
    pte = write(here_fs / "src" / "a" / "model.pte", MiB + 17, 2)
    publish_set({"a": [pte, shared]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    machine = here_fs / "machine"
    machine.mkdir()
    dest = machine / "a"
    child = run_child({"op": "fetch", "phase": "download", "url": url, "member": "a",
                       "dest": str(dest), "endpoint": s3env.endpoint.url, "after": 4})
    assert child.returncode == -9, child.stderr[-2000:]
    staging = machine / ".trtet-blobs" / STAGING_DIR
    before = snapshot(machine)
    holders = []
    listed = interrupted.interrupted_fetches

    def listing_then_a_download_resumes(directory):
        found = listed(directory)
        if found and directory == machine / ".trtet-blobs":
            assert [f.running for f in found] == [False]
            holders.append(hold_lock(staging / fetch_lock_name(found[0].id)))
        return found

    monkeypatch.setattr(interrupted, "interrupted_fetches", listing_then_a_download_resumes)
    try:
        code = cli.main(["recover", str(dest), "--discard-fetches"])
        out, err = capsys.readouterr()
        assert holders, "the store's listing was not the one wrapped"
        assert code == 1, (out, err)
        assert "is running; wait for it to finish, then discard again" in err, err
        assert "discarded the set store's download" not in out, out
        assert snapshot(machine) == before, "the discard removed a running download's files"
    finally:
        for holder in holders:
            release(holder)
