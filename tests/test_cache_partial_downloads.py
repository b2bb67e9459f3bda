"""Issue 45 item 15: a remote hit cut off mid-download no longer strands its file.

A cut remote hit keeps its partial download in ``<cache>/downloads/<key>/``
(the fetch's staging directory and resume journal): ``stats`` counts it, the
next hit of the key resumes it, and ``clear``, ``prune`` and ``recover`` (the
API and the CLI) remove it unless a live download holds its fetch lock; a
lock a real other process holds keeps it, and that is said. Real SeaweedFS
(``s3env``), a proxy that cuts the engine's bytes (tests/tcp_proxy.py), the
root disk (``here_fs``); nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trtet_store import EngineCache
from trtet_store.io import FETCH_LOCK_PREFIX, FETCH_LOCK_SUFFIX, STAGING_DIR
from trtet_store.io.units import MiB

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[1]
SIZE = 24 * MiB
RANGE = 4 * MiB

#: A real other process holding a fetch lock (as a running download does): io's try_lock.
HOLDER = """
import sys
from trtet_store.io import try_lock
fd = try_lock(sys.argv[1], create=False)
assert fd is not None, "the lock was not free"
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def _cache(directory: Path, s3: Any, endpoint: str) -> EngineCache:
    from trtet_store.cache.tier import RemoteTier

    # 4 MiB ranges, one at a time: the fetch journals each whole range, so a cut after
    # two of six leaves 8 MiB to resume (the default 32 MiB range would hold the whole
    # 24 MiB engine in one range, which a cut leaves unjournaled).
    tier = RemoteTier(f"s3://{s3.bucket}/t", endpoint_url=endpoint, range_size=RANGE,
                      concurrency=1)
    return EngineCache(directory, max_bytes=256 * MiB, min_free=0, remote=tier)


def _entry(directory: Path) -> tuple[list[tuple[str, Path]], dict]:
    """An engine-cache entry (record + e0, e0 SIZE random bytes) this machine accepts."""
    from trtet_store.export import engine_reuse
    from trtet_store.export.engine_key import ENGINE_KIND, RECORD_KIND, compute_capability

    directory.mkdir(parents=True, exist_ok=True)
    cap = compute_capability()
    with open(directory / "e0", "wb") as f:
        f.write(os.urandom(SIZE))
    (directory / "record").write_bytes(b"record " + os.urandom(16))
    record = {"kind": RECORD_KIND, "fingerprint": "f15", "compute_capability": cap,
              "versions": [list(v) for v in engine_reuse.build_versions()],
              "engines": [{"engine_id": "id15"}]}
    engines = [{"kind": ENGINE_KIND, "engine_id": "id15", "compute_capability": cap}]
    return ([("record", directory / "record"), ("e0", directory / "e0")],
            {"record": record, "engines": engines})


def _behind_a_cut(here_fs: Path, s3env: Any, tcp_proxy: Any) -> tuple[EngineCache, str, Any]:
    """A publishes ``k15``; B's cache reaches the server through a proxy that lets two
    ranges of e0 through, then cuts every response at 3 MiB. ``(B, key, proxy)``."""
    from tcp_proxy import Fault

    a = _cache(here_fs / "a", s3env, s3env.endpoint.url)
    files, meta = _entry(here_fs / "src")
    key = "k15"
    assert a.tiered.publish(key, files, meta)[0].action == "published"
    proxy = tcp_proxy(s3env.endpoint.url, [Fault(
        "response", "reset", at=3 * MiB, skip=2, times=10**6,
        match=lambda m: m.method == "GET" and m.target.split("?")[0].endswith("/e0"))])
    return _cache(here_fs / "b", s3env, proxy.url), key, proxy


def _cut_hit(here_fs: Path, s3env: Any, tcp_proxy: Any) -> tuple[Path, str, Path]:
    """A publishes; B's hit gets two ranges of e0, then every response is cut at 3 MiB.

    Returns ``(B's directory, the key, B's partial download)``.
    """
    b, key, proxy = _behind_a_cut(here_fs, s3env, tcp_proxy)
    got = b.tiered.get(key)
    assert proxy.fired, "the proxy cut nothing"
    assert got.hit is None and got.outcome.action == "error", got.outcome
    partial = here_fs / "b" / "downloads" / key
    assert (partial / STAGING_DIR).is_dir(), "the cut hit kept no partial download"
    return here_fs / "b", key, partial


def _lock_of(partial: Path) -> Path:
    [lock] = [p for p in (partial / STAGING_DIR).iterdir()
              if p.name.startswith(FETCH_LOCK_PREFIX) and p.name.endswith(FETCH_LOCK_SUFFIX)]
    return lock


def _held(lock: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, os.fspath(lock)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.fspath(ROOT)))
    assert child.stdout.readline().strip() == "held"
    return child


def _cli(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", "cache", "--dir",
                           os.fspath(directory), *args], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.fspath(ROOT)),
                          timeout=300)


