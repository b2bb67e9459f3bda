"""cli/recover.py _store_fetches: a set store's download that is running is named, never
discarded, and ``--discard-fetches`` then fails (a gap hunt: the set store's tests only
met a killed download, never one whose fetch still holds its lock).

A real ``fetch-set`` child is SIGKILLed inside a blob's download (as
tests/test_recover_set_store.py does); the test then holds that fetch's lock, as a fetch
still running would. ``recover DIR`` names it running; ``recover DIR --discard-fetches``
says it was not discarded, exits non-zero, and every staged file is as it was.
"""

from __future__ import annotations

import fcntl
import os

from sets_helpers import write, xxh
from test_recover_set_store import OWN, SHARED, listing, recover_cli
from test_sets_kill import run_child

from trtet_store.io import STAGING_DIR
from trtet_store.remote.download.staging import fetch_lock_name
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def test_a_running_set_store_download_is_named_and_never_discarded(s3env, here_fs):
    url = f"s3://{s3env.bucket}/rel/"
    shared = write(here_fs / "src" / "foundation.ptd", SHARED, 1)
    pte = write(here_fs / "src" / "a" / "model.pte", OWN, 2)
    publish_set({"a": [pte, shared]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    machine = here_fs / "machine"
    machine.mkdir()
    dest = machine / "a"
    child = run_child({"op": "fetch", "phase": "download", "url": url, "member": "a",
                       "dest": str(dest), "endpoint": s3env.endpoint.url, "after": 4})
    assert child.stdout.strip() == "killed" and child.returncode == -9, child.stderr[-2000:]
    staging = machine / ".trtet-blobs" / STAGING_DIR
    (journal,) = [n for n in os.listdir(staging) if n.endswith(".journal")]
    fid = journal.removeprefix("fetch-").removesuffix(".journal")
    fd = os.open(staging / fetch_lock_name(fid), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a fetch holding it: running
        before = listing(machine)
        what = f"blob {xxh(shared)} from {url}blobs/{xxh(shared)}"
        done = recover_cli(dest)
        assert done.returncode == 0, done.stderr
        assert (f"the set store's download of {what} is running (2.0 of 6.0 MiB staged): not "
                "discarded; wait for it to finish") in done.stdout, done.stdout
        done = recover_cli(dest, "--discard-fetches")
        assert (f"the set store's download of {what} is running (2.0 of 6.0 MiB staged): not "
                "discarded; wait for it to finish") in done.stderr, (done.stdout, done.stderr)
        assert done.returncode != 0, done.stdout
        assert "discarded the set store's download" not in done.stdout
        assert listing(machine) == before  # nothing removed
    finally:
        os.close(fd)
