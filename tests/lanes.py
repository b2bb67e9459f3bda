"""The suite's lanes: the ``executorch`` marker, its guard, the split and the time checks.

A pytest plugin, registered by conftest.py.

``executorch`` marker
    Given at collection to every test whose module imports torch, executorch,
    torch_tensorrt, ``trtet_store.export`` or the TensorRT stub, directly or through a
    helper of tests/ or a module of trtet_store (its module-level imports), or whose
    module holds a child script that imports one of them or runs a tests/ script that
    does. Read from the source (``ast``), without importing it. ``CHILDREN_IMPORT_TORCH``
    names the tests it cannot see. Only these tests depend on the ExecuTorch version.

The guard
    An unmarked test during which torch or executorch is newly imported fails, naming
    the marker: in the test process (checked where neither was imported before the test,
    which a lane's plain part ensures: it never imports a marked module), and in the
    test's child processes (a ``sitecustomize`` put first on ``PYTHONPATH`` writes a line
    to a witness file when a child imports one; children run with ``-I``, ``-S`` or
    their own ``PYTHONPATH`` are not seen).

Lanes (``--lane=K/N --lane-versions=V1,...,VN``; ``make test-all``)
    Lane K runs on ExecuTorch VK: every ``executorch`` test, and its share of the
    unmarked tests, split between the lanes by test file, greedily by the durations
    recorded in tests/durations.json, each lane starting from its whole executorch part
    on its own version (a lane is its unmarked part, then its executorch part: the split
    balances the sums). A test not recorded counts its file's median (``DEFAULT_SECONDS``
    where the file has none). The lanes of the versions after the first run only a
    named smoke subset of the multi-machine engine-cache families (``SMOKE_FAMILIES``;
    ``--no-smoke``: all), said in their summary lines. ``--lane-part=plain`` runs only
    the share of unmarked
    tests (marked modules are not even imported), ``--lane-part=executorch`` only the
    marked tests.

Recording (``make durations``)
    Every lane run writes its per-test times (setup, call and teardown) to
    test-logs/durations/<version>-lane-K-of-N-<part>.json (``--record-durations`` for a
    run outside a lane); ``make durations`` (``python tests/lanes.py merge``) merges them
    into tests/durations.json, keyed by version: a marked test under the version it ran
    on, an unmarked one under the version it ran on only (it does not depend on it). So
    a ``make test-all`` then ``make durations`` refreshes every test's time, at no extra
    run. ``--write-durations`` merges one run's times at once.

Time checks
    A test whose call takes over 60 s (``TRTET_CREEP_SECONDS``) fails unless marked
    ``long_test`` (or listed in ``LONG_TESTS``, or ``slow``). In a lane, the run fails
    when its tests took more than 120% of what tests/durations.json recorded for them,
    naming the biggest growers; ``TRTET_LANE_BUDGET`` scales that budget (``2`` on a
    machine twice as slow) or turns it off (``off``). Both limits also scale by the
    machine's pace (:func:`machine_pace`): a fixed loop timed every 20 s of a run, whose
    median over the pace recorded with the durations file says how much less CPU this
    run gets (a machine loaded by ``stress-ng`` or other work, a slower kind). A loaded
    machine is not failed for its load alone; a test that grew against its neighbours is.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DURATIONS = Path(os.environ.get("TRTET_DURATIONS") or TESTS / "durations.json")

#: Imports that make a test depend on the ExecuTorch version.
ROOTS = ("torch", "torchvision", "executorch", "torch_tensorrt", "trtet_store.export",
         "trtet_store.testing.stub_tensorrt",
         # tests/warm.py imports no torch itself: its forkserver preloads torch and
         # executorch.exir by name, and every child it starts has them.
         "warm")
#: The modules whose loading, during an unmarked test, fails it.
WATCHED = ("torch", "executorch")

#: Tests the source scan cannot see: they start a child (the CLI, mostly) that imports
#: torch, through a command line rather than an import or a script in the module.
#: nodeid (or module path) -> why. The guard names any test missing here.
CHILDREN_IMPORT_TORCH: dict[str, str] = {}

#: Modules the source scan marks wrongly, and why. The guard still checks them.
NOT_EXECUTORCH: dict[str, str] = {
    "tests/test_layers.py": "its text importing trtet_store.export is a source probe for the "
                            "import walker (written to a file and parsed), not a child script",
    "tests/test_lanes.py": "its torch-importing texts are modules for the source scan to read "
                           "and a child pytest that never imports them",
}

#: Tests allowed over ``TRTET_CREEP_SECONDS`` of call time, and why (or mark them
#: ``@pytest.mark.long_test``): a nodeid (without parameters: all of them) or a test file.
#: Kept: those whose call took 20 s or more (a third of the limit) on the idle fresh-clone
#: run of 2026-12-07 (/work/ci-check2.log, both lanes side by side), which a run beside
#: ``stress-ng`` (the suite must pass loaded) may take past 60 s. The 18 other entries of
#: the loaded day's list (60-350 s at load 13-17) took under 20 s there (most under 8 s),
#: and the durations file agrees: they were dropped. Drop an entry once its test is faster.
_IDLE = "on the idle fresh-clone run of 2026-12-07"
LONG_TESTS: dict[str, str] = {
    "tests/test_publish_resume.py": f"20 SIGKILLs through a 12 MiB/s proxy, 28 s {_IDLE}",
    "tests/test_cli_cache.py": f"CLI children compiling; the terminal test 22 s {_IDLE}",
    "tests/test_crash_powercut.py": f"about 200 power cuts a test, up to 22 s {_IDLE}",
    "tests/test_inline_engines.py": f"the peak-RSS child (a fresh interpreter), 20 s {_IDLE}",
}

#: The multi-machine engine-cache families (child "machines" or processes sharing one
#: cache or bucket): file -> the tests (function names; every parameter) that the lanes of
#: the other versions run, their smoke subset. The whole family runs in the lane of the
#: first version (``--lane-versions``: 1.5.1); the others run the named subset, which
#: shows the family's path working on that version (the lease, tier and signing logic
#: they prove does not depend on ExecuTorch's version: it runs in full once). Outside a
#: lane (``make test``) and with ``--no-smoke``, every test runs. Each lane says so in
#: its summary line.
SMOKE_FAMILIES: dict[str, tuple[str, ...]] = {
    "tests/test_engine_cache_shared.py": (
        "test_a_second_machine_builds_nothing_and_downloads_each_engine_byte_once",
        "test_two_machines_starting_one_key_together_run_one_build",
        "test_the_remote_arguments_are_checked_before_anything_is_made",
    ),
    "tests/test_engine_refit_shared.py": (
        "test_a_teammates_fine_tune_downloads_the_structure_entry_once_and_refits",
    ),
    "tests/test_signed_entries.py": (
        "test_only_entries_signed_by_a_trusted_key_are_served",
        "test_key_arguments_are_checked_before_anything_is_made",
    ),
    "tests/test_engine_cache_said.py": (
        "test_a_tampered_shared_entry_is_warned_and_its_rebuild_says_why",
    ),
    "tests/test_engine_cache_export.py": (
        "test_a_second_process_builds_nothing_and_writes_the_first_ones_engine_bytes",
        "test_a_damaged_entry_is_rebuilt_never_served",
        "test_a_failing_cache_never_fails_the_export",
        "test_a_two_method_program_is_served_per_method",
    ),
    "tests/test_engine_refit_cache.py": (
        "test_new_weights_with_refittable_settings_are_refit_then_a_clone",
        "test_a_failed_refit_falls_back_to_a_build_with_the_reason_and_nothing_torn",
        "test_the_refit_gate_reads_both_the_entry_and_the_export",
    ),
    # The tier (a cache and a bucket shared by machines): a remote hit and a damaged
    # entry on this version; the tier-down, local-hit and writers' races run once.
    "tests/test_tiered_cache.py": (
        "test_a_remote_hit_is_downloaded_linked_in_and_served",
        "test_a_damaged_entry_is_never_served_and_the_rebuild_replaces_it",
    ),
    "tests/test_cache_partial_downloads.py": (
        "test_a_cut_pull_keeps_its_partial_download_and_the_next_pull_resumes_it",
        "test_a_partial_download_that_cannot_be_removed_is_said_and_stays_one_to_retry",
    ),
    # The cache's CLI: every local command on this version, and one compile through a
    # shared bucket; the other bucket and other-machine tests run once.
    "tests/test_cli_cache.py": (
        "test_clear_keeps_an_entry_another_process_is_reading",
        "test_compile_and_save_shares_engines_through_engine_cache_remote",
        "test_compile_and_save_with_engine_cache_builds_once_and_says_hit",
        "test_errors_are_one_line_and_a_nonzero_exit",
        "test_list_shows_key_size_last_use_hits_versions_and_gpu",
        "test_parse_age",
        "test_prune_evicts_the_least_recently_used_down_to_the_bound",
        "test_stats_are_the_apis",
        "test_verify_drops_a_damaged_entry_and_exits_1",
    ),
}


def smoke_drops(nodeid: str, version: str, versions: list[str]) -> bool:
    """Whether a lane on ``version`` leaves ``nodeid`` out: a test of a multi-machine family
    (:data:`SMOKE_FAMILIES`) outside its smoke subset, in a lane not of the first version."""
    if not versions or version == versions[0]:
        return False
    family = SMOKE_FAMILIES.get(_module_path(nodeid))
    if family is None:
        return False
    name = nodeid.split("::", 1)[1].split("[", 1)[0] if "::" in nodeid else ""
    return name not in family


#: Seconds a test counts when tests/durations.json has no time for it.
DEFAULT_SECONDS = 1.0
#: The lane budget: recorded seconds times this; and a run passes however much it grew
#: when it grew by less than ``BUDGET_FLOOR_SECONDS`` (small runs).
BUDGET_FACTOR = 1.2
BUDGET_FLOOR_SECONDS = float(os.environ.get("TRTET_BUDGET_FLOOR_SECONDS", "30"))

#: How often a run times :func:`machine_pace` (seconds of wall time between samples).
PACE_EVERY_SECONDS = 20.0
_PACE_WORK = 200_000  # about 20 ms of pure Python on an idle machine of CI's kind
PACE_ENV = "TRTET_MACHINE_PACE"  # tests state the pace with it instead of measuring


def machine_pace() -> float:
    """Seconds a fixed pure-Python loop takes now, the median of three: how much CPU this
    process gets. A median, not the best, because the loop spans many scheduler slices
    under load and the best of a few would still read an idle machine."""
    stated = os.environ.get(PACE_ENV)
    if stated:
        return float(stated)
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(_PACE_WORK):
            total += i % 7
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def pace_scale(now: float | None, recorded: float | None) -> float:
    """The factor this run's limits scale by: its pace over the recording's, never below 1
    (a faster machine keeps the recorded budget); 1 where either is unknown."""
    if not now or not recorded:
        return 1.0
    return max(1.0, now / recorded)


_IMPORT_IN_TEXT = re.compile(
    r"(?m)^\s*(?:import|from)\s+(torch|torchvision|executorch|torch_tensorrt|"
    r"trtet_store\.export|trtet_store\.testing\.stub_tensorrt)\b")


# --- the source scan ------------------------------------------------------------------------


def _root_of(name: str) -> str | None:
    for root in ROOTS:
        if name == root or name.startswith(root + "."):
            return root
    return None


def _module_file(name: str) -> Path | None:
    """The file of a tests/ helper or a trtet_store module, if ``name`` is one."""
    parts = name.split(".")
    if len(parts) == 1 and (TESTS / f"{name}.py").is_file():
        return TESTS / f"{name}.py"
    if parts[0] != "trtet_store":
        return None
    base = REPO.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@dataclass
class _Source:
    imports: list[str]  # module names, with ``from a import b`` giving a and a.b
    strings: list[str]


def _package_of(name: str, path: Path) -> list[str]:
    return name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]


@cache
def _scan(path: Path, name: str, module_level_only: bool) -> _Source:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return _Source([], [])
    imports: list[str] = []
    strings: list[str] = []

    def add_from(node: ast.ImportFrom) -> None:
        if node.level:
            package = _package_of(name, path)
            base = package[: len(package) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        imports.append(module)
        imports.extend(f"{module}.{alias.name}" for alias in node.names)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            imports.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            add_from(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                  "importorskip", "import_module", "__import__")):
            imports.append(node.args[0].value)
        if module_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                            | ast.Lambda):
            return
        if module_level_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return _Source(imports, strings)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


#: name -> what it reaches ("" while being scanned: an import cycle adds nothing)
_REACHES: dict[str, str] = {}


def _reaches(name: str) -> str | None:
    """What version-dependent import loading ``name`` makes (a chain ``a -> b -> torch``)."""
    root = _root_of(name)
    if root is not None:
        return root
    if name in _REACHES:
        return _REACHES[name] or None
    path = _module_file(name)
    if path is None:
        return None
    _REACHES[name] = ""
    _REACHES[name] = _reaches_uncached(name, path) or ""
    return _REACHES[name] or None


def _reaches_uncached(name: str, path: Path) -> str | None:
    helper = path.parent == TESTS
    source = _scan(path, name, module_level_only=not helper)
    for imported in dict.fromkeys([*_parents(name), *source.imports]):
        found = _reaches(imported)
        if found is not None:
            return found if _root_of(imported) else f"{imported} -> {found}"
    if helper:  # a helper's own child scripts
        for text in source.strings:
            match = _IMPORT_IN_TEXT.search(text)
            if match:
                return f"a child script importing {match.group(1)}"
    return None


@cache
def module_reason(path: Path) -> str | None:
    """Why the test module at ``path`` depends on ExecuTorch, or None."""
    path = Path(path).resolve()
    if path.is_relative_to(REPO) and path.relative_to(REPO).as_posix() in NOT_EXECUTORCH:
        return None
    source = _scan(path, path.stem, module_level_only=False)
    for imported in source.imports:
        found = _reaches(imported)
        if found is not None:
            return f"imports {imported}" + ("" if _root_of(imported) else f" -> {found}")
    scripts = {p.name: p.stem for p in TESTS.glob("*.py") if not p.name.startswith("test_")}
    for text in source.strings:
        match = _IMPORT_IN_TEXT.search(text)
        if match:
            return f"starts a child script importing {match.group(1)}"
        stem = scripts.get(text) or scripts.get(Path(text).name if "/" in text else "")
        if stem:
            found = _reaches(stem)
            if found is not None:
                return f"runs tests/{stem}.py -> {found}"
    return None


def _module_path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def item_reason(item: pytest.Item) -> str | None:
    nodeid = item.nodeid
    listed = CHILDREN_IMPORT_TORCH.get(nodeid) or CHILDREN_IMPORT_TORCH.get(
        nodeid.split("[", 1)[0]) or CHILDREN_IMPORT_TORCH.get(_module_path(nodeid))
    if listed:
        return listed
    return module_reason(Path(item.path))


def nodeid_is_marked(nodeid: str) -> bool:
    """``item_reason`` for a test known only by its id (from the durations file)."""
    if (CHILDREN_IMPORT_TORCH.get(nodeid) or CHILDREN_IMPORT_TORCH.get(nodeid.split("[", 1)[0])
            or CHILDREN_IMPORT_TORCH.get(_module_path(nodeid))):
        return True
    path = REPO / _module_path(nodeid)
    return path.is_file() and module_reason(path) is not None


def _module_may_hold_marked(path: Path) -> bool:
    rel = path.resolve().relative_to(REPO).as_posix() if path.is_relative_to(REPO) else ""
    return module_reason(path) is not None or any(
        _module_path(key) == rel for key in CHILDREN_IMPORT_TORCH)


# --- the durations file ---------------------------------------------------------------------


def executorch_version() -> str:
    """The installed ExecuTorch's version, read without importing it (nor torch)."""
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return "none"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_durations(path: Path = DURATIONS) -> dict[str, dict[str, float]]:
    """{executorch version: {nodeid: seconds of setup, call and teardown}}."""
    return {k: v for k, v in _load(path).items() if isinstance(v, dict) and not k.startswith("_")}


