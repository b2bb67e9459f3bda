"""``trtet-store cache export-timing``: a merged timing cache to a file, for trtexec and
TensorRT-LLM; and what ``cache list`` and ``cache stats`` say of timing entries.

Real filesystems (``here_fs``), the stub builder (its timing cache is a text file: one
``header <key>`` line, then ``<tactic> <choice>`` lines), the CLI's ``main`` in this
process. "This machine" is :func:`trtet_store.export.timing_cache.gpu_facts` replaced,
as in tests/test_timing_cache.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import xxhash
from attacker import tree
from timing_machine import SM89, machine  # noqa: F401 - the autouse fixture

import trtet_store
from trtet_store.cli import main
from trtet_store.export import timing_cache, timing_entries
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    linear_relu,
    parse_timing_cache,
    write_timing_cache,
)

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _entry(here: Path, tactics: dict[str, str], flags: dict | None = None,
           facts: dict | None = None) -> tuple[str, bytes]:
    """A timing entry as a build's merge leaves it (key, facts, metadata), put directly."""
    facts = {**(facts or SM89), "flags": flags or {}}
    key = timing_cache.timing_key(facts)
    data = write_timing_cache(key, tactics)
    src = here / f"src-{key}"
    src.write_bytes(data)
    meta = {**timing_cache._metadata(facts), "entries": len(tactics)}
    assert _cache(here).blobs.put(key, src, meta).stored
    src.unlink()
    return key, data


def _blob(here: Path, key: str) -> Path:
    hit = _cache(here).blobs.get(key)
    assert hit is not None
    with hit:
        return Path(hit.path)


def _cli(here: Path, *argv: str) -> list[str]:
    return ["cache", "--dir", os.fspath(here / "cache"), *argv]


def test_export_writes_the_merged_entry_whole_for_trtexec(here_fs, capsys):
    module, inputs = linear_relu()
    with installed(FakeBuilder(keep_timing=True, engine_sizes=(MiB,))):
        trtet_store.compile_and_save(module, inputs, here_fs / "a.pte", engine_cache=_cache(
            here_fs), store=here_fs / "store")
    [key] = [e.key for e in _cache(here_fs).entries()
             if e.metadata.get("kind") == timing_cache.TIMING_KIND]
    entry = _blob(here_fs, key).read_bytes()
    out = here_fs / "out" / "model.timing"
    out.parent.mkdir()
    assert main(_cli(here_fs, "export-timing", os.fspath(out))) == 0
    said = capsys.readouterr()
    assert out.read_bytes() == entry and parse_timing_cache(entry)[0] == key
    assert os.stat(out).st_mode & 0o777 == 0o644 & ~_umask()
    n = len(parse_timing_cache(entry)[1])
    assert said.out.strip() == (
        f"wrote {out}: the timing cache {key} ({n:,} entries, {len(entry):,} bytes) of NVIDIA "
        "L4, sm_89, tensorrt-cu12 10.14.1.48, CUDA 12.8, driver 570.124.06; on such a machine: "
        f"trtexec --timingCacheFile={out}, or TensorRT-LLM's --input_timing_cache {out}")
    assert sorted(os.listdir(out.parent)) == ["model.timing"]  # no temp file left
    # --json, and a key named by a prefix (as `cache list` shows it, whole or cut).
    again = here_fs / "out" / "again.timing"
    assert main(_cli(here_fs, "--json", "export-timing", os.fspath(again),
                     "--key", key[:12])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["key"] == key and doc["bytes"] == len(entry) and doc["entries"] == n
    assert doc["xxh3_128"] == xxhash.xxh3_128_hexdigest(entry) and again.read_bytes() == entry
    assert doc["facts"]["compute_capability"] == "sm_89"
    # The API's own face: EngineCache.export_timing_cache.
    done = _cache(here_fs).export_timing_cache(here_fs / "out" / "api.timing", key)
    assert done.key == key and (here_fs / "out" / "api.timing").read_bytes() == entry


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_existing_file_is_never_overwritten_without_replace(here_fs, capsys):
    key, data = _entry(here_fs, {"a" * 16: "0000000a"})
    out = here_fs / "out"
    out.mkdir()
    mine = out / "team.timing"
    mine.write_bytes(b"the team's own cache")
    victim = here_fs / "victim"
    victim.write_bytes(b"not to be written")
    os.symlink(victim, out / "link.timing")
    before = tree(out), tree(here_fs / "victim")
    for name in ("team.timing", "link.timing"):
        assert main(_cli(here_fs, "export-timing", os.fspath(out / name))) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"trtet-store cache: FileExistsError: {out / name} exists: left as it "
                       "was (pass --replace to overwrite it)"]
        assert (tree(out), tree(here_fs / "victim")) == before
    # --replace: replaced atomically; a link is replaced itself, never written through.
    for name in ("team.timing", "link.timing"):
        assert main(_cli(here_fs, "export-timing", os.fspath(out / name), "--replace")) == 0
        assert not (out / name).is_symlink() and (out / name).read_bytes() == data
    assert victim.read_bytes() == b"not to be written"
    assert sorted(os.listdir(out)) == ["link.timing", "team.timing"]


