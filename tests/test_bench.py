"""The peak-disk benchmark on real filesystems: what it measures, what it records, what it leaves.

The headline claim is checked on the benchmark's own numbers: on a dedicated
ext4, trtet_store's consuming write needs one chunk of extra disk (+1 MiB for
metadata and block rounding) while ExecuTorch's save needs the whole payload.
On a filesystem where the payloads fit once but not twice, ExecuTorch's save
runs out of space and the benchmark records how (ENOSPC raised, or an error
only logged with a truncated file left behind) instead of crashing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from filesystems import FSTYPES, unavailable
from versions import needs_file_backed_data

pytest.importorskip("executorch.exir")
pytest.importorskip("matplotlib")

from trtet_store import bench, cli  # noqa: E402
from trtet_store.io import transfer
from trtet_store.io.units import MiB


def need_root() -> None:
    if os.geteuid() != 0:
        unavailable("the benchmark mounts a dedicated filesystem only as root")


@pytest.fixture
def image_root(monkeypatch: pytest.MonkeyPatch):
    """A private directory for the benchmark's loop images; checked empty and unmounted after."""
    root = Path(tempfile.mkdtemp(prefix="trtet-bench-test-", dir="/var/tmp"))
    monkeypatch.setenv("TRTET_FS_ROOT", os.fspath(root))
    yield root
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
    loops = [
        dev.name
        for dev in Path("/sys/block").glob("loop*")
        if str(root) in _read(dev / "loop" / "backing_file")
    ]
    leftovers = sorted(p.name for p in root.iterdir())
    if not mounts:
        shutil.rmtree(root, ignore_errors=True)
    assert not mounts, f"benchmark left mounts: {mounts}"
    assert not loops, f"benchmark left loop devices: {loops}"
    assert not leftovers, f"benchmark left files: {leftovers}"


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def test_parse_and_format_sizes() -> None:
    assert bench.parse_size("512M") == 512 * MiB
    assert bench.parse_size("1.5GiB") == 3 * 512 * MiB
    assert bench.parse_size("16 MiB") == 16 * MiB
    assert bench.parse_size("4096") == 4096
    assert bench.parse_size("2k") == 2048
    for bad in ("", "M", "12Q", "-1", "1..2G"):
        with pytest.raises(ValueError):
            bench.parse_size(bad)
    assert bench.format_size(512 * MiB) == "512.0 MiB"
    assert bench.format_size(None) == "-"
    assert bench.format_size(3) == "3 B"


def test_config_validation() -> None:
    bench.BenchConfig().validate()
    for bad in (
        {"payloads": 0},
        {"repeat": 0},
        {"filesystem": "ntfs"},
        {"methods": ("executorch", "zip")},
        {"fs_size": "huge"},
        {"segment_alignment": 1000},
        {"layout": "both"},
    ):
        with pytest.raises(ValueError):
            bench.BenchConfig(**bad).validate()
    assert set(bench.FILESYSTEMS) == {*FSTYPES, "here"}


@needs_file_backed_data
def test_bench_cli_on_ext4_move_needs_one_chunk(capsys, tmp_path: Path, image_root: Path) -> None:
    """The command end to end: table, JSON in the issue's shape, PNG; move within one chunk."""
    need_root()
    chunk = 4 * MiB
    payload = 16 * MiB
    json_path = tmp_path / "b.json"
    png_path = tmp_path / "b.png"
    code = cli.main(
        [
            "bench",
            "--payload-size", "16M",
            "--payloads", "2",
            "--chunk-size", "4M",
            "--filesystem", "ext4",
            "--repeat", "3",
            "--json", os.fspath(json_path),
            "--plot", os.fspath(png_path),
            "--no-progress",
        ]
    )  # fmt: skip
    out, _err = capsys.readouterr()
    assert code == 0, out
    assert "ExecuTorch save" in out and "trtet_store move" in out
    data = json.loads(json_path.read_text())
    runs = data["runs"]
    for r in runs:
        assert list(r)[: len(bench.RUN_FIELDS)] == list(bench.RUN_FIELDS)
        assert r["filesystem"] == "ext4" and r["payload_bytes"] == 2 * payload
        assert r["seconds"] > 0 and r["peak_rss_bytes"] > 0
    by = {m: [r for r in runs if r["method"] == m] for m in bench.METHODS}
    # ext4 cannot reflink: clone is tried once, reported with the reason, not repeated.
    (clone,) = by["clone"]
    assert clone["outcome"] == "unavailable" and "FICLONERANGE" in clone["error"]
    for m in ("executorch", "copy", "move", "insert"):
        assert [r["outcome"] for r in by[m]] == ["ok"] * 3, by[m]
    for r in by["executorch"] + by["copy"]:
        assert r["placement"] == "copy"
        assert r["peak_extra_bytes"] >= 2 * payload  # the whole payload, a second time
        assert r["extra_after_bytes"] >= 2 * payload
        assert r["bytes_written"] >= 2 * payload
    for r in by["move"]:
        assert r["placement"] == "move"
        assert r["bytes_written"] >= 2 * payload  # every byte is rewritten ...
        assert abs(r["extra_after_bytes"]) <= MiB  # ... and the payloads became the output
        # ext4 credits a truncated chunk's blocks back at the next journal commit, so a
        # single sample can see the previous chunk too; never more.
        assert r["peak_extra_bytes"] <= 2 * chunk + MiB, r["peak_extra_bytes"]
    summary = {s["method"]: s for s in data["summary"]}
    # The headline: the move needs one chunk where ExecuTorch's save needs the whole payload.
    assert summary["move"]["median"]["peak_extra_bytes"] <= chunk + MiB
    assert summary["executorch"]["median"]["peak_extra_bytes"] >= 2 * payload
    assert summary["move"]["ratio_to_executorch"]["peak_extra_bytes"] < 0.2
    assert summary["executorch"]["ratio_to_executorch"]["peak_extra_bytes"] == 1.0
    for r in by["insert"]:  # zero-copy: the payload file is renamed into place
        assert r["placement"] == "insert"
        assert r["peak_extra_bytes"] <= MiB and r["bytes_written"] <= MiB
    # Every method wrote the same bytes.
    for rep in range(3):
        digests = {r["output_digest"] for r in runs if r["repeat"] == rep and r["outcome"] == "ok"}
        assert len(digests) == 1 and None not in digests
    assert data["filesystem"]["dedicated"] is True
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_file_backed_data
def test_bench_tight_filesystem_records_executorch_failure(image_root: Path) -> None:
    """Payloads fit once, not twice: ExecuTorch's save fails, we refuse the copy, the move fits."""
    need_root()
    config = bench.BenchConfig(
        payload_size=32 * MiB,
        payloads=2,
        chunk_size=4 * MiB,
        filesystem="ext4",
        fs_size="tight",
        repeat=1,
        methods=("executorch", "copy", "move", "insert"),
    )
    result = bench.run_bench(config)
    assert result.filesystem.free_bytes < 2 * config.total_payload_bytes
    (et,) = result.runs_of("executorch")
    assert et.outcome in ("failed", "failed silently"), et
    assert "No space left" in (et.error or "") or "incomplete" in (et.error or ""), et.error
    # What it left behind is recorded: outputs shorter than planned.
    assert et.output_bytes != et.expected_output_bytes
    (copy,) = result.runs_of("copy")
    assert copy.outcome == "refused" and "InsufficientSpaceError" in copy.error
    assert copy.peak_extra_bytes <= MiB and copy.output_bytes == {}  # nothing was created
    (move,) = result.runs_of("move")
    assert move.outcome == "ok" and move.placement == "move"
    assert move.peak_extra_bytes <= 2 * 4 * MiB + MiB
    (insert,) = result.runs_of("insert")
    assert insert.outcome == "ok" and insert.placement == "insert"
    table = bench.format_table(result)
    assert "0/1" in table and "tight filesystem" in table
    assert any("ExecuTorch save" in n and "failed" in n for n in result.notes)


