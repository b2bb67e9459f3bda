"""``trtet-store recover DIR --discard-fetches`` when a fetch starts between the listing and
the discard: the discard takes the fetch's lock, finds it held, removes nothing, and the
command fails (exit 1) saying so. The race is set up for real: the listing is wrapped so
that, once it has seen the fetch idle, another process takes the fetch's lock (as a fetch
resumed by hand would) before the discard runs."""

from __future__ import annotations

from test_recover_fetches import cut_fetch, hold_lock, release, snapshot

from trtet_store import cli
from trtet_store.io import STAGING_DIR
from trtet_store.remote.download import interrupted
from trtet_store.remote.download.staging import fetch_id


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
