"""The lanes plugin (tests/lanes.py): the ``executorch`` marker, its guard, the split and
the time checks. Each run of pytest here is a child on a generated test module (a few
seconds; none imports torch: the guard is shown with a stand-in ``torch`` module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lanes

TESTS = Path(__file__).resolve().parent

CONFTEST = """
import lanes
import pytest

def pytest_addoption(parser):
    lanes.addoption(parser)

def pytest_configure(config):
    config.addinivalue_line("markers", "executorch(reason): depends on ExecuTorch")
    config.addinivalue_line("markers", "long_test: may take long")
    config.pluginmanager.register(lanes.LanesPlugin(config), "trtet-lanes")
"""

# A stand-in for torch being imported: the guard looks at sys.modules, and a real import
# of torch would cost seconds. The child script clears sys.path, so its import of torch
# reaches the witness (first on sys.meta_path) and then fails at once. (Spelled so that the
# source scan does not see a child importing torch and mark the whole module.)
BODIES = """
import subprocess
import sys
import types

import pytest

CHILD = ("import sys\\nsys.path.clear()\\n"
         "try:\\n    __import__('tor' + 'ch')\\nexcept ImportError:\\n    pass\\n")

def test_plain():
    pass

def test_child_loads_torch():
    subprocess.run([sys.executable, "-c", CHILD], check=True)

@pytest.mark.executorch(reason="said so")
def test_marked_child_loads_torch():
    subprocess.run([sys.executable, "-c", CHILD], check=True)

def test_loads_torch_in_process():
    sys.modules["torch"] = types.ModuleType("torch")

@pytest.mark.executorch(reason="said so")
def test_marked_loads_torch_in_process():
    sys.modules["executorch"] = types.ModuleType("executorch")
