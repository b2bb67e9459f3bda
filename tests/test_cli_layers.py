"""Issue 35: the CLI is layered. Only ``cli/bench.py`` touches the benchmark, nothing touches
``trtet_store.testing``, and ``trtet-store --help`` (and every command's but bench's) loads neither.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

CLI = Path(__file__).resolve().parent.parent / "trtet_store" / "cli"

# In a child: a fresh interpreter, so nothing a test imported earlier hides a load.
HELP_CHILD = """
import contextlib, io, json, sys
import trtet_store.cli as cli
parser = cli.build_parser()
commands = [a for a in parser._subparsers._group_actions if a.dest == "command"][0].choices
loaded = {}
for argv in [["--help"]] + [[c, "--help"] for c in sorted(commands) if c != "bench"]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            cli.main(argv)
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    assert "usage: trtet-store" in out.getvalue(), argv
    loaded[" ".join(argv)] = sorted(m for m in sys.modules
                                    if m.startswith(("trtet_store.bench", "trtet_store.testing")))
print(json.dumps({"commands": sorted(commands), "loaded": loaded}))
"""


def test_help_of_every_command_loads_neither_the_benchmark_nor_the_test_fixtures() -> None:
    proc = subprocess.run([sys.executable, "-c", HELP_CHILD], capture_output=True, text=True,
                          timeout=120, check=True)
    got = json.loads(proc.stdout)
    assert {"bench", "inspect", "verify", "compile-and-save", "recover", "publish",
            "fetch"} <= set(got["commands"])
    assert got["loaded"] == {k: [] for k in got["loaded"]}, got["loaded"]
    assert len(got["loaded"]) == len(got["commands"])  # --help and every command but bench


def test_bench_help_still_lists_the_benchmark_options() -> None:
    """bench's options are added when its parser is used (its own help loads the benchmark)."""
    proc = subprocess.run([sys.executable, "-m", "trtet_store.cli", "bench", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--payload-size" in proc.stdout and "--filesystem" in proc.stdout


def test_only_cli_bench_names_the_benchmark_and_no_cli_module_the_fixtures() -> None:
    """`grep -rn "trtet_store\\.bench" trtet_store/cli | grep -v cli/bench.py` is empty, and no
    CLI module imports the benchmark or trtet_store.testing in any spelling, but the one
    test aid (issue 45 item 13): stub_builder.py imports the stub builder, only under
    TRTET_STUB_TENSORRT=1."""
    modules = sorted(CLI.glob("*.py"))
    assert {"__init__.py", "_common.py", "bench.py", "verify.py", "compile.py", "recover.py",
            "publish.py", "fetch.py", "sources.py"} <= {p.name for p in modules}
    named = [f"{p.name}:{i}: {line.strip()}" for p in modules if p.name != "bench.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"trtet_store\.bench", line)]
    assert named == []
    imports = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if (path.name, name) == ("stub_builder.py", "trtet_store.testing.stub_tensorrt"):
                    continue  # the test aid, imported inside stub_builder() when asked for
                if name.startswith("trtet_store.testing") or (
                        name.startswith("trtet_store.bench") and path.name != "bench.py"):
                    imports.append(f"{path.name}: {name}")
    assert imports == []
