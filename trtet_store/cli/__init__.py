"""The ``trtet-store`` command: a thin shell over the API.

Subcommands::

    trtet-store bench [--payload-size SIZE] [--payloads N] [--chunk-size SIZE]
                      [--filesystem auto|ext4|xfs|btrfs|tmpfs|here] [--fs-size fit|tight|SIZE]
                      [--repeat N] [--json FILE] [--plot FILE] ...
    trtet-store inspect FILE [--json]
    trtet-store verify FILE [--data FILE.ptd] [--run] [--json]
    trtet-store compile-and-save [MODULE.py:FACTORY] OUT [--method NAME=MODULE.py:FACTORY ...]
                                 [--backend tensorrt|xnnpack] [--backend-config KEY=VALUE ...]
    trtet-store recover DIR [--json] [--abandon]

Exit codes: 0 success; 1 the command ran and found a problem (verify found
errors, a trtet_store method failed in the benchmark, a compile failed);
2 usage errors (argparse's own); 130 interrupted.

Everything heavy (torch, executorch, matplotlib, tqdm) is imported inside the
command that needs it, so ``trtet-store inspect`` and ``recover`` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trtet_store.cli._common import bar_interval, report_error

__all__ = ["main", "build_parser"]


def _size_arg(text: str) -> int:
    from trtet_store.bench.config import size_arg

    return size_arg(text)


def _engine_digest_arg(text: str) -> str:
    """``--engine-digest``: 32 hex digits (or ``<digest>_trt_engine``), refused otherwise."""
    from trtet_store.inspector.verify import parse_engine_digest

    try:
        return parse_engine_digest(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trtet-store`` (exposed for docs and tests)."""
    from trtet_store.bench.config import add_arguments

    parser = argparse.ArgumentParser(
        prog="trtet-store",
        description="Disk-aware storage for TensorRT engines in ExecuTorch programs.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log what the library does (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser(
        "bench",
        help="peak disk, bytes written, time and RSS: ExecuTorch's save vs trtet_store",
        description=(
            "Build a real ExecuTorch program with N file-backed payloads and save it with "
            "ExecuTorch's own save and with trtet_store (copy, and move with consume=True), "
            "measuring each on a dedicated loop filesystem (as root) or in a temp directory."
        ),
    )
    add_arguments(b)
    b.set_defaults(func=cmd_bench)

    i = sub.add_parser(
        "inspect",
        help="the layout of a .pte or .ptd",
        description="Headers, segments, named data, delegates and TensorRT "
        "blob headers of a .pte or .ptd; payload bytes are not read.",
    )
    i.add_argument("file", type=Path, metavar="FILE")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser(
        "verify",
        help="structural checks, optionally a runtime load",
        description="Check magic, versions, offsets and segments against the "
        "file's size; with --data also the .ptd and the keys the .pte needs from "
        "it; with --run load the program with the ExecuTorch runtime.",
    )
    v.add_argument("file", type=Path, metavar="FILE")
    v.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="FILE.ptd",
        help="the .ptd the program reads external data from",
    )
    v.add_argument(
        "--run",
        action="store_true",
        help="load the program (and its methods, where the backend is registered)",
    )
    v.add_argument(
        "--engine-digest",
        action="append",
        default=None,
        type=_engine_digest_arg,
        metavar="XXH3_128",
        help="an engine's expected xxh3-128 digest (repeat for each engine); any TensorRT "
        "engine with another digest is an error",
    )
    v.add_argument("--json", action="store_true", help="print JSON instead of text")
    v.set_defaults(func=cmd_verify)

    c = sub.add_parser(
        "compile-and-save",
        help="lower a model and save it (engines moved, not copied)",
        description="Import MODULE.py, call FACTORY() for (module, inputs), and "
        "run trtet_store.compile_and_save(module, inputs, OUT); with --method, one "
        "method per factory in one program.",
    )
    c.add_argument(
        "paths",
        nargs="*",
        metavar="[MODULE.py:FACTORY] OUT",
        help="FACTORY() returns (module, example_inputs), a dict with 'module' and "
        "'inputs', or a module with an 'example_inputs' attribute; OUT is the .pte to "
        "write (with --publish, optional). Without FACTORY, give --method",
    )
    c.add_argument(
        "--method",
        action="append",
        default=[],
        metavar="NAME=MODULE.py:FACTORY",
        help="a method of the program (repeat: e.g. prefill=m.py:prefill "
        "decode=m.py:decode); each is exported with its own example inputs",
    )
    c.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ExecutorchBackendConfig field for to_executorch (repeat), e.g. "
        "segment_alignment=4096, extract_delegate_segments=true",
    )
    c.add_argument(
        "--external-weights",
        default=None,
        metavar="NAME",
        help="weights of what TensorRT leaves to other partitioners in NAME.ptd",
    )
    c.add_argument("--backend", default="tensorrt", help="tensorrt (default) or xnnpack")
    c.add_argument(
        "--external-engine-data",
        default=None,
        metavar="NAME",
        help="put engines (xnnpack: weights) in NAME.ptd beside OUT",
    )
    c.add_argument(
        "--segment-alignment",
        type=_size_arg,
        default=None,
        metavar="N",
        help="segment alignment of the program (4096: page-aligned payloads)",
    )
    c.add_argument("--etrecord", action="store_true", help="also write OUT_etrecord.bin")
    c.add_argument(
        "--store",
        type=Path,
        default=None,
        metavar="DIR",
        help="staging directory for engines (default beside OUT); engines of a failed run "
        "stay there and the next run of the same export reuses them",
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wait this long for another write of OUT to finish (default: refuse at once)",
    )
    c.add_argument(
        "--versioned",
        action="store_true",
        help="write the .pte and .ptd files as a new version in OUT's .versions/ and switch "
        "the symlink OUT without its suffix to it atomically (readers resolve it once and "
        "get one consistent set); 3 versions are kept",
    )
    c.add_argument(
        "--keep-versions",
        type=int,
        default=None,
        metavar="N",
        help="with --versioned (implied), keep N versions instead of 3",
    )
    c.add_argument(
        "--replace-needed",
        action="store_true",
        help="replace a .ptd that another .pte beside OUT needs (by default refused, before "
        "the build: ExecuTorch names .ptd files by tag, so two programs collide)",
    )
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    from trtet_store.cli.publish import add_compile_publish_arguments

    add_compile_publish_arguments(c)
    c.set_defaults(func=cmd_compile_and_save)

    r = sub.add_parser(
        "recover",
        help="finish or undo writes a crash interrupted",
        description="Roll forward or back every interrupted write whose journal "
        "is in DIR (the output directory).",
    )
    r.add_argument("dir", type=Path, metavar="DIR")
    r.add_argument("--json", action="store_true", help="print JSON instead of text")
    r.add_argument(
        "--abandon",
        action="store_true",
        help="give up writes that can be neither finished nor rolled back (a file they need "
        "is gone): delete their journals and the temp files they kept, saying what is given up",
    )
    r.set_defaults(func=cmd_recover)

    from trtet_store.cli.fetch import add_parser as add_fetch_parser

    add_fetch_parser(sub)
    from trtet_store.cli.publish import add_parser as add_publish_parser

    add_publish_parser(sub)
    return parser