def _disk(path: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def test_a_cut_hit_is_counted_and_the_next_hit_resumes_it(here_fs, s3env, tcp_proxy):
    directory, key, partial = _cut_hit(here_fs, s3env, tcp_proxy)
    held_bytes = _disk(partial)
    assert held_bytes > 0
    # Counted, by the API and by the CLI (a read-only open: nothing removed).
    again = _cache(directory, s3env, s3env.endpoint.url)  # a new process's open keeps it
    assert again.stats().downloads_bytes == held_bytes
    out = _cli(directory, "--json", "stats")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["downloads_bytes"] == held_bytes
    out = _cli(directory, "stats")
    assert "downloads:" in out.stdout and "kept to resume" in out.stdout, out.stdout
    # The next hit of the key, through an honest proxy: resumed, not downloaded again.
    watch = tcp_proxy(s3env.endpoint.url)
    c = _cache(directory, s3env, watch.url)
    got = c.tiered.get(key)
    assert got.hit is not None and got.outcome.action == "hit", got.outcome
    got.hit.close()
    fetched = watch.body_bytes[("response", "GET")]
    # The two journaled ranges are not fetched again (the rest: the manifest and record).
    assert fetched < SIZE - 2 * RANGE + MiB, f"{fetched} bytes fetched of {SIZE}: not resumed"
    with c.blobs.get(f"{key}.e0") as hit:
        assert hit.path.read_bytes() == (here_fs / "src" / "e0").read_bytes()
    assert not partial.exists() and c.stats().downloads_bytes == 0


def test_a_cut_pull_keeps_its_partial_download_and_the_next_pull_resumes_it(
        here_fs, s3env, tcp_proxy):
    from trtet_store.remote import RemoteError

    b, key, _ = _behind_a_cut(here_fs, s3env, tcp_proxy)
    with pytest.raises(RemoteError):
        b.pull([key])
    partial = here_fs / "b" / "downloads" / key
    assert (partial / STAGING_DIR).is_dir(), "the cut pull threw its partial download away"
    watch = tcp_proxy(s3env.endpoint.url)
    c = _cache(here_fs / "b", s3env, watch.url)
    entry = c.tiered.tier.lookup(key)
    got = c.tiered.pull(key, entry, lambda: c.blobs.get(key))  # the stand-in record's level
    assert got.hit is not None and got.outcome.action == "hit", got.outcome
    got.hit.close()
    assert watch.body_bytes[("response", "GET")] < SIZE - 2 * RANGE + MiB
    assert not partial.exists()


@pytest.mark.parametrize("action", ["clear", "prune", "recover"])
def test_clear_prune_recover_remove_an_unheld_partial_and_keep_a_held_one(
        here_fs, s3env, tcp_proxy, action):
    directory, key, partial = _cut_hit(here_fs, s3env, tcp_proxy)
    listing = sorted(p.name for p in (partial / STAGING_DIR).iterdir())
    # Held by a live download (a real other process holds its fetch lock): kept and said.
    child = _held(_lock_of(partial))
    try:
        out = _cli(directory, action)
        assert out.returncode == 0, out.stderr
        assert f"kept the partial download {partial}: a download running in another " \
               "process holds it" in out.stdout, out.stdout
        assert sorted(p.name for p in (partial / STAGING_DIR).iterdir()) == listing
        cache = _cache(directory, s3env, s3env.endpoint.url)
        getattr(cache, action)()
        assert cache.blobs.swept.held == [partial] and cache.blobs.swept.removed == []
        assert sorted(p.name for p in (partial / STAGING_DIR).iterdir()) == listing
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    # No download holds it now: removed, and its bytes said.
    before = _cache(directory, s3env, s3env.endpoint.url).stats().downloads_bytes
    assert before > 0
    out = _cli(directory, "--json", action)
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    assert not partial.exists(), f"{action} left the unheld partial download"
    if action == "recover":
        assert os.fspath(partial) in said["removed"] and said["downloads_held"] == []
    else:
        assert said["downloads_removed"] == [os.fspath(partial)]
        assert said["downloads_removed_bytes"] == before and said["downloads_held"] == []
    assert _cache(directory, s3env, s3env.endpoint.url).stats().downloads_bytes == 0


def test_the_api_removes_an_unheld_partial_and_says_it(here_fs, s3env, tcp_proxy):
    directory, key, partial = _cut_hit(here_fs, s3env, tcp_proxy)
    cache = _cache(directory, s3env, s3env.endpoint.url)
    size = cache.stats().downloads_bytes
    assert size > 0
    assert cache.clear() == []  # no entries: the partial download is not an entry
    assert cache.blobs.swept.removed == [partial] and cache.blobs.swept.removed_bytes == size
    assert not partial.exists() and cache.stats().downloads_bytes == 0
    out = _cli(directory, "clear")  # nothing left: nothing said about downloads
    assert out.returncode == 0 and "partial" not in out.stdout, out.stdout


def test_a_partial_download_that_cannot_be_removed_is_said_and_stays_one_to_retry(
        make_fs, caplog) -> None:
    """A file the sweep cannot unlink (immutable) stops it half-way: said, no exception,
    and the staging directory goes last, so the next sweep still finds a partial download."""
    from trtet_store.cache import BlobCache
    from trtet_store.cache.downloads import downloads_bytes, remove_unheld

    mnt = make_fs("ext4", 64)
    cache = BlobCache(mnt / "c", max_bytes=16 * MiB)
    partial = cache.directory / "downloads" / "k"
    (partial / STAGING_DIR).mkdir(parents=True, mode=0o700)
    (partial / STAGING_DIR / f"{FETCH_LOCK_PREFIX}0123{FETCH_LOCK_SUFFIX}").write_bytes(b"")
    (partial / STAGING_DIR / "fetch-0123-0-0-1048576.run").write_bytes(b"r" * MiB)
    stuck = partial / "record"
    stuck.write_bytes(b"s" * 4096)
    subprocess.run(["chattr", "+i", stuck], check=True)
    try:
        sweep = remove_unheld(cache.directory)
        assert sweep.removed == [] and "could not remove the partial download" in caplog.text
        assert (partial / STAGING_DIR).is_dir() and downloads_bytes(cache.directory) > MiB
    finally:
        subprocess.run(["chattr", "-i", stuck], check=True)
    sweep = remove_unheld(cache.directory)
    assert sweep.removed == [partial] and not partial.exists()