@needs_file_backed_data
def test_bench_here_says_it_is_shared(tmp_path: Path) -> None:
    config = bench.BenchConfig(
        payload_size=4 * MiB,
        payloads=3,
        filesystem="here",
        repeat=1,
        layout="ptd",
        workdir=tmp_path,
    )
    seen: list[str] = []
    result = bench.run_bench(config, progress=lambda phase, d, t: seen.append(phase))
    assert not result.filesystem.dedicated
    assert result.filesystem.label.startswith("here:")
    assert any("shared" in n for n in result.notes)
    assert {r.method for r in result.runs} == set(bench.METHODS)
    ok = {"ok", "unavailable"}  # zero-copy placements depend on the filesystem under us
    assert all(r.outcome in ok for r in result.runs), [(r.method, r.error) for r in result.runs]
    assert all(r.ok for r in result.runs if r.method in ("executorch", "copy", "move"))
    assert all(r.expected_output_bytes.keys() == {"model.pte", "engines.ptd"} for r in result.runs)
    assert any(p.startswith("staging") for p in seen) and any("move" in p for p in seen)
    assert list(tmp_path.iterdir()) == []  # the temp dir is gone
    d = result.to_json(timelines=False)
    assert "timeline" not in d["runs"][0] and d["config"]["layout"] == "ptd"


@needs_file_backed_data
def test_bench_interrupted_tears_the_filesystem_down(image_root: Path) -> None:
    need_root()
    config = bench.BenchConfig(payload_size=8 * MiB, payloads=1, filesystem="ext4", repeat=1)

    def interrupt(phase: str, done: int, total: int) -> None:
        if "move" in phase and done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(config, progress=interrupt)
    # image_root's teardown asserts nothing is mounted, attached or left.


@needs_file_backed_data
def test_bench_auto_shows_insert_on_ext4_and_clone_on_xfs(
        image_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` as root: ext4, then XFS, so a first run sees insert and clone; new columns."""
    need_root()
    # XFS holds free space for a moment while it clones, one call's worth
    # (transfer.CLONE_RANGE); calls of 256 KiB keep that within the bound.
    monkeypatch.setattr(transfer, "CLONE_RANGE", 256 * 1024)
    config = bench.BenchConfig(
        payload_size=8 * MiB,
        payloads=2,
        repeat=1,
        methods=("executorch", "clone", "move", "insert"),
        cached_sources=True,
    )
    result = bench.run_bench(config)
    assert result.filesystem.fstype == "ext4"
    (xfs,) = result.also
    assert xfs.filesystem.fstype == "xfs"
    (insert,) = result.runs_of("insert")
    assert insert.outcome == "ok" and insert.placement == "insert"
    assert insert.peak_over_final_bytes <= MiB
    (clone,) = xfs.runs_of("clone")
    assert clone.outcome == "ok" and clone.placement == "clone"
    assert clone.peak_over_final_bytes <= MiB
    (move,) = result.runs_of("move")
    # One sync per step of the move, the transaction's own, and the syncfs.
    assert move.syncs >= 3
    assert move.device_bytes_written >= config.total_payload_bytes
    (et,) = result.runs_of("executorch")
    assert et.syncs == 1  # only the syncfs that makes it durable
    table = bench.format_table(result)
    assert "over final" in table and "on xfs" in table
    assert json.loads(json.dumps(result.to_json()))["also"][0]["filesystem"]["type"] == "xfs"