def recorded_pace(version: str, path: Path = DURATIONS) -> float | None:
    """The pace (:func:`machine_pace`) of the run whose recording ``version``'s times last
    came from, if it recorded one."""
    note = _load(path).get("_recorded", {}).get(version)
    pace = note.get("pace") if isinstance(note, dict) else None
    return float(pace) if isinstance(pace, (int, float)) and pace > 0 else None


def recorded_seconds(durations: dict[str, dict[str, float]], nodeid: str,
                     version: str) -> float | None:
    """The recorded time of one test on ``version``, else on another version, else None."""
    if nodeid in durations.get(version, {}):
        return float(durations[version][nodeid])
    known = [float(d[nodeid]) for d in durations.values() if nodeid in d]
    return max(known) if known else None


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def file_medians(durations: dict[str, dict[str, float]]) -> dict[str | None, dict[str, float]]:
    """{version: {test file: median recorded seconds of its tests}}, and under ``None`` the
    same over every version: what an unrecorded test of that file is taken to cost."""
    by: dict[str | None, dict[str, list[float]]] = {None: {}}
    for version, section in durations.items():
        for nodeid, seconds in section.items():
            for key in (version, None):
                by.setdefault(key, {}).setdefault(_module_path(nodeid), []).append(
                    float(seconds))
    return {key: {f: _median(v) for f, v in files.items()} for key, files in by.items()}


