"""``trtet-store cache``: list, stats, prune, verify, clear, through the real console entry.

Each command runs ``python -m trtet_store.cli cache ...`` in a child process
against a real cache holding a real build (``compile_and_save(...,
engine_cache=)`` with the TensorRT build stubbed at its seam: two engine
entries and the build record) and an entry of the Torch-TensorRT adapter
(through upstream 2.14.0's own ``insert``, loaded from its wheel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import upstream
from digests import file_digest

from trtet_store.io import MiB
from trtet_store.testing import upstream_engine_cache as uec

ROOT = Path(__file__).resolve().parent.parent
ENGINE = 1 * MiB


def cli(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", "cache",
                           *map(os.fspath, argv)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


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

    factory = here_fs / "model.py"
    factory.write_text(
        "import torch\n\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), \\\n"
        "        (torch.randn(2, 16),)\n")
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
    assert built == [1, 0]
    assert "engine " in outs[0] and ": miss, cached (" in outs[0]
    assert ": hit, " in outs[1]
    assert file_digest(here_fs / "m0.pte") == file_digest(here_fs / "m1.pte")
