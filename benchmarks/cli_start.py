#!/usr/bin/env python3
"""How long ``trtet-store inspect model.pte`` and ``trtet-store cache list`` take, wall time.

Each is a fresh ``trtet-store`` process, as a user types it, timed from the start of
the process to its exit. The two commands and a bare ``python -c pass`` (the floor:
the interpreter's own start) alternate, RUNS times each (default 5), and the medians
are printed with the fastest beside them. The program and the cache it reads are made
first, with the stub builder (no TensorRT, no GPU); its time is not counted. Neither
command needs a model, so neither imports torch or ExecuTorch's exporter
(tests/test_first_hour.py holds the imports); the target is under 1 s each.

    python3 benchmarks/cli_start.py [RUNS=5] [DIR]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FACTORY = '''\
import torch


def make():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
'''

#: The trtet-store next to this interpreter (the venv's), else ``python -m trtet_store.cli``.
_SCRIPT = Path(sys.executable).with_name("trtet-store")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "trtet_store.cli"]


def _made(directory: Path) -> None:
    """model.pte and an engine cache holding its engine (the stub builder)."""
    (directory / "m.py").write_text(FACTORY)
    env = dict(os.environ, TRTET_STUB_TENSORRT="1")
    subprocess.run([*CLI, "compile-and-save", "m.py:make", "model.pte",
                    "--engine-cache=cache", "--no-progress"],
                   cwd=directory, env=env, check=True, capture_output=True)


def _wall(argv: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    own = len(sys.argv) <= 2
    directory = Path(tempfile.mkdtemp(prefix="cli-start-") if own else sys.argv[2])
    commands = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "trtet-store inspect model.pte": [*CLI, "inspect", "model.pte"],
        "trtet-store cache list": [*CLI, "cache", "--dir", "cache", "list"],
    }
    try:
        _made(directory)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # one untimed run each: the files in the page cache
            _wall(argv, directory)
        for _ in range(runs):
            for name, argv in commands.items():  # alternating
                times[name].append(_wall(argv, directory))
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{runs} runs each, alternating; {' '.join(CLI)}; load average {load}")
        print(f"{'command':34}  {'median s':>8}  {'fastest s':>9}")
        for name, got in times.items():
            print(f"{name:34}  {statistics.median(got):8.3f}  {min(got):9.3f}")
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
