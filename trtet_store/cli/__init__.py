"""The ``trtet-store`` command: a thin shell over the API, one module per command.

Subcommands::

    trtet-store bench [--payload-size SIZE] [--payloads N] [--chunk-size SIZE]
                      [--filesystem auto|ext4|xfs|btrfs|tmpfs|here] [--fs-size fit|tight|SIZE]
                      [--repeat N] [--json FILE] [--plot FILE] ...
    trtet-store inspect FILE [--json]
    trtet-store verify FILE [--data FILE.ptd] [--run] [--json]
    trtet-store compile-and-save [MODULE.py:FACTORY] OUT [--method NAME=MODULE.py:FACTORY ...]
                                 [--backend tensorrt|xnnpack] [--backend-config KEY=VALUE ...]
                                 [--publish s3://BUCKET/KEY.pte] [--engine-cache [DIR]]
                                 [--engine-cache-remote s3://BUCKET[/PREFIX]]
    trtet-store recover DIR [--json] [--abandon]
    trtet-store publish FILE... s3://BUCKET/KEY [--replace] [--resume] [--abort] [--list]
    trtet-store fetch s3://BUCKET/KEY OUT [--reuse OLD.pte]
    trtet-store publish-set s3://BUCKET/PREFIX/ --member NAME FILE.pte [FILE.ptd...] ...
                            [--needs NAME cc=8.9,tensorrt=10.3.0] [--replace]
    trtet-store fetch-set s3://BUCKET/PREFIX/ DIR [--member NAME] [--store DIR] [--link]
                          [--replace-needed] [--compute-capability X.Y] [--tensorrt VERSION]
    trtet-store cache [--dir DIR] [--json] list|stats|prune [--max-bytes N]|verify|clear
    trtet-store cache [--dir DIR] [--json] list|push [KEY...]|pull KEY...|prune --older-than AGE
                      --remote s3://BUCKET[/PREFIX] [--endpoint-url URL] [--no-progress]

Exit codes: 0 success; 1 the command ran and found a problem (verify found
errors, a trtet_store method failed in the benchmark, a compile failed);
2 usage errors (argparse's own); 130 interrupted.

Each command is a module with ``add_parser(sub)`` and its ``cmd_*``; what
they share (the one progress bar, the one error table, sizes, the S3
options) is :mod:`trtet_store.cli._common`. Everything heavy (torch,
executorch, boto3, matplotlib, tqdm, the benchmark) is imported inside the
command that needs it, so ``trtet-store inspect`` and ``recover`` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from trtet_store import __version__
from trtet_store.cli import bench, cache, fetch, publish, recover, sets, verify
from trtet_store.cli import compile as compile_  # the module, not the builtin
from trtet_store.cli._common import Parser, report_error, sigterm_as_exit

__all__ = ["main", "build_parser"]

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (bench, verify, compile_, recover, cache, fetch, publish, sets)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trtet-store`` (exposed for docs and tests)."""
    parser = Parser(
        prog="trtet-store",
        description="Disk-aware storage for TensorRT engines in ExecuTorch programs.",
    )
    parser.add_argument("--version", action="version", version=f"trtet-store {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log what the library does (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


#: Options whose value may look like an option to argparse (``--older-than -1d``).
_SIGNED_VALUES = ("--older-than",)


#: Options with an optional value (``--engine-cache [DIR]``): a value never swallows a
#: positional (``--engine-cache m.py:make out.pte`` is the default cache, then both
#: positionals). ``--engine-cache=DIR`` always takes DIR.
_OPTIONAL_VALUES = ("--engine-cache",)


def _positional(token: str) -> bool:
    """Whether ``token`` is compile-and-save's positional, not a directory: a
    ``MODULE.py:FACTORY`` or a program (``OUT.pte``)."""
    return bool(re.search(r"\.py:[A-Za-z_][\w.]*$", token)) or token.endswith(".pte")


def _negative_values_joined(argv: Sequence[str] | None) -> list[str]:
    """``--older-than -1d`` as ``--older-than=-1d``: its type then refuses it by name.

    argparse takes ``-1d`` for an option (it is no plain negative number) and
    says only "expected one argument". And an optional-value option before a
    positional (``--engine-cache m.py:make``) is given without its value
    (``--engine-cache=``): :func:`_positional`.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    i = 0
    while i < len(args):
        if (args[i] in _SIGNED_VALUES and i + 1 < len(args)
                and re.match(r"-[\d.]", args[i + 1])):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
            continue
        if args[i] in _OPTIONAL_VALUES and i + 1 < len(args) and _positional(args[i + 1]):
            out.append(f"{args[i]}=")  # the option without its value; the token stays positional
            i += 1
            continue
        out.append(args[i])
        i += 1
    return out


@contextlib.contextmanager
def _warnings_as_lines() -> Any:
    """A shared tier's warning is one line on stderr (``trtet-store: warning: ...``)."""
    import warnings

    shown = warnings.showwarning

    def show(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
        from trtet_store.cache.tier.health import SharedCacheWarning

        if issubclass(category, SharedCacheWarning):
            print(f"trtet-store: warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


#: Third-party packages whose warnings (logged, or ``warnings.warn``) are shown only with
#: ``-v``: torchao's "Failed to load ..._C_mxfp8...so" and torch's deprecation notes on
#: every command that imports torch say nothing about the command.
QUIET_PACKAGES = ("torch", "torchao", "executorch", "torch_tensorrt")


@contextlib.contextmanager
def _third_party_quiet(quiet: bool) -> Any:
    """Without ``-v``: :data:`QUIET_PACKAGES`' warnings hidden (their errors still shown);
    trtet_store's own warnings are unchanged. Set before they are imported, undone after."""
    if not quiet:
        yield
        return
    import warnings

    loggers = [logging.getLogger(name) for name in QUIET_PACKAGES]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    # torch sets its loggers' levels when imported, from TORCH_LOGS ("-all": errors only);
    # a value the user set is theirs, and an import already done is past asking.
    torch_logs = "TORCH_LOGS" not in os.environ and "torch" not in sys.modules
    if torch_logs:
        os.environ["TORCH_LOGS"] = "-all"
    pattern = "|".join(re.escape(name) for name in QUIET_PACKAGES)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=rf"({pattern})(\.|$)")
            # Notes to developers of the code that called (torch's own, through copyreg):
            # nothing a user of the command can act on.
            for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
                warnings.filterwarnings("ignore", category=category)
            warnings.filterwarnings("default", message=r"trtet_store\.")  # ours are shown
            yield
    finally:
        if torch_logs:
            os.environ.pop("TORCH_LOGS", None)
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _command_parser(parser: argparse.ArgumentParser,
                    args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser ``args`` went through (``cache``'s ``list``): whose usage to show."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[chosen]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtet-store`` console script.

    Args:
        argv: Arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        The exit code.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(_negative_values_joined(argv))
    if extra and getattr(args, "command", None) == "compile-and-save" and \
            not any(e.startswith("-") for e in extra):
        # OUT after an option (`m.py:f --method a=m.py:g OUT`): argparse ends the
        # positionals at the first option; compile_source judges them all.
        args.paths += extra
    elif extra:
        # The usage of the command given (`cache list`'s, not trtet-store's): what to fix.
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verbose:
        logging.basicConfig(
            level=logging.DEBUG if args.verbose > 1 else logging.INFO,
            format="%(levelname)s %(name)s: %(message)s",
        )
    try:
        with sigterm_as_exit(), _warnings_as_lines(), _third_party_quiet(not args.verbose):
            return int(args.func(args))
    except KeyboardInterrupt:
        print("trtet-store: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): say nothing more, like other CLI tools.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        # Whatever a command did not catch (botocore's NoCredentialsError, say) is
        # still one line from the error table; -v keeps the traceback for a report.
        if args.verbose:
            raise
        return report_error(exc, args.command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