def test_a_key_that_is_no_timing_entry_or_not_there_is_one_line_and_writes_nothing(
        here_fs, capsys):
    out = here_fs / "out"
    out.mkdir()
    dest = out / "x.timing"
    # No cache directory at all.
    assert main(_cli(here_fs, "export-timing", os.fspath(dest))) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"trtet-store cache: no engine cache at {here_fs / 'cache'}: no timing cache to export "
        "(nothing written)"]
    assert not (here_fs / "cache").exists()
    # An entry of another kind (an engine), a key not there, no entry for this machine.
    (here_fs / "engine").write_bytes(b"\0" * 4096)
    assert _cache(here_fs).blobs.put("0123abcd" * 4, here_fs / "engine",
                                     {"kind": "trtet_store.tensorrt.engine"}).stored
    cases = [
        (["--key", "0123abcd" * 4], f"ValueError: '{'0123abcd' * 4}' is not a timing cache "
         "(kind 'trtet_store.tensorrt.engine') in the engine cache "
         f"{here_fs / 'cache'}: nothing written"),
        (["--key", "trt-t-" + "f" * 32 + "-sm_89"], "ValueError: no entry 'trt-t-" + "f" * 32
         + f"-sm_89' in the engine cache {here_fs / 'cache'}: `trtet-store cache list` shows "
         "its timing caches (kind timing)"),
        ([], "ValueError: no timing cache for this machine (NVIDIA L4, sm_89, tensorrt-cu12 "
         f"10.14.1.48, CUDA 12.8, driver 570.124.06) in the engine cache {here_fs / 'cache'}: "
         "a TensorRT build with the engine cache makes one (`trtet-store cache list` shows "
         "kind timing)"),
    ]
    # Another machine's entry is not this machine's.
    _entry(here_fs, {"a" * 16: "0000000a"}, facts={**SM89, "compute_capability": "sm_86"})
    for extra, line in cases:
        assert main(_cli(here_fs, "export-timing", os.fspath(dest), *extra)) == 1
        assert capsys.readouterr().err.strip().splitlines() == [f"trtet-store cache: {line}"]
        assert os.listdir(out) == []
    # Two for this machine (two flag sets): named, never picked.
    k1, _ = _entry(here_fs, {"a" * 16: "0000000a"})
    k2, d2 = _entry(here_fs, {"b" * 16: "0000000b"}, flags={"disable_tf32": True})
    assert main(_cli(here_fs, "export-timing", os.fspath(dest))) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 timing caches for this machine" in err[0], err
    assert k1 in err[0] and k2 in err[0] and os.listdir(out) == []
    assert main(_cli(here_fs, "export-timing", os.fspath(dest), "--key", k2)) == 0
    assert dest.read_bytes() == d2


