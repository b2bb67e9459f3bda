"""What the S3 commands (``trtet-store publish``, ``fetch``, ``compile-and-save --publish``) share.

The ``--endpoint-url`` / ``--json`` / ``--no-progress`` options, a size
argument (``16M``), sizes printed in MiB, a tqdm bar over the API's progress
callback, and the one-line error (``trtet-store CMD: Type: message``). Only
argument handling and printing: the work is the API's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ProgressBar", "add_endpoint_url", "add_report_flags", "fail", "mib", "one_line",
           "size_arg"]


def add_endpoint_url(parser: argparse.ArgumentParser) -> None:
    """Add ``--endpoint-url`` (default: what boto3 finds)."""
    parser.add_argument("--endpoint-url", default=None,
                        help="the S3 endpoint (default: what boto3 finds, e.g. AWS_ENDPOINT_URL)")


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` (print the report as JSON) and ``--no-progress``."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def size_arg(text: str) -> int:
    """A byte count from ``text`` (``8M``, ``1G``, ``4096``), for argparse ``type=``."""
    from trtet_store.bench.config import size_arg as parse

    return parse(text)


def mib(n: int) -> str:
    """``n`` bytes as ``"12.3 MiB"``."""
    return f"{n / (1 << 20):.1f} MiB"


def one_line(exc: BaseException) -> str:
    """``Type: message``, how the commands name an error."""
    return f"{type(exc).__name__}: {exc}"


def fail(command: str, text: str) -> int:
    """Print ``trtet-store COMMAND: text`` to stderr; return the exit code 1."""
    print(f"trtet-store {command}: {text}", file=sys.stderr)
    return 1


class ProgressBar:
    """A tqdm bar (bytes) over an API's progress updates, made at the first update.

    Parameters
    ----------
    desc : str
        The bar's label (the command).
    postfix : callable
        ``postfix(update) -> str``, shown after the counts.
    enabled : bool
        False: every update is ignored (``--no-progress``, ``--json``).

    The updates need ``total`` and ``done``. A context manager: the bar is
    closed on leaving, before any error or report is printed.
    """

    def __init__(self, desc: str, postfix: Callable[[Any], str], enabled: bool) -> None:
        self.desc = desc
        self.postfix = postfix
        self.enabled = enabled
        self.bar: Any = None

    def __call__(self, p: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=p.total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=self.desc, file=sys.stderr, dynamic_ncols=True)
        self.bar.n = p.done
        self.bar.set_postfix_str(self.postfix(p), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