"""


def run_pytest(directory: Path, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess:
    # The pace is stated, never measured, unless a test states its own: a loaded machine
    # would otherwise scale the child's limits up and a test over them would pass (CI, stop 59).
    child_env = dict(os.environ, PYTHONPATH=str(TESTS), TRTET_MACHINE_PACE="1e-9")
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *args],
        cwd=directory, env=child_env, capture_output=True, text=True, timeout=120)


def make_suite(tmp_path: Path, body: str) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_generated.py").write_text(textwrap.dedent(body))
    return tmp_path


def test_an_unmarked_test_that_loads_torch_fails_naming_the_marker(tmp_path: Path) -> None:
    # In file order: once torch is loaded, the in-process check has nothing left to see
    # (which is why a lane's unmarked part never imports a marked module).
    result = run_pytest(make_suite(tmp_path, BODIES))
    out = result.stdout
    assert result.returncode == 1, out
    failed = {line.split()[1] for line in out.splitlines() if line.startswith("FAILED ")}
    assert failed == {"test_generated.py::test_child_loads_torch",
                      "test_generated.py::test_loads_torch_in_process"}, out
    assert "torch was imported during this test, which is not marked executorch" in out
    assert "a child process of this test, which is not marked executorch, imported torch" in out
    assert "3 passed" in out


def test_the_source_scan_marks_what_reaches_torch(tmp_path: Path) -> None:
    cases = {
        "direct.py": ("import torch\n", "imports torch"),
        "lazy.py": ("def f():\n    from executorch.exir import to_edge\n",
                    "imports executorch.exir"),
        "stub.py": ("from trtet_store.testing import stub_tensorrt\n",
                    "imports trtet_store.testing.stub_tensorrt"),
        "helper.py": ("import programs\n", "imports programs -> torch"),
        "chain.py": ("from test_fetch_neighbours import x\n",
                     "imports test_fetch_neighbours -> lowered -> programs -> torch"),
        "child.py": ('CHILD = """\nimport sys\nfrom trtet_store.export import compile\n"""\n',
                     "starts a child script importing trtet_store.export"),
        "skip.py": ('import pytest\ntorch = pytest.importorskip("torch")\n', "imports torch"),
        "plain.py": ("import os\nfrom trtet_store.io import Blob\nimport attacker\n"
                     "import trtet_store.cli\n", None),
    }
    for name, (text, reason) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert lanes.module_reason(path) == reason, name


def test_the_split_balances_files_longest_first() -> None:
    units = {"a": 10.0, "b": 7.0, "c": 5.0, "d": 3.0, "e": 1.0}
    assert lanes.split(units, [0.0, 0.0]) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    # a lane already heavier with its executorch tests gets less of the rest
    where = lanes.split(units, [20.0, 0.0])
    assert [u for u, lane in where.items() if lane == 0] == ["d"]


def test_each_lane_runs_the_marked_tests_and_its_share(tmp_path: Path) -> None:
    body = "".join(f"def test_{n}():\n    pass\n\n" for n in "ab") + (
        "import pytest\n\n@pytest.mark.executorch(reason='x')\ndef test_m():\n    pass\n")
    for name in ("one", "two"):
        (tmp_path / f"test_{name}.py").write_text(body)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    ran = []
    for k in (1, 2):
        result = run_pytest(tmp_path, f"--lane={k}/2", "-rA")
        assert result.returncode == 0, result.stdout
        ran.append({line.split()[1] for line in result.stdout.splitlines()
                    if line.startswith("PASSED ")})
        assert f"lane {k}/2 (executorch " in result.stdout
    marked = {"test_one.py::test_m", "test_two.py::test_m"}
    assert marked <= ran[0] and marked <= ran[1]
    plain = [r - marked for r in ran]
    assert plain[0] and plain[1] and not plain[0] & plain[1]
    assert plain[0] | plain[1] == {f"test_{f}.py::test_{t}" for f in ("one", "two")
                                   for t in "ab"}


def test_a_test_over_the_limit_fails_unless_marked_long(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, """
        import time
        import pytest

        def test_slow():
            time.sleep(0.3)

        @pytest.mark.long_test
        def test_slow_but_marked():
            time.sleep(0.3)
    """)
    result = run_pytest(suite, env={"TRTET_CREEP_SECONDS": "0.2"})
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed" in result.stdout
    assert "FAILED test_generated.py::test_slow - " in result.stdout, result.stdout
    assert "of call time, over 0 s (TRTET_CREEP_SECONDS x the pace): make it faster, or mark it " \
           "long_test" in result.stdout


def test_a_lane_over_its_budget_fails_naming_the_growers(tmp_path: Path) -> None:
    suite = make_suite(tmp_path, """
        import time

        def test_grew():
            time.sleep(1.5)

        def test_steady():
            pass
    """)
    version = lanes.executorch_version()
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({version: {"test_generated.py::test_grew": 0.1,
                                               "test_generated.py::test_steady": 0.1}}))
    env = {"TRTET_DURATIONS": str(durations), "TRTET_BUDGET_FLOOR_SECONDS": "0"}
    result = run_pytest(suite, "--lane=1/1", env=env)
    assert result.returncode == 1, result.stdout
    assert "OVER its budget" in result.stdout
    growers = result.stdout.split("Biggest growers")[1].splitlines()
    assert "test_generated.py::test_grew" in growers[1], growers
    relaxed = run_pytest(suite, "--lane=1/1", env={**env, "TRTET_LANE_BUDGET": "off"})
    assert relaxed.returncode == 0, relaxed.stdout
    assert "TRTET_LANE_BUDGET=off: not checked" in relaxed.stdout


def test_a_loaded_machine_scales_the_limits_by_its_pace(tmp_path: Path) -> None:
    # The same growth fails on a machine of the recording's pace and passes on one five
    # times slower (stress-ng beside the run): the budget and the per-test limit scale by
    # the run's pace over the recorded one. The pace is stated (TRTET_MACHINE_PACE), not
    # measured, so the test does not depend on how loaded this machine is.
    suite = make_suite(tmp_path, """
        import time

        def test_grew():
            time.sleep(0.6)

        def test_steady():
            pass
    """)
    version = lanes.executorch_version()
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({
        "_recorded": {version: {"pace": 0.01}},
        version: {"test_generated.py::test_grew": 0.1, "test_generated.py::test_steady": 0.1}}))
    env = {"TRTET_DURATIONS": str(durations), "TRTET_BUDGET_FLOOR_SECONDS": "0",
           "TRTET_LANE_BUDGET": "1", "TRTET_CREEP_SECONDS": "0.2"}
    same = run_pytest(suite, "--lane=1/1", env={**env, "TRTET_MACHINE_PACE": "0.01"})
    assert same.returncode == 1, same.stdout
    assert "FAILED test_generated.py::test_grew - " in same.stdout, same.stdout
    assert "OVER its budget of 0 s" in same.stdout and "limits x1.00" in same.stdout
    loaded = run_pytest(suite, "--lane=1/1", env={**env, "TRTET_MACHINE_PACE": "0.05"})
    assert loaded.returncode == 0, loaded.stdout
    assert "pace 50.0 ms, 10.0 ms recorded: limits x5.00 (budget 1 s)" in loaded.stdout


def test_a_recording_keeps_its_pace_for_the_next_runs_budget(tmp_path: Path) -> None:
    recording = {"version": "9.9", "finished": "2026-12-07T00:00:00Z", "pace": 0.02,
                 "executorch": {}, "plain": {"tests/test_lanes.py::test_plain": 0.5}}
    data = lanes.merge_recordings([recording], tmp_path / "durations.json")
    assert data["_recorded"]["9.9"]["pace"] == 0.02
    assert lanes.pace_scale(0.05, 0.02) == 2.5
    assert lanes.pace_scale(0.01, 0.02) == 1.0  # a faster machine keeps the budget
    assert lanes.pace_scale(0.05, None) == 1.0


def test_the_unmarked_part_never_imports_a_marked_module(tmp_path: Path) -> None:
    # Were test_et.py imported, torch would be loaded before the unmarked tests and the
    # in-process guard would see nothing; it is left uncollected, not deselected.
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_et.py").write_text("import torch\n\ndef test_et():\n    pass\n")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    plain = run_pytest(tmp_path, "--lane-part=plain", "-rA")
    assert plain.returncode == 0, plain.stdout
    assert "PASSED test_plain.py::test_plain" in plain.stdout
    assert "1 passed in" in plain.stdout and "deselected" not in plain.stdout, plain.stdout