def expected_seconds(durations: dict[str, dict[str, float]], nodeid: str,
                     version: str | None,
                     medians: dict[str | None, dict[str, float]] | None = None) -> float:
    """The recorded time of one test: on ``version``, else the mean of the others; a test
    recorded nowhere counts its file's median (on ``version``, else on any), else
    ``DEFAULT_SECONDS``. ``medians``: :func:`file_medians` of ``durations``, computed once."""
    if version is not None and nodeid in durations.get(version, {}):
        return float(durations[version][nodeid])
    known = [float(d[nodeid]) for d in durations.values() if nodeid in d]
    if known:
        return sum(known) / len(known)
    if medians is None:
        medians = file_medians(durations)
    path = _module_path(nodeid)
    for key in (version, None):
        if path in medians.get(key, {}):
            return medians[key][path]
    return DEFAULT_SECONDS


def executorch_loads(durations: dict[str, dict[str, float]], versions: list[str],
                     smoke: bool = True) -> list[float]:
    """Each lane's executorch part on its version, in recorded seconds: every marked test
    the file holds (on any version), at its time on that version, else at its time on the
    others, else at its file's median; with ``smoke``, less what :func:`smoke_drops`
    leaves out. Known only from the file: a lane's unmarked part does not even import the
    marked modules."""
    medians = file_medians(durations)
    marked = sorted({nodeid for section in durations.values() for nodeid in section
                     if nodeid_is_marked(nodeid)})
    return [sum(expected_seconds(durations, nodeid, version, medians) for nodeid in marked
                if not (smoke and smoke_drops(nodeid, version, versions)))
            for version in versions]