# --- progress ---------------------------------------------------------------------------


class _Bars:
    """tqdm bars keyed by phase name, for the library's ``progress(phase, done, total)``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._phase: str | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self._phase:
            self.close()
            self._phase = phase
            self._bar = tqdm(
                total=total,
                desc=phase,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                leave=False,
                dynamic_ncols=True,
                file=sys.stderr,
                mininterval=bar_interval(),  # not a terminal: a line every few seconds
            )
        bar = self._bar
        if bar.total != total:
            bar.total = total
        if done > bar.n:
            bar.update(done - bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._phase = None


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so cleanup (unmounting) runs."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- commands --------------------------------------------------------------------------


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
    bars = _Bars(enabled=not args.no_progress)
    try:
        result = bench.run_bench(config, progress=bars)
    except bench.BenchError as exc:
        print(f"trtet-store bench: {exc}", file=sys.stderr)
        return 1
    finally:
        bars.close()
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


def cmd_inspect(args: argparse.Namespace) -> int:
    """``trtet-store inspect``: print the layout; exit 1 if it has structural errors."""
    from trtet_store.inspector import format_inspection, inspect_file

    try:
        ins = inspect_file(args.file)
    except OSError as exc:
        print(f"trtet-store inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(ins.to_json(), indent=1))
    else:
        print(format_inspection(ins))
    return 1 if ins.errors else 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``trtet-store verify``: structural checks (and a runtime load); exit 1 on any error."""
    from trtet_store.inspector import format_verify, verify

    try:
        result = verify(args.file, data=args.data, run=args.run,
                        engine_digests=args.engine_digest)
    except (OSError, ValueError) as exc:
        print(f"trtet-store verify: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(format_verify(result))
    return 0 if result.ok else 1


def cmd_compile_and_save(args: argparse.Namespace) -> int:
    """``trtet-store compile-and-save``: lower and save through ``trtet_store.compile_and_save``."""
    from trtet_store import compile_and_save
    from trtet_store.cli import publish as cli_remote
    from trtet_store.cli import sources as cli_sources

    try:
        source, inputs, out = cli_sources.compile_source(
            args.paths, args.method, out_optional=args.publish is not None)
        backend_config = cli_sources.backend_config(args.backend_config)
    except Exception as exc:
        print(f"trtet-store compile-and-save: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if out is None:  # --publish without OUT: from the program's pieces, nothing written here
        return cli_remote.compile_and_publish(args, source, inputs, backend_config)
    kwargs: dict[str, Any] = {"backend": args.backend}
    if backend_config is not None:
        kwargs["backend_config"] = backend_config
    if args.external_engine_data is not None:
        kwargs["external_engine_data"] = args.external_engine_data
    if args.external_weights is not None:
        kwargs["external_weights"] = args.external_weights
    if args.segment_alignment is not None:
        kwargs["segment_alignment"] = args.segment_alignment
    if args.etrecord:
        kwargs["generate_etrecord"] = True
    if args.store is not None:
        # A directory, not a BlobStore: the call's own store there keeps a
        # failed run's engines as orphans, where the next run finds them.
        kwargs["store"] = args.store
    if args.timeout is not None:
        kwargs["timeout"] = args.timeout
    if args.versioned or args.keep_versions is not None:
        kwargs["versioned"] = True if args.keep_versions is None else args.keep_versions
    if args.replace_needed:
        kwargs["replace_needed"] = True
    bars = _Bars(enabled=not args.no_progress)
    kwargs["progress"] = lambda done, total: bars("writing", done, total)
    try:
        report = compile_and_save(source, inputs, out, **kwargs)
    except Exception as exc:
        bars.close()  # before the error line
        return report_error(exc, "compile-and-save", out=out)
    finally:
        bars.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(f"wrote {report.path}")
        for w in report.writes:
            print(f"  {w.path}: {w.size} bytes in {w.seconds:.2f} s")
            for p in w.placements:
                print(f"    payload at {p.offset}, {p.size} bytes: {p.placement} ({p.reason})")
    if args.publish is not None:
        return cli_remote.publish_written(args, [w.path for w in report.writes])
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    """``trtet-store recover``: roll interrupted writes in DIR forward or back."""
    import trtet_store

    if not args.dir.is_dir():
        print(f"trtet-store recover: {args.dir} is not a directory", file=sys.stderr)
        return 1
    try:
        outcomes = trtet_store.recover(args.dir, abandon=args.abandon)
    except Exception as exc:
        print(f"trtet-store recover: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([o.to_json() for o in outcomes], indent=1))
    elif not outcomes:
        print(f"{args.dir}: nothing to recover")
    else:
        for o in outcomes:
            outs = ", ".join(os.fspath(x) for x in o.outputs) or "-"
            print(f"{o.journal}: {o.action} ({outs})" + (f": {o.detail}" if o.detail else ""))
        orphans = [o for o in outcomes if o.action == "orphan"]
        if orphans:
            engines = sum('"trtet_store.tensorrt.' in o.detail for o in orphans)
            print(f"{len(orphans)} staged file(s) of dead or failed runs kept, {engines} of them "
                  "TensorRT engines or build records: run the same export again to reuse "
                  "them, or remove them with trtet_store.BlobStore(DIR).remove_orphans()")
    from trtet_store.cli.publish import print_interrupted

    print_interrupted(directory=args.dir)  # uploads a crashed publish of DIR's files left open
    stuck = [o for o in outcomes if o.action in ("busy", "damaged", "stuck")]
    return 1 if stuck else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtet-store`` console script.

    Args:
        argv: Arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        The exit code.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "command", None) == "compile-and-save" and \
            not any(e.startswith("-") for e in extra):
        # OUT after an option (`m.py:f --method a=m.py:g OUT`): argparse ends the
        # positionals at the first option; compile_source judges them all.
        args.paths += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verbose:
        logging.basicConfig(
            level=logging.DEBUG if args.verbose > 1 else logging.INFO,
            format="%(levelname)s %(name)s: %(message)s",
        )
    try:
        with _sigterm_as_exit():
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
