"""The durations file (tests/lanes.py): every lane run records its times, ``make durations``
merges them keyed by version, an unrecorded test counts its file's median, and the split
starts each lane from its whole executorch part. No torch here (the lanes' own files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lanes

TESTS = Path(__file__).resolve().parent
# Real test files (the merge drops tests of files that do not exist): one marked, one not.
MARKED = "tests/test_engine_reuse.py"  # not one of the smoke families
PLAIN = "tests/test_lanes.py"


def test_an_unrecorded_test_counts_its_files_median_not_zero() -> None:
    durations = {"1.5.1": {f"{MARKED}::a": 2.0, f"{MARKED}::b": 10.0, f"{MARKED}::c": 4.0},
                 "1.4.1": {f"{MARKED}::a": 1.0}}
    medians = lanes.file_medians(durations)
    assert lanes.expected_seconds(durations, f"{MARKED}::new", "1.5.1", medians) == 4.0
    assert lanes.expected_seconds(durations, f"{MARKED}::new", "1.4.1", medians) == 1.0
    # on a version with nothing of that file: the median over every version (1, 2, 4, 10)
    assert lanes.expected_seconds(durations, f"{MARKED}::new", "9.9", medians) == 3.0
    assert lanes.expected_seconds(durations, "tests/test_nowhere.py::t", None, medians) \
        == lanes.DEFAULT_SECONDS
    # recorded elsewhere only: the mean of the versions that have it
    assert lanes.expected_seconds(durations, f"{MARKED}::b", "1.4.1", medians) == 10.0


def test_each_lane_starts_from_its_whole_executorch_part() -> None:
    # Lane 1's executorch part is 100 s, lane 2's 40 s: the 60 s of unmarked files go
    # to lane 2, whatever their count.
    durations = {"1.5.1": {f"{MARKED}::a": 100.0}, "1.4.1": {f"{MARKED}::a": 40.0}}
    bases = lanes.executorch_loads(durations, ["1.5.1", "1.4.1"])
    assert bases == [100.0, 40.0]
    where = lanes.split({"x.py": 30.0, "y.py": 20.0, "z.py": 10.0}, bases)
    assert set(where.values()) == {1}


def test_merge_keys_marked_by_version_and_keeps_one_time_for_an_unmarked_test(
        tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({
        "1.5.1": {f"{MARKED}::a": 9.0, f"{MARKED}::gone": 9.0, f"{PLAIN}::p": 9.0,
                  "tests/test_no_such_file.py::t": 1.0},
        "1.4.1": {f"{MARKED}::a": 8.0},
        "_file_estimates": {MARKED: 1800}}))
    recordings = [
        {"version": "1.4.1", "complete": True, "finished": "2026-12-07T12:00:00Z",
         "executorch": {f"{MARKED}::a": 3.0}, "plain": {f"{PLAIN}::p": 0.5}},
        {"version": "1.5.1", "complete": True, "finished": "2026-12-07T12:01:00Z",
         "executorch": {f"{MARKED}::a": 4.0}, "plain": {}},
    ]
    data = lanes.merge_recordings(recordings, path)
    assert data["1.5.1"] == {f"{MARKED}::a": 4.0}  # gone: its complete file ran without it
    assert data["1.4.1"] == {f"{MARKED}::a": 3.0, f"{PLAIN}::p": 0.5}
    assert "_file_estimates" not in data
    assert data["_recorded"]["1.5.1"]["finished"] == "2026-12-07T12:01:00Z"
    # an incomplete run (-k) drops nothing it did not run
    lanes.merge_recordings([{"version": "1.5.1", "complete": False, "finished": "z",
                             "executorch": {f"{MARKED}::b": 1.0}, "plain": {}}], path)
    assert lanes.load_durations(path)["1.5.1"] == {f"{MARKED}::a": 4.0, f"{MARKED}::b": 1.0}


CONFTEST = """
import lanes
import pytest

def pytest_addoption(parser):
    lanes.addoption(parser)

def pytest_configure(config):
    config.addinivalue_line("markers", "executorch(reason): depends on ExecuTorch")
    config.pluginmanager.register(lanes.LanesPlugin(config), "trtet-lanes")
"""


def test_a_lane_run_records_every_test_and_make_durations_merges_it(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_gen.py").write_text(
        "import pytest, time\n\ndef test_a():\n    time.sleep(0.2)\n\ndef test_b():\n    pass\n\n"
        "@pytest.mark.executorch(reason='x')\ndef test_m():\n    pass\n")
    durations = tmp_path / "durations.json"
    durations.write_text("{}")
    env = dict(os.environ, PYTHONPATH=str(TESTS), TRTET_DURATIONS=str(durations))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--lane=1/1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    version = lanes.executorch_version()
    rec_path = tmp_path / "test-logs" / "durations" / f"{version}-lane-1-of-1-all.json"
    assert f"3 tests' times in {rec_path}" in done.stdout, done.stdout
    rec = json.loads(rec_path.read_text())
    assert rec["complete"] is True and rec["version"] == version and rec["lane"] == "1/1"
    assert set(rec["plain"]) == {"test_gen.py::test_a", "test_gen.py::test_b"}
    assert set(rec["executorch"]) == {"test_gen.py::test_m"}
    assert rec["plain"]["test_gen.py::test_a"] >= 0.2
    merged = subprocess.run([sys.executable, str(TESTS / "lanes.py"), "merge",
                             str(rec_path.parent)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert "durations: lane 1 (executorch 1.5.1): executorch part" in merged.stdout
    assert (rec_path.parent / "merged" / rec_path.name).is_file() and not rec_path.exists()
    # (the merge keeps tests of files under the repository only: these are under tmp_path)
    assert json.loads(durations.read_text())["_recorded"][version]["lane"] == "1/1"


def test_the_lanes_of_other_versions_run_the_named_smoke_subset_of_the_families() -> None:
    family = "tests/test_engine_refit_shared.py"
    kept = lanes.SMOKE_FAMILIES[family][0]
    versions = ["1.5.1", "1.4.1"]
    other = f"{family}::test_push_and_pull_carry_structure_entries"
    assert not lanes.smoke_drops(f"{family}::{kept}", "1.4.1", versions)
    assert not lanes.smoke_drops(f"{family}::{kept}[a-b]", "1.4.1", versions)  # parameters
    assert lanes.smoke_drops(other, "1.4.1", versions)
    assert not lanes.smoke_drops(other, "1.5.1", versions)  # the full form on the first
    assert not lanes.smoke_drops(f"{MARKED}::t", "1.4.1", versions)  # not a family
    durations = {"1.5.1": {f"{family}::{kept}": 5.0, other: 7.0},
                 "1.4.1": {f"{family}::{kept}": 5.0, other: 7.0}}
    assert lanes.executorch_loads(durations, versions) == [12.0, 5.0]
    assert lanes.executorch_loads(durations, versions, smoke=False) == [12.0, 12.0]
    # every name in the table is a test of its file (a renamed test would silently drop)
    for path, names in lanes.SMOKE_FAMILIES.items():
        text = (TESTS.parent / path).read_text()
        for name in names:
            assert f"def {name}(" in text, (path, name)