def split(units: dict[str, float], bases: list[float]) -> dict[str, int]:
    """Greedy balance: each unit, longest first, to the lane with the least so far."""
    loads = list(bases)
    where: dict[str, int] = {}
    for name, seconds in sorted(units.items(), key=lambda kv: (-kv[1], kv[0])):
        lane = min(range(len(loads)), key=lambda i: (loads[i], i))
        where[name] = lane
        loads[lane] += seconds
    return where


def _write_json(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1)
        out.write("\n")
    os.replace(tmp, path)


def recording_name(version: str, lane: tuple[int, int] | None, part: str) -> str:
    """The file a run records its per-test times in, under the record directory."""
    where = f"lane-{lane[0]}-of-{lane[1]}" if lane else "run"
    return f"{version}-{where}-{part}.json"


def merge_recordings(recordings: list[dict[str, Any]], path: Path = DURATIONS) -> dict[str, Any]:
    """Merge runs' recordings (:meth:`LanesPlugin.record`) into the durations file at
    ``path``, oldest first; returns what it wrote.

    A marked test's time goes under the version it ran on. An unmarked test does not
    depend on the version: its time goes under the version it ran on and is dropped from
    the others (the newest recording wins). A ``complete`` recording (no ``-k``, ``-m``,
    ``--deselect`` or test ids) ran each of its files whole: that file's tests it did not
    run are dropped (renamed or removed tests). Tests of files that no longer exist are
    dropped. Locked: lanes may write side by side."""
    lock_path = Path(tempfile.gettempdir()) / f"trtet-durations-{os.getuid()}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _load(path)
        data.pop("_file_estimates", None)  # replaced by complete recordings and medians
        notes = data.setdefault("_recorded", {})
        for rec in sorted(recordings, key=lambda r: str(r.get("finished", ""))):
            version = str(rec["version"])
            for kind in ("executorch", "plain"):
                seen = {k: float(v) for k, v in rec.get(kind, {}).items()}
                sections = [version] if kind == "executorch" else [
                    v for v in data if not v.startswith("_")] + [version]
                files = {_module_path(k) for k in seen}
                for name in dict.fromkeys(sections):
                    section = data.setdefault(name, {})
                    for key in list(section):
                        stale = rec.get("complete") and _module_path(key) in files \
                            and key not in seen
                        other = kind == "plain" and name != version and key in seen
                        if stale or other:
                            del section[key]
                data[version].update({k: round(v, 2) for k, v in seen.items()})
            notes[version] = {k: rec.get(k) for k in ("finished", "load", "pace", "lane", "part")}
        for name in [v for v in data if not v.startswith("_")]:
            section = {k: v for k, v in data[name].items()
                       if (REPO / _module_path(k)).is_file()}
            data[name] = dict(sorted(section.items()))
        data = dict(sorted(data.items()))
        _write_json(path, data)
        return data


