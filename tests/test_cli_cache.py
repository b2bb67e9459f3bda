"""``trtet-store cache``: list, stats, prune, verify, clear, through the real console entry.

Each command runs ``python -m trtet_store.cli cache ...`` in a child process
against a real cache holding a real build (``compile_and_save(...,
engine_cache=)`` with the TensorRT build stubbed at its seam: two engine
entries and the build record) and an entry of the Torch-TensorRT adapter
(through upstream 2.14.0's own ``insert``, loaded from its wheel).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import upstream
import warm
from digests import file_digest
from programs import write_model_factory
from terminal import run_on_terminal

from trtet_store.io import MiB
from trtet_store.testing import upstream_engine_cache as uec

ROOT = Path(__file__).resolve().parent.parent
ENGINE = 1 * MiB


def cli(*argv: object) -> subprocess.CompletedProcess:
    """``trtet-store cache ARGV...`` in a warm child (tests/warm.py); the entry point's own
    script is test_cli_entry_and_option_lines's."""
    return warm.cli("cache", *argv, timeout=300, cwd=ROOT)


def cli_json(*argv: object):
    done = cli(*argv, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def filled(here_fs):
    """A cache with a build of 2 engines (3 entries) and one Torch-TensorRT entry, used last."""
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    try:
        wheel = upstream.wheel("torch-tensorrt")
    except upstream.WheelUnavailable as exc:
        from filesystems import unavailable

        unavailable(str(exc))
    directory = here_fs / "cache"
    cache = trtet_store.EngineCache(directory, max_bytes=64 * MiB, min_free=0)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    builder = FakeBuilder(engine_sizes=(ENGINE, 2 * ENGINE))
    with installed(builder):
        trtet_store.compile_and_save(module, (torch.randn(2, 16),), here_fs / "m.pte",
                                     engine_cache=cache)
    assert len(builder.built) == 2
    mod = uec.load(wheel)
    with uec.as_torch_tensorrt(mod):
        from trtet_store.export.trt_engine_cache import for_torch_tensorrt

        adapter = for_torch_tensorrt(cache, tensorrt_version="10.14.1", compute_capability="9.0")
        entry = (os.urandom(ENGINE), ["x"], ["y"], [uec.Input((2, 16))],
                 uec.CompilationSettings(), False, False, {})
        adapter.insert("ab" * 96, entry)
        assert adapter.check("ab" * 96) is not None and adapter.check("ab" * 96) is not None
        yield cache, adapter, entry


def test_list_shows_key_size_last_use_hits_versions_and_gpu(filled):
    cache, adapter, _ = filled
    rows = cli_json("--dir", cache.directory, "list")
    api = {e.key: e for e in cache.entries()}
    assert [r["key"] for r in rows] == list(api)  # most recently used first
    by_kind = {}
    for r in rows:
        e = api[r["key"]]
        assert (r["size"], r["hits"], r["last_use"], r["digest"]) == \
            (e.size, e.hits, e.last_use, e.digest)
        by_kind.setdefault(r["kind"], []).append(r)
    assert sorted((k, len(v)) for k, v in by_kind.items()) == \
        [("build", 1), ("engine", 2), ("torch-tensorrt", 1)]
    [record] = by_kind["build"]
    recorded = dict(map(tuple, api[record["key"]].metadata["versions"]))
    assert "torch" in recorded
    for r in by_kind["engine"] + by_kind["build"]:  # an engine shows its build's versions
        assert r["versions"] == recorded and r["gpu"] == "no-gpu"
    [tt] = by_kind["torch-tensorrt"]
    assert (tt["key"], tt["versions"], tt["gpu"], tt["hits"]) == \
        (adapter.key_for("ab" * 96), {"tensorrt": "10.14.1"}, "sm_90", 2)
    assert rows[0]["key"] == tt["key"]
    assert sorted(r["size"] for r in by_kind["engine"]) == [ENGINE, 2 * ENGINE]

    text = cli("list", "--dir", cache.directory)  # the options after the action too
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["KEY", "KIND", "SIZE", "LAST", "USE", "HITS", "GPU", "VERSIONS"]
    assert len(lines) == 1 + 4 + 1 and lines[-1].startswith("4 entries")
    tt_line = next(line for line in lines if "torch-tensorrt" in line)
    assert tt_line.split()[0] == f"torch_tensorrt-{tt['key'].split('-')[1][:8]}-sm_90"
    assert tt_line.split()[-3:] == ["2", "sm_90", "tensorrt=10.14.1"]
    engine_line = next(line for line in lines if " engine " in line)
    assert "no-gpu" in engine_line and f"torch={recorded['torch']}" in engine_line


def test_stats_are_the_apis(filled):
    cache, _, _ = filled
    got = cli_json("stats", "--dir", cache.directory)
    s = cache.stats()
    assert (got["entries"], got["blobs"], got["bytes"], got["hits"]) == \
        (s.entries, s.blobs, s.bytes, s.hits) == (4, 4, s.bytes, 2)
    assert got["directory"] == os.fspath(cache.directory)
    text = cli("--dir", cache.directory, "stats")
    assert text.returncode == 0 and "entries:    4 (4 distinct blobs)" in text.stdout


def test_prune_evicts_the_least_recently_used_down_to_the_bound(filled):
    cache, adapter, entry = filled
    tt_key = adapter.key_for("ab" * 96)
    bound = next(e.size for e in cache.entries() if e.key == tt_key)
    others = [e.key for e in cache.entries() if e.key != tt_key]  # used before it
    got = cli_json("--dir", cache.directory, "prune", "--max-bytes", str(bound))
    assert sorted(got["evicted"]) == sorted(others)
    assert [e.key for e in cache.entries()] == [tt_key]
    assert got["bytes"] == bound and got["entries"] == 1
    assert tuple(adapter.check("ab" * 96)) == entry  # the one kept is whole
    blobs = sorted(p.name for p in (cache.directory / "blobs").iterdir())
    assert len(blobs) == 2  # its blob and its seal: nothing else left


def test_verify_drops_a_damaged_entry_and_exits_1(filled):
    cache, adapter, entry = filled
    engine = next(e for e in cache.entries()
                  if e.metadata.get("kind") == "trtet_store.tensorrt.engine")
    blob = cache.directory / "blobs" / f"{engine.digest}-{engine.size}"
    os.truncate(blob, engine.size // 2)
    others = {e.key: e.digest for e in cache.entries() if e.key != engine.key}
    done = cli("--dir", cache.directory, "verify")
    assert done.returncode == 1, done.stderr
    assert "checked 4 entries: 1 damaged, dropped" in done.stdout
    assert f"  {engine.key}: size {engine.size // 2}, sealed {engine.size}" in done.stdout
    assert {e.key: e.digest for e in cache.entries()} == others  # nothing else touched
    again = cli_json("--dir", cache.directory, "verify")
    assert again == {"checked": 3, "ok": True, "dropped": []}
    assert tuple(adapter.check("ab" * 96)) == entry


def test_clear_keeps_an_entry_another_process_is_reading(filled):
    cache, adapter, _ = filled
    tt_key = adapter.key_for("ab" * 96)
    with cache.blobs.get(tt_key) as hit:  # pinned by this process while the CLI clears
        got = cli_json("--dir", cache.directory, "clear")
        assert len(got["removed"]) == 3 and got["left"] == 1
        assert hit.path.exists()
    assert [e.key for e in cache.entries()] == [tt_key]
    text = cli("--dir", cache.directory, "clear")
    assert text.returncode == 0 and text.stdout.strip() == "removed 1 entries"
    assert cache.entries() == [] and os.listdir(cache.directory / "blobs") == []


def _tree(directory: Path) -> dict[str, str]:
    return {os.fspath(p.relative_to(directory)): file_digest(p)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_errors_are_one_line_and_a_nonzero_exit(filled, here_fs):
    cache, _, _ = filled
    not_dir = here_fs / "file"
    not_dir.write_bytes(b"x")
    done = cli("--dir", not_dir, "list")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"trtet-store cache: NotADirectoryError: [Errno 20] the engine cache {not_dir} is not "
        f"a directory: '{not_dir}'"]

    before = _tree(cache.directory)
    os.chmod(cache.directory, 0o777)  # writable by others: anyone could plant an engine
    try:
        done = cli("--dir", cache.directory, "clear")
    finally:
        os.chmod(cache.directory, 0o700)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("trtet-store cache: PermissionError: ") and "writable by others" \
        in line and "chmod 700" in line
    os.chown(cache.directory, 65534, 65534)  # another user's
    try:
        done = cli("--dir", cache.directory, "prune", "--max-bytes", "0")
    finally:
        os.chown(cache.directory, os.getuid(), os.getgid())
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert "refusing the engine cache directory" in line and "owned by uid 65534" in line
    assert _tree(cache.directory) == before  # neither refusal touched a file

    missing = here_fs / "missing"
    done = cli("--dir", missing, "list")
    assert (done.returncode, done.stdout) == (0, f"no engine cache at {missing}: nothing cached\n")
    assert not missing.exists()

    for argv, words in ((["prune", "--max-bytes", "lots"], "not a size: 'lots'"),
                        ([], "the following arguments are required: ACTION"),
                        (["list", "--bogus"], "unrecognized arguments: --bogus")):
        done = cli("--dir", cache.directory, *argv)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    assert _tree(cache.directory) == before


def test_compile_and_save_with_engine_cache_builds_once_and_says_hit(here_fs, capsys):
    """``compile-and-save --engine-cache DIR``: the second run builds nothing and says so."""
    from trtet_store.cli import main
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    factory = write_model_factory(here_fs)
    cache = here_fs / "cache"
    outs, built = [], []
    try:
        for i in range(2):
            builder = FakeBuilder(engine_sizes=(ENGINE,))
            out = here_fs / f"m{i}.pte"
            with installed(builder):
                assert main(["compile-and-save", "--no-progress", f"{factory}:make",
                             os.fspath(out), "--engine-cache", os.fspath(cache)]) == 0
            outs.append(capsys.readouterr().out)
            built.append(len(builder.built))
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert built == [1, 0], outs
    assert "engine " in outs[0] and ": miss, cached (" in outs[0]
    assert ": hit, " in outs[1]
    assert file_digest(here_fs / "m0.pte") == file_digest(here_fs / "m1.pte")


def _wait_for_builder7(here_fs, s3env, capsys, monkeypatch,
                       terminal=None) -> tuple[str, str, str]:
    """compile-and-save while "builder7" holds the key's lease (6 s ttl), renewed until the
    waiter starts to watch it and never after: ``(the remote URL, the key, what stderr
    got)``; stderr on ``terminal`` if given.

    A lease put once before the command starts could be dead by its first look on a loaded
    machine (the CLI's start and the probe's export took more than its 6 s in CI): then no
    wait at all. Renewed up to the watch's start, it is a lease of at most 0.5 s's age when
    the wait begins, whatever the load, and ends 6 s into the wait.
    """
    import threading
    import time

    from trtet_store import EngineCache
    from trtet_store.cache.tier import lease as lease_module
    from trtet_store.cli import main
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    factory = write_model_factory(here_fs)
    url, ep = f"s3://{s3env.bucket}/team", ["--endpoint-url", s3env.endpoint.url]
    stop = threading.Event()
    try:
        with installed(FakeBuilder(engine_sizes=(ENGINE,))):
            assert main(["compile-and-save", "--no-progress", f"{factory}:make",
                         os.fspath(here_fs / "p.pte"), "--engine-cache",
                         os.fspath(here_fs / "probe")]) == 0
        probe = EngineCache(here_fs / "probe", max_bytes=64 * MiB, min_free=0)
        [key] = [e.key for e in probe.entries()
                 if e.metadata.get("kind") == "trtet_store.tensorrt.build"]
        capsys.readouterr()
        started = time.time()

        def renew() -> None:  # another machine's lease, renewed until the waiter watches it
            while True:
                now = time.time()
                s3env.client.put_object(Bucket=s3env.bucket, Key=f"team/{key}.lease",
                                        Body=json.dumps({
                                            "holder": "e" * 32, "host": "builder7",
                                            "pid": 4321, "started": started, "renewed": now,
                                            "ttl": 6}).encode())
                if stop.wait(0.5):
                    return

        renewer = threading.Thread(target=renew, daemon=True)
        real_init = lease_module.LeaseWatch.__init__

        def watch_begins(watch, *args, **kwargs) -> None:
            stop.set()  # the last renewal lands before the watch's clock starts
            renewer.join()
            real_init(watch, *args, **kwargs)

        monkeypatch.setattr(lease_module.LeaseWatch, "__init__", watch_begins)
        renewer.start()
        with installed(FakeBuilder(engine_sizes=(ENGINE,))), \
                terminal or contextlib.nullcontext():
            assert main(["compile-and-save", f"{factory}:make",
                         os.fspath(here_fs / "m.pte"), "--engine-cache",
                         os.fspath(here_fs / "c"), "--engine-cache-remote", url, *ep]) == 0
    finally:
        stop.set()
        trt.unregister_engines(list(trt._engines.values()))
    return url, key, terminal.drawn() if terminal is not None else capsys.readouterr().err


def test_compile_and_save_says_when_it_waits_for_another_machines_build(
        here_fs, s3env, capsys, monkeypatch):
    """Issue 45 item 17: one line on stderr when the wait starts: the holder and until when;
    off a terminal no progress line (only the two warnings name the holder)."""
    url, key, err = _wait_for_builder7(here_fs, s3env, capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if "builder7" in ln]
    assert len(lines) == 2, err
    assert lines[0].startswith(f"trtet-store compile-and-save: warning: {url}: {key} is being "
                               f"built by holder {'e' * 32} (host builder7, pid 4321); its "
                               "lease runs until 20"), lines[0]
    assert "UTC unless renewed; waiting for its entry until 20" in lines[0]
    assert "took over the build lease of builder7" in lines[1]


def test_on_a_terminal_the_wait_is_a_line_that_counts_and_goes(here_fs, s3env, capsys,
                                                              monkeypatch):
    """Issue 45 item 17: on a terminal, a line redrawn at each look (the seconds waited, the
    holder, the key), erased when the lease is taken over; the warnings above it."""
    from test_cli_progress import Terminal

    terminal = Terminal()
    try:
        url, key, drawn = _wait_for_builder7(here_fs, s3env, capsys, monkeypatch, terminal)
    finally:
        terminal.close()
    draws = re.findall(r"waiting (\d+):(\d\d) for builder7 \(pid 4321\) to build (\S+)", drawn)
    assert len(draws) >= 2, drawn  # a look every 2 s over a 6 s lease
    assert {k for _, _, k in draws} == {key}
    waited = [60 * int(m) + int(s) for m, s, _ in draws]
    assert waited == sorted(waited) and waited[-1] >= 4, waited
    # The warnings are whole lines (the line cleared first, as above a bar); when the wait
    # is over its line is erased, not left on screen.
    assert f"warning: {url}: {key} is being built by holder" in drawn
    assert re.search(r"\r {20,}\rtrtet-store compile-and-save: warning: [^\r]*took over the "
                     r"build lease of builder7", drawn), drawn
    assert re.match(r"waiting [^\r]*\r {20,}\r", drawn[drawn.rindex("waiting "):]), drawn


# --- the shared tier: --remote (issue 37) ---------------------------------------------------


@pytest.fixture
def built(here_fs):
    """A cache holding one build of 2 engines (3 entries), made by compile_and_save."""
    import torch

    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    cache = trtet_store.EngineCache(here_fs / "a", max_bytes=64 * MiB, min_free=0)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    builder = FakeBuilder(engine_sizes=(ENGINE, 2 * ENGINE))
    with installed(builder):
        trtet_store.compile_and_save(module, (torch.randn(2, 16),), here_fs / "m.pte",
                                     engine_cache=cache)
    assert len(builder.built) == 2
    [record] = [e for e in cache.entries() if e.metadata.get("kind") ==
                "trtet_store.tensorrt.build"]
    return cache, record.key


def _build_entries(cache) -> dict[str, tuple[int, str]]:
    return {e.key: (e.size, e.digest) for e in cache.entries()}


def _bucket_keys(s3) -> list[str]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket)
    return sorted(o["Key"] for o in got.get("Contents", []))


def _no_open_uploads(s3) -> bool:
    return not s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads")


def test_push_list_pull_and_prune_through_a_bucket(built, here_fs, s3env):
    """Machine A pushes its build, B pulls it byte for byte; prune by age empties the bucket."""
    import socket

    from trtet_store import EngineCache

    a, key = built
    url, ep = f"s3://{s3env.bucket}/team", ("--endpoint-url", s3env.endpoint.url)
    local = _build_entries(a)
    total = sum(size for size, _ in local.values())

    rows = cli_json("push", "--remote", url, *ep, "--dir", a.directory)
    assert [(r["key"], r["status"], r["published"]) for r in rows] == [(key, "published", True)]
    assert rows[0]["sent"] == total  # the record and both engines, once
    again = cli("push", "--remote", url, *ep, "--dir", a.directory)
    assert again.returncode == 0, again.stderr
    [line] = again.stdout.splitlines()
    assert line.startswith(f"trt-{key.split('-')[1][:8]}") and ": already there (already in " \
        "the shared cache" in line

    [row] = cli_json("list", "--remote", url, *ep)  # the bucket alone: no --dir needed
    origin = (a.directory / "remote-origin").read_text().strip()
    assert (row["key"], row["size"], row["host"], row["origin"]) == \
        (key, total, socket.gethostname(), origin)
    assert sorted(f["name"] for f in row["files"]) == ["e0", "e1", "record"]
    text = cli("list", "--remote", url, *ep)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["KEY", "SIZE", "CREATED", "HOST", "ORIGIN", "SIGNED", "BY"]
    assert lines[1].split()[-2:] == [origin, "unsigned"]  # no signing key: unsigned
    assert lines[-1] == f"1 entries, 3.0 MiB in {url}"

    b_dir = here_fs / "b"  # machine B: pull creates its cache
    got = cli_json("pull", "--remote", url, *ep, "--dir", b_dir, key)
    assert got == [{"key": key, "downloaded": total}]
    b = EngineCache(b_dir, max_bytes=64 * MiB, min_free=0)
    assert _build_entries(b) == local  # every entry, byte for byte (size and xxh3-128)
    with b.lookup(key) as cached:
        assert [h.size for h in cached.engines] == [ENGINE, 2 * ENGINE]
    assert [p for p in b_dir.rglob("*") if p.is_file() and "downloads" in p.parts] == []
    text = cli("pull", "--remote", url, *ep, "--dir", b_dir, key)
    assert text.returncode == 0, text.stderr
    assert "already in the local cache (nothing downloaded)" in text.stdout

    assert cli_json("prune", "--remote", url, *ep, "--older-than", "1d")["removed"] == []
    dry = cli_json("prune", "--remote", url, *ep, "--older-than", "0s", "--dry-run")
    assert dry["dry_run"] and key in " ".join(dry["removed"])
    assert [r["key"] for r in cli_json("list", "--remote", url, *ep)] == [key]
    pruned = cli("prune", "--remote", url, *ep, "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("removed ") and key in pruned.stdout
    assert cli_json("list", "--remote", url, *ep) == []
    assert [k for k in _bucket_keys(s3env) if k.startswith("team/")] == []
    assert _no_open_uploads(s3env)
    assert _build_entries(a) == local  # the local caches are the bucket's prune's business: no


def cli_on_a_terminal(*argv: object) -> tuple[int, str, str]:
    """``cli`` with stderr on a pseudo-terminal (a real tty): (exit code, stdout, stderr)."""
    # 24 x 120, as a terminal. A fresh interpreter, not a warm child: its stderr is a pty
    # that run_on_terminal opens for it.
    return run_on_terminal([sys.executable, "-m", "trtet_store.cli", "cache",
                            *map(os.fspath, argv)], size=(24, 120), cwd=ROOT)


def test_a_damaged_pointer_is_listed_and_never_breaks_list_or_pull(built, here_fs, s3env):
    """One pointer nested 100,000 deep beside a good entry: both listed, the good one pulled."""
    from trtet_store import EngineCache

    a, key = built
    url, ep = f"s3://{s3env.bucket}/team", ("--endpoint-url", s3env.endpoint.url)
    assert cli("push", "--remote", url, *ep, "--dir", a.directory).returncode == 0
    s3env.client.put_object(Bucket=s3env.bucket, Key="team/trt-bad.json",
                            Body=b"[" * 100_000 + b"]" * 100_000)
    text = cli("list", "--remote", url, *ep)
    assert text.returncode == 0, text.stderr
    assert "RecursionError" not in text.stderr + text.stdout
    assert "trt-bad: damaged pointer, never used (the pointer nests arrays or objects " \
        "100000 deep; at most 64 is read); the next build of it replaces it" in text.stdout
    assert text.stdout.splitlines()[-1] == f"1 entries, 3.0 MiB in {url}"
    rows = cli_json("list", "--remote", url, *ep)
    assert [(r["key"], "damaged" in r) for r in rows] == [(key, False), ("trt-bad", True)]
    got = cli_json("pull", "--remote", url, *ep, "--dir", here_fs / "b", key)
    assert got == [{"key": key, "downloaded": sum(e.size for e in a.entries())}]
    b = EngineCache(here_fs / "b", max_bytes=64 * MiB, min_free=0)
    assert _build_entries(b) == _build_entries(a)


def test_push_and_pull_show_a_bar_on_a_terminal_only(built, here_fs, s3env):
    """The bar counts bytes across the keys (3 MiB here) on a terminal; none with
    --no-progress, and none off a terminal (a log gets the report alone)."""
    a, key = built
    url, ep = f"s3://{s3env.bucket}/team", ("--endpoint-url", s3env.endpoint.url)
    rc, out, err = cli_on_a_terminal("push", "--remote", url, *ep, "--dir", a.directory)
    assert rc == 0 and ": published" in out, (out, err)
    assert re.search(r"push: 100%\|.*\| (3\.0\dM)/\1 ", err), err  # the record's + 3 MiB
    rc, out, err = cli_on_a_terminal("pull", "--remote", url, *ep, "--dir", here_fs / "b",
                                     key)
    assert rc == 0 and "3.0 MiB downloaded" in out, (out, err)
    assert re.search(r"pull: 100%\|.*\| (3\.0\dM)/\1 ", err), err  # the record's + 3 MiB
    rc, out, err = cli_on_a_terminal("pull", "--remote", url, *ep, "--dir", here_fs / "c",
                                     key, "--no-progress")
    # (stderr may hold import-time warnings of torch's libraries: only the bar is looked for)
    assert rc == 0 and "3.0 MiB downloaded" in out, (out, err)
    assert "pull:" not in err and "B/s" not in err, err
    done = cli("pull", "--remote", url, *ep, "--dir", here_fs / "d", key)
    assert done.returncode == 0 and "3.0 MiB downloaded" in done.stdout, done
    assert "pull:" not in done.stderr and "B/s" not in done.stderr, done.stderr


RACE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trtet_store.cli import main
    from trtet_store.cache.tier import RemoteTier
    from trtet_store.cache.tier import store

    url, endpoint, key, other = sys.argv[1:5]
    real, done = store.put, []

    def racing(s3, bucket, object_key, body, **kw):
        # Machine B commits the key after A's upload, just before A writes its pointer.
        if object_key.endswith(key + ".json") and kw.get("if_none_match") and not done:
            done.append(1)
            got = RemoteTier(url, endpoint_url=endpoint, origin="machineb").publish(
                key, [("record", Path(other))], {"from": "machine b"})
            assert got.published, got
        return real(s3, bucket, object_key, body, **kw)

    store.put = racing
    sys.exit(main(["cache", "push", "--remote", url, "--endpoint-url", endpoint,
                   "--dir", sys.argv[5]]))
""")


def test_push_that_loses_the_race_says_so_and_leaves_the_winner(built, here_fs, s3env):
    """B commits between A's upload and A's pointer: A reports "lost race", B's entry stays."""
    a, key = built
    url = f"s3://{s3env.bucket}/team"
    other = here_fs / "b-record"
    other.write_bytes(b"machine b's build")
    done = warm.run(RACE, [url, s3env.endpoint.url, key, other, a.directory], timeout=300,
                    cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.splitlines()
    assert ": lost race (another machine published it first (host " in line, line
    [row] = cli_json("list", "--remote", url, "--endpoint-url", s3env.endpoint.url)
    assert (row["origin"], row["metadata"], row["size"]) == \
        ("machineb", {"from": "machine b"}, len(b"machine b's build"))
    # A's attempt (its uploaded engines) is gone: only B's objects under the key.
    left = [k for k in _bucket_keys(s3env) if k.startswith(f"team/{key}/")]
    assert left and all(k.startswith(f"team/{key}/machineb-") for k in left), left
    assert _no_open_uploads(s3env)


def test_parse_age():
    from trtet_store.cli.cache import parse_age

    assert [parse_age(t) for t in ("7d", "12h", "30m", "90s", "2w", "1.5h", "0s")] == \
        [7 * 86400, 12 * 3600, 30 * 60, 90, 14 * 86400, 5400, 0]
    for bad in ("7", "7y", "d", "", "1.d", "7 days", "--1d"):
        with pytest.raises(Exception, match="not an age"):
            parse_age(bad)
    for negative in ("-1d", "-0.5h"):
        with pytest.raises(Exception, match="an age cannot be negative"):
            parse_age(negative)


def test_remote_refusals_are_one_line_and_write_nothing(built, here_fs, s3env):
    a, key = built
    url, ep = f"s3://{s3env.bucket}/team", ("--endpoint-url", s3env.endpoint.url)
    before, local = _tree(a.directory), _build_entries(a)
    missing = here_fs / "missing"

    for age in ("7y", "7", "-1d"):  # refused by name: exit 2, one line
        done = cli("prune", "--remote", url, *ep, f"--older-than={age}", "--dir", a.directory)
        assert done.returncode == 2 and done.stdout == ""
        [line] = done.stderr.splitlines()
        said = "an age cannot be negative" if age.startswith("-") else "not an age"
        assert line.startswith(f"trtet-store cache prune: argument --older-than: {said}: "
                               f"'{age}'; give "), line

    for argv, words in (
            (["prune", "--older-than", "7d"], "--older-than prunes the shared tier: give "
             "--remote"),
            (["prune", "--remote", url, *ep], "prune --remote needs --older-than AGE"),
            (["prune", "--remote", url, *ep, "--older-than", "1d", "--max-bytes", "1M"],
             "--max-bytes bounds the local cache"),
            (["list", *ep], "--endpoint-url needs --remote")):
        done = cli(*argv, "--dir", a.directory)
        assert (done.returncode, done.stdout) == (2, "")
        [line] = done.stderr.splitlines()
        assert line.startswith("trtet-store cache: ") and words in line, line

    for action in (["push"], ["pull", key], ["list"], ["prune", "--older-than", "1d"]):
        for bad in ("http://bucket/x", "s3://", "s3://bucket/../x"):
            for where in (a.directory, missing):
                done = cli(*action, "--remote", bad, *ep, "--dir", where)
                assert done.returncode == 1 and done.stdout == "", (action, bad, done)
                [line] = done.stderr.splitlines()
                assert line.startswith("trtet-store cache: RemoteURLError: "), line
    for action in (["push"], ["pull", key]):  # required
        done = cli(*action, "--dir", a.directory)
        assert done.returncode == 2 and "the following arguments are required: --remote" \
            in done.stderr

    assert _tree(a.directory) == before and not missing.exists()
    assert _bucket_keys(s3env) == []

    # Reachable but wrong: a missing bucket, a closed port. One line each, exit 1.
    done = cli("list", "--remote", "s3://no-such-bucket-here", *ep)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("trtet-store cache: not found: ")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the with ends: nothing listens there
    done = cli("push", "--remote", url, "--endpoint-url", f"http://127.0.0.1:{port}",
               "--dir", a.directory)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "EndpointUnreachableError" in done.stderr or "could not connect" in done.stderr

    assert _build_entries(a) == local and not missing.exists()
    assert _bucket_keys(s3env) == [] and _no_open_uploads(s3env)


def test_compile_and_save_shares_engines_through_engine_cache_remote(here_fs, s3env, capsys):
    """Machine A builds and publishes; machine B (another cache dir) builds 0: a remote hit."""
    from trtet_store.cli import main
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

    factory = write_model_factory(here_fs)
    url = f"s3://{s3env.bucket}/team"
    assert main(["compile-and-save", "--no-progress", f"{factory}:make",
                 os.fspath(here_fs / "x.pte"), "--engine-cache", os.fspath(here_fs / "cache-x"),
                 "--engine-cache-remote", "s3:/team"]) == 1
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("trtet-store")]
    assert line.startswith("trtet-store compile-and-save: RemoteURLError: 's3:/team")
    assert sorted(p.name for p in here_fs.iterdir()) == ["model.py"]  # nothing made
    outs, built = [], []
    try:
        for machine in ("a", "b"):
            builder = FakeBuilder(engine_sizes=(ENGINE,))
            with installed(builder):
                assert main(["compile-and-save", "--no-progress", f"{factory}:make",
                             os.fspath(here_fs / f"{machine}.pte"), "--engine-cache",
                             os.fspath(here_fs / f"cache-{machine}"), "--engine-cache-remote",
                             url, "--endpoint-url", s3env.endpoint.url]) == 0
            outs.append(capsys.readouterr().out)
            built.append(len(builder.built))
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert built == [1, 0], outs
    assert ": miss, cached (" in outs[0] and ", published" in outs[0], outs[0]
    assert ": remote-hit, 1.0 MiB downloaded, " in outs[1], outs[1]
    assert file_digest(here_fs / "a.pte") == file_digest(here_fs / "b.pte")
