"""``trtet-store bench``: peak disk, bytes written, time and RSS of ExecuTorch's save vs ours.

The only CLI module that imports :mod:`trtet_store.bench`, and only when the
command runs or its help is asked for: the bench options come from
``bench.config.add_arguments`` (their defaults are the benchmark's), so the
subparser adds them the first time it parses or formats its help. Every
other command, and ``trtet-store --help``, never loads the benchmark.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trtet_store.cli._common import ProgressBar

__all__ = ["add_parser", "cmd_bench"]


class _BenchParser(argparse.ArgumentParser):
    """The ``bench`` subparser: its options are added when first needed (parse or help)."""

    _options_added = False

    def _add_options(self) -> None:
        if not self._options_added:
            from trtet_store.bench.config import add_arguments

            self._options_added = True
            add_arguments(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._add_options()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._add_options()
        return super().format_help()

    def format_usage(self) -> str:
        self._add_options()
        return super().format_usage()


def add_parser(sub: Any) -> None:
    """Register ``bench`` on the ``trtet-store`` subparsers."""
    b = sub.add_parser(
        "bench",
        help="peak disk, bytes written, time and RSS: ExecuTorch's save vs trtet_store",
        description=(
            "Build a real ExecuTorch program with N file-backed payloads and save it with "
            "ExecuTorch's own save and with trtet_store (copy, and move with consume=True), "
            "measuring each on a dedicated loop filesystem (as root) or in a temp directory."
        ),
    )
    # argparse makes subparsers of the parent's class; this one alone defers its options
    # (importing the benchmark) until `trtet-store bench` is what runs.
    b.__class__ = _BenchParser
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """``trtet-store bench``: run, print the table, write JSON and the plot."""
    from trtet_store import bench

    config = bench.BenchConfig.from_args(args)
    try:
        config.validate()
    except ValueError as exc:
        print(f"trtet-store bench: {exc}", file=sys.stderr)
        return 2
    json_path = args.json or args.out_dir / "bench.json"
    plot_path = args.plot or args.out_dir / "bench.png"
    fs_text = (
        config.filesystem
        if config.filesystem != "auto"
        else ("ext4" if os.geteuid() == 0 else "here")
    )
    print(
        f"trtet-store bench: {config.payloads} x {bench.format_size(config.payload_size)} "
        f"on {fs_text}, {config.repeat} repeat(s), methods {', '.join(config.methods)}",
        file=sys.stderr,
    )
    bars = ProgressBar(enabled=not args.no_progress, leave=False)  # a bar per phase
    try:
        with bars:
            result = bench.run_bench(config, progress=bars)
    except bench.BenchError as exc:
        print(f"trtet-store bench: {exc}", file=sys.stderr)
        return 1
    print(bench.format_table(result))
    written = bench.write_json(result, json_path)
    print(f"\nJSON: {written}")
    try:
        png = bench.plot(result, plot_path)
    except ImportError as exc:
        print(f"plot: skipped, matplotlib is not installed ({exc})", file=sys.stderr)
    else:
        print(f"plot: {png}")
    bad = bench.format_failures(result)
    for line in bad:
        print(f"trtet-store bench: {line}", file=sys.stderr)
    return 1 if bad else 0