def write_durations(seen: dict[str, float], version: str, path: Path = DURATIONS,
                    marked: set[str] | None = None) -> None:
    """Merge one run's times into ``path`` under ``version`` (``--write-durations``)."""
    marked = marked or set()
    merge_recordings([{"version": version, "finished": _now(), "load": _load_average(),
                       "pace": machine_pace(),
                       "executorch": {k: v for k, v in seen.items() if k in marked},
                       "plain": {k: v for k, v in seen.items() if k not in marked}}], path)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


# --- the plugin -----------------------------------------------------------------------------


def addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lanes", "the suite's lanes (tests/lanes.py)")
    group.addoption("--lane", default=None, metavar="K/N",
                    help="run lane K of N: the executorch tests and this lane's share of "
                         "the others, split by tests/durations.json")
    group.addoption("--lane-versions", default=None, metavar="V1,...,VN",
                    help="the ExecuTorch version of each lane (default: this one for all)")
    group.addoption("--lane-part", default="all", choices=("all", "plain", "executorch"),
                    help="plain: only the unmarked share; executorch: only marked tests")
    group.addoption("--no-smoke", action="store_true",
                    help="lanes of the other versions run the multi-machine engine-cache "
                         "families whole too (not only their smoke subset)")
    group.addoption("--write-durations", action="store_true",
                    help="merge this run's per-test times into tests/durations.json at once")
    group.addoption("--record-durations", action="store_true",
                    help="record this run's per-test times into test-logs/durations/ "
                         "(every lane run does); make durations merges them")


WITNESS_ENV = "TRTET_TORCH_WITNESS"