def test_a_damaged_entry_is_never_exported(here_fs, capsys, monkeypatch):
    key, data = _entry(here_fs, {"a" * 16: "0000000a", "b" * 16: "0000000b"})
    out = here_fs / "out"
    out.mkdir()
    # Damaged after the cache pinned it and checked its seal, as it is copied out (another
    # writer of the blob, or a media error): the bytes read are digested, never trusted.
    blob = _blob(here_fs, key)
    real = timing_entries.read_fd_capped

    def damaged_then_read(fd, limit, path, what):
        os.chmod(blob, 0o600)
        with open(blob, "r+b") as f:
            f.seek(len(data) - 3)
            f.write(b"X")
        return real(fd, limit, path, what)

    monkeypatch.setattr(timing_entries, "read_fd_capped", damaged_then_read)
    assert main(_cli(here_fs, "export-timing", os.fspath(out / "x.timing"))) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(rf"trtet-store cache: ValueError: the timing cache '{key}' is damaged "
                        rf"\(its bytes \({len(data)}, xxh3-128 [0-9a-f]{{32}}\) are not the "
                        rf"sealed ones \({len(data)}, {xxhash.xxh3_128_hexdigest(data)}\)\): "
                        "dropped, nothing written", line), line
    assert os.listdir(out) == []
    assert [e.key for e in _cache(here_fs).entries()] == []  # dropped: never served either
    monkeypatch.setattr(timing_entries, "read_fd_capped", real)
    # Damaged on disk before (the cache's seal sees it): dropped, nothing written.
    key, data = _entry(here_fs, {"a" * 16: "0000000a"})
    blob = _blob(here_fs, key)
    os.chmod(blob, 0o600)
    blob.write_bytes(data[:-2] + b"zz")
    assert main(_cli(here_fs, "export-timing", os.fspath(out / "x.timing"))) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"trtet-store cache: ValueError: no entry '{key}' in the engine "
                           "cache") and "it was damaged and dropped" in line, line
    assert os.listdir(out) == []


def test_cache_list_and_stats_show_timing_entries(here_fs, capsys):
    k1, d1 = _entry(here_fs, {"a" * 16: "0000000a", "b" * 16: "0000000b"})
    k2, d2 = _entry(here_fs, {"c" * 16: "0000000c"}, flags={"disable_tf32": True})
    assert main(_cli(here_fs, "list")) == 0
    text = capsys.readouterr().out.splitlines()
    for key in (k1, k2):
        [row] = [x for x in text if x.startswith(key)]
        assert row.split()[1] == "timing" and "sm_89" in row.split()
        assert row.endswith("tensorrt-cu12=10.14.1.48"), row
    assert main(_cli(here_fs, "--json", "list")) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert {k: (r["kind"], r["size"], r["gpu"]) for k, r in rows.items()} == {
        k1: ("timing", len(d1), "sm_89"), k2: ("timing", len(d2), "sm_89")}
    assert main(_cli(here_fs, "stats")) == 0
    lines = capsys.readouterr().out.splitlines()
    [timing] = [x for x in lines if x.startswith("timing:")]
    assert re.fullmatch(r"timing: +2 timing cache\(s\), \S+ \S+, 3 tactic entries", timing), \
        timing
    assert main(_cli(here_fs, "--json", "stats")) == 0
    assert json.loads(capsys.readouterr().out)["timing"] == {"entries": 2,
                                                            "bytes": len(d1) + len(d2)}


def test_the_docs_figures_are_the_benchmarks():
    """docs/guides/timing-cache.md's stub figures are benchmarks/timing_cache.md's run."""
    bench = (ROOT / "benchmarks/timing_cache.md").read_text()
    page = (ROOT / "docs/guides/timing-cache.md").read_text()
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| (cold|warm) \| ([\d.]+) \| [\d.]+ \| (\d+) \| (\d+) \|", bench, re.M)}
    ratio = re.search(r"ratio of medians\): ([\d.]+)x", bench).group(1)
    cold, warm = rows["cold"], rows["warm"]
    assert re.search(rf"^\| cold [^|]*\| {cold[0]} s \| {cold[1]} \| 0 bytes \|$", page, re.M)
    assert re.search(rf"^\| warm [^|]*\| {warm[0]} s \| {warm[1]} \| {int(warm[2]):,} bytes \|$",
                     page, re.M)
    assert f"Cold / warm: **{ratio}x**" in page