def _forkserver_pid() -> int | None:
    """The pid of this run's multiprocessing forkserver (tests/warm.py's), if one started.

    Its preload imports torch and executorch once, at collection, overlapping whatever
    tests run first (unmarked ones too, outside a lane's parts): its import is not theirs.
    Its children inherit the imports and never import again, so they stay guarded."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


class LanesPlugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.version = executorch_version()
        self.part: str = config.getoption("--lane-part")
        lane = config.getoption("--lane")
        self.lane: tuple[int, int] | None = None
        if lane:
            match = re.fullmatch(r"(\d+)/(\d+)", lane)
            if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
                raise pytest.UsageError(f"--lane={lane}: expected K/N with 1 <= K <= N")
            self.lane = (int(match.group(1)), int(match.group(2)))
        versions = config.getoption("--lane-versions")
        n = self.lane[1] if self.lane else 1
        self.versions = versions.split(",") if versions else [self.version] * n
        if len(self.versions) != n:
            raise pytest.UsageError(f"--lane-versions names {len(self.versions)} versions "
                                    f"for {n} lanes")
        if self.lane and self.versions[self.lane[0] - 1] != self.version:
            raise pytest.UsageError(
                f"lane {self.lane[0]} is for executorch {self.versions[self.lane[0] - 1]}, "
                f"but this venv has {self.version}")
        self.durations = load_durations()
        self.seconds: dict[str, float] = {}
        self.marked_ids: set[str] = set()
        self.load_at_start = _load_average()
        self.paces = [machine_pace()]
        self._paced_at = time.monotonic()
        self.recorded_pace = recorded_pace(self.version)
        self.ran: set[str] = set()
        self.session: pytest.Session | None = None
        self.lane_note = ""
        self.smoke_note = ""
        self.budget_problem: list[str] = []
        self._before: dict[str, Any] = {}
        # the child witness: a sitecustomize first on PYTHONPATH, a file per run
        fd, self.witness = tempfile.mkstemp(prefix="trtet-torch-witness-")
        os.close(fd)
        os.environ[WITNESS_ENV] = self.witness
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(TESTS / "torch_witness") + (
            os.pathsep + old if old else "")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.witness)

    # collection

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        if self.part == "all" or not (collection_path.name.startswith("test_")
                                      and collection_path.suffix == ".py"):
            return None
        holds_marked = _module_may_hold_marked(collection_path)
        if self.part == "plain" and module_reason(collection_path) is not None:
            return True
        if self.part == "executorch" and not holds_marked:
            return True
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        for item in items:
            reason = item_reason(item)
            if reason is not None and item.get_closest_marker("executorch") is None:
                item.add_marker(pytest.mark.executorch(reason=reason))
        marked = [i for i in items if i.get_closest_marker("executorch") is not None]
        plain = [i for i in items if i.get_closest_marker("executorch") is None]
        self.marked_ids = {i.nodeid for i in marked}
        keep_marked = self.part in ("all", "executorch")
        keep_plain = self.part in ("all", "plain")
        if self.lane is not None:
            k, n = self.lane
            medians = file_medians(self.durations)
            units: dict[str, float] = {}
            # the executorch part collects no unmarked test: its note reads them from the file
            plain_ids = [i.nodeid for i in plain] if self.part != "executorch" else [
                nodeid for section in self.durations.values() for nodeid in section
                if not nodeid_is_marked(nodeid)]
            for nodeid in dict.fromkeys(plain_ids):
                unit = _module_path(nodeid)
                units[unit] = units.get(unit, 0.0) + expected_seconds(
                    self.durations, nodeid, None, medians)
            smoke = not config.getoption("--no-smoke")
            bases = executorch_loads(self.durations, self.versions, smoke)
            where = split(units, bases)
            mine = {u for u, lane in where.items() if lane == k - 1}
            loads = [bases[i] + sum(units[u] for u, lane in where.items() if lane == i)
                     for i in range(n)]
            plain_mine = [i for i in plain if _module_path(i.nodeid) in mine]
            families = [i for i in marked if _module_path(i.nodeid) in SMOKE_FAMILIES]
            dropped = [i for i in families
                       if smoke and smoke_drops(i.nodeid, self.version, self.versions)]
            if families and keep_marked:
                self.smoke_note = (
                    f"smoke: {len(families) - len(dropped)} of {len(families)} tests of the "
                    "multi-machine engine-cache families (tests/lanes.py SMOKE_FAMILIES), their "
                    f"full form in lane 1 (executorch {self.versions[0]})" if dropped else
                    f"the multi-machine engine-cache families in full ({len(families)} tests)")
            marked = [i for i in marked if all(i is not d for d in dropped)]
            self.lane_note = (
                f"lane {k}/{n} (executorch {self.version}): {len(marked)} executorch tests"
                f"{'' if keep_marked else ' (not in this part)'}, {len(plain_mine)} of "
                f"{len(plain)} others ({len(mine)} of {len(units)} files)"
                f"{'' if keep_plain else ' (not in this part)'}; recorded seconds by lane: "
                + ", ".join(f"{load:.0f}" for load in loads)
                + (f"; {self.smoke_note}" if self.smoke_note else ""))
            plain = plain_mine
        selected = (marked if keep_marked else []) + (plain if keep_plain else [])
        chosen = {id(i) for i in selected}
        deselected = [i for i in items if id(i) not in chosen]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [i for i in items if id(i) in chosen]

    def pytest_report_collectionfinish(self, config: pytest.Config) -> str | None:
        return self.lane_note or None

    # the guard and the per-test limit

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._before = {
            "modules": {m for m in WATCHED if m in sys.modules},
            "witness": os.path.getsize(self.witness) if os.path.exists(self.witness) else 0,
        }

    def _guard(self, item: pytest.Item) -> str | None:
        if item.get_closest_marker("executorch") is not None or not self._before:
            return None
        before = self._before
        new = [m for m in WATCHED if m in sys.modules and m not in before["modules"]]
        if new and not before["modules"]:
            return (f"{' and '.join(new)} was imported during this test, which is not marked "
                    "executorch: its result may depend on the ExecuTorch version, so it must "
                    "run on every version. Mark it executorch (pytest.mark.executorch, or list "
                    "it in tests/lanes.py CHILDREN_IMPORT_TORCH), or keep torch out of it")
        try:
            with open(self.witness, "rb") as f:
                f.seek(before["witness"])
                lines = f.read().decode(errors="replace").split("\n")
        except OSError:
            return None
        server = _forkserver_pid()
        lines = [line for line in lines if line and not (
            server is not None and re.search(rf"\(pid {server}\b", line))]
        if lines:
            return ("a child process of this test, which is not marked executorch, imported "
                    f"{lines[0]}: its result may depend on the ExecuTorch version, so it must "
                    "run on every version. Mark it executorch (list it in tests/lanes.py "
                    "CHILDREN_IMPORT_TORCH, with why)")
        return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        outcome = yield
        report = outcome.get_result()
        if report.when == "call":
            limit = float(os.environ.get("TRTET_CREEP_SECONDS", "60")) * pace_scale(
                self.paces[-1], self.recorded_pace)
            exempt = (item.get_closest_marker("long_test") or item.get_closest_marker("slow")
                      or any(key in LONG_TESTS for key in (
                          item.nodeid, item.nodeid.split("[", 1)[0], _module_path(item.nodeid))))
            if report.passed and report.duration > limit and not exempt:
                report.outcome = "failed"
                report.longrepr = (
                    f"{item.nodeid} took {report.duration:.0f} s of call time, over "
                    f"{limit:.0f} s (TRTET_CREEP_SECONDS x the pace): make it faster, or mark it "
                    "long_test (it still runs on every run) or slow (make test-long only)")
        if report.when in ("call", "teardown") and report.passed:
            problem = self._guard(item)
            if problem:
                report.outcome = "failed"
                report.longrepr = problem
                self._before = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown" and \
                time.monotonic() - self._paced_at >= PACE_EVERY_SECONDS:
            self.paces.append(machine_pace())
            self._paced_at = time.monotonic()

    def pace(self) -> float:
        """This run's pace so far: the median of its samples (:func:`machine_pace`)."""
        return statistics.median(self.paces)

    def pace_note(self) -> str:
        scale = pace_scale(self.pace(), self.recorded_pace)
        if self.recorded_pace is None:
            return f"pace {self.pace() * 1000:.1f} ms (none recorded: not scaled)"
        return (f"pace {self.pace() * 1000:.1f} ms, {self.recorded_pace * 1000:.1f} ms "
                f"recorded: limits x{scale:.2f}")

    # the lane budget, the slowest, the durations file

    def complete(self) -> bool:
        """Whether this run ran each of its files whole (nothing chosen by -k, -m, ids)."""
        opt = self.config.option
        return not (getattr(opt, "keyword", "") or getattr(opt, "markexpr", "")
                    or getattr(opt, "deselect", None) or getattr(opt, "lf", False)
                    or any("::" in str(a) for a in self.config.args))

    def record(self) -> Path:
        """This run's per-test times (setup, call and teardown) into the record directory
        (``TRTET_RECORD_DIR``, else test-logs/durations/ under the rootdir), one file a
        version, lane and part; ``make durations`` merges them (:func:`merge_recordings`)."""
        directory = Path(os.environ.get("TRTET_RECORD_DIR")
                         or Path(self.config.rootpath) / "test-logs" / "durations")
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / recording_name(self.version, self.lane, self.part)
        _write_json(path, {
            "version": self.version, "part": self.part,
            "lane": f"{self.lane[0]}/{self.lane[1]}" if self.lane else None,
            "complete": self.complete(), "finished": _now(),
            "load": [self.load_at_start, _load_average()],
            "pace": round(self.pace(), 5),
            "executorch": {k: round(v, 3) for k, v in sorted(self.seconds.items())
                           if k in self.marked_ids},
            "plain": {k: round(v, 3) for k, v in sorted(self.seconds.items())
                      if k not in self.marked_ids}})
        return path

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.config.getoption("--write-durations") and self.seconds:
            write_durations(self.seconds, self.version, marked=self.marked_ids)
            terminalreporter.write_line(
                f"durations: {len(self.seconds)} tests recorded under executorch "
                f"{self.version} in {DURATIONS}")
        if (self.lane is not None or self.config.getoption("--record-durations")) \
                and self.seconds:
            where = self.record()
            terminalreporter.write_line(
                f"durations: {len(self.seconds)} tests' times in {where} (make durations "
                "merges them into tests/durations.json)")
        if self.lane is None or not self.seconds:
            return
        knob = os.environ.get("TRTET_LANE_BUDGET", "1").strip().lower()
        # Only tests with a recorded time count: a new test has no budget yet.
        recorded = {n: recorded_seconds(self.durations, n, self.version) for n in self.seconds}
        expected = {n: s for n, s in recorded.items() if s is not None}
        unrecorded = len(self.seconds) - len(expected)
        total_expected = sum(expected.values())
        total = sum(self.seconds[n] for n in expected)
        line = (f"lane {self.lane[0]}/{self.lane[1]} ({self.part}, executorch {self.version}): "
                f"{len(self.seconds)} tests in {sum(self.seconds.values()):.0f} s; the "
                f"{len(expected)} recorded took {total:.0f} s, tests/durations.json says "
                f"{total_expected:.0f} s" + (f" ({unrecorded} not recorded)" if unrecorded else "")
                + (f"; {self.smoke_note}" if self.smoke_note else "") + f"; {self.pace_note()}")
        if knob in ("off", "0", "no", "false"):
            terminalreporter.write_line(line + " (TRTET_LANE_BUDGET=off: not checked)")
            return
        try:
            scale = float(knob)
        except ValueError:
            scale = 1.0
        scale *= pace_scale(self.pace(), self.recorded_pace)
        budget = total_expected * BUDGET_FACTOR * scale
        if total <= budget or total - total_expected * scale < BUDGET_FLOOR_SECONDS:
            terminalreporter.write_line(line + f" (budget {budget:.0f} s)")
            return
        growers = sorted(((self.seconds[n] - expected[n], n) for n in expected),
                         reverse=True)[:5]
        terminalreporter.write_line(
            line + f": OVER its budget of {budget:.0f} s (120%"
            + (f" x {scale:.2f} (TRTET_LANE_BUDGET and the pace)" if scale != 1 else "")
            + "). Biggest growers against tests/durations.json:", red=True, bold=True)
        for grew, nodeid in growers:
            terminalreporter.write_line(
                f"  +{grew:.1f} s  {nodeid} ({self.seconds[nodeid]:.1f} s, recorded "
                f"{expected[nodeid]:.1f} s)", red=True)
        terminalreporter.write_line(
            "  make it faster, or refresh the file (make durations) if the growth is meant; "
            "on a much slower machine set TRTET_LANE_BUDGET=2 (a factor) or off", red=True)
        if self.session is not None:
            self.session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- make durations -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python tests/lanes.py merge [RECORDING|DIRECTORY]...``: merge lane runs'
    recordings into tests/durations.json (``TRTET_DURATIONS``) and say what the split
    becomes; the recordings are moved into a ``merged/`` folder beside them."""
    import argparse

    parser = argparse.ArgumentParser(prog="tests/lanes.py")
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="merge recordings into the durations file")
    merge.add_argument("paths", nargs="+", type=Path)
    merge.add_argument("--versions", default="1.5.1,1.4.1",
                       help="the lanes' versions, for the split it prints")
    merge.add_argument("--keep", action="store_true", help="leave the recordings in place")
    args = parser.parse_args(argv)
    files = sorted({f for p in args.paths
                    for f in ([p] if p.is_file() else sorted(p.glob("*.json")))})
    recordings = []
    for f in files:
        rec = _load(f)
        if "version" in rec:
            recordings.append(rec)
            n = len(rec.get("executorch", {})) + len(rec.get("plain", {}))
            print(f"durations: {f}: {n} tests on executorch {rec['version']} "
                  f"(lane {rec.get('lane')}, {rec.get('part')}, load {rec.get('load')})")
    if not recordings:
        print("durations: no recording found (run make test-all or make lane first)",
              file=sys.stderr)
        return 1
    data = merge_recordings(recordings)
    durations = load_durations()
    for version, section in durations.items():
        marked = sum(1 for k in section if nodeid_is_marked(k))
        print(f"durations: {DURATIONS}: executorch {version}: {len(section)} tests "
              f"({marked} executorch), {sum(section.values()):.0f} s")
    versions = args.versions.split(",")
    bases = executorch_loads(durations, versions)
    medians = file_medians(durations)
    units: dict[str, float] = {}
    for nodeid in {k for section in durations.values() for k in section
                   if not nodeid_is_marked(k)}:
        units[_module_path(nodeid)] = units.get(_module_path(nodeid), 0.0) + \
            expected_seconds(durations, nodeid, None, medians)
    where = split(units, bases)
    for i, version in enumerate(versions):
        plain = sum(units[u] for u, lane in where.items() if lane == i)
        print(f"durations: lane {i + 1} (executorch {version}): executorch part "
              f"{bases[i]:.0f} s + unmarked part {plain:.0f} s = {bases[i] + plain:.0f} s")
    if not args.keep:
        for f in files:
            done = f.parent / "merged"
            done.mkdir(exist_ok=True)
            os.replace(f, done / f.name)
    del data
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    sys.exit(main())
