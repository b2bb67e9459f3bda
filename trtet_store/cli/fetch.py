"""``trtet-store fetch s3://... OUT [--reuse OLD.pte]``: the command over :func:`trtet_store.fetch`.

A tqdm bar shows the bytes of the program accounted for, with how many were
downloaded and how many reused from local files. Errors are one line each,
with what to do: not found, access denied, a disk too small (how much is
missing), the program replaced mid-fetch, bytes that failed verification,
and an interruption (network or Ctrl-C), with the command that resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trtet_store.cli._common import (
    ProgressBar,
    add_option,
    add_s3_options,
    fail,
    mib,
    report_error,
    size_arg,
)
from trtet_store.cli._shown import shown

__all__ = ["add_parser", "cmd_fetch"]


def add_parser(sub: Any) -> None:
    """Register ``fetch`` on the ``trtet-store`` subparsers."""
    f = sub.add_parser(
        "fetch",
        help="fetch a published program (or any object) from S3-compatible storage",
        description="Download s3://BUCKET/KEY (with its .ptd files, as named by the manifest "
        "`publish` wrote) to OUT: free space checked first, every byte verified, resumable "
        "after an interruption, published atomically; pieces the old OUT (or --reuse files) "
        "already holds are not downloaded.",
    )
    f.add_argument("url", metavar="s3://BUCKET/KEY")
    f.add_argument("out", type=Path, metavar="OUT", help="the local .pte (or file)")
    f.add_argument("--reuse", type=Path, action="append", default=[], metavar="OLD",
                   help="a local file holding an earlier version (repeatable)")
    # Taken as text and judged in cmd_fetch by the API's own check, so that a bad
    # value is one line naming the flag (argparse would print its usage too).
    f.add_argument("--concurrency", default=None, metavar="N",
                   help="ranged GETs in flight, 1 to 256 (default 4)")
    f.add_argument("--range-size", default=None, metavar="SIZE",
                   help="bytes per GET, 1M to 1G (e.g. 16M; default 32M)")
    f.add_argument("--if-replaced", choices=("restart", "error"), default="restart",
                   help="when the program is replaced mid-fetch: start again (default) or fail")
    add_option(f, "--replace-needed", "replace a .ptd that another .pte of OUT's directory "
               "needs (default: refused; fetch into a directory of its own instead)")
    f.add_argument("--program-only", action="store_true",
                   help="fetch a .pte that has no manifest though it needs .ptd files "
                   "(default: refused, naming them)")
    add_option(f, "--trusted-key", "fetch only a program whose manifest this public key "
               "signed, each byte checked by sha256 (repeatable; default TRTET_TRUSTED_KEYS, "
               "else the config file's)")
    add_s3_options(f)  # --endpoint-url, --json, --no-progress
    f.set_defaults(func=cmd_fetch)


def _postfix(p: Any) -> str:
    """What a :class:`~trtet_store.remote.report.FetchProgress` update adds to the bar."""
    return (f"downloaded {mib(p.downloaded)}, reused {mib(p.reused)}"
            + (f", resumed {mib(p.resumed)}" if p.resumed else ""))


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """``--concurrency`` and ``--range-size`` as API keywords, checked as the API checks them.

    Raises
    ------
    ValueError, TypeError
        A value that is not a number, or one the API refuses; the message
        names the flag.
    """
    from trtet_store.remote.download.receive import check_options

    out: dict[str, Any] = {}
    if args.concurrency is not None:
        try:
            out["concurrency"] = int(args.concurrency)
        except ValueError:
            raise ValueError(f"--concurrency {args.concurrency}: not a whole number "
                             "(ranged GETs in flight, 1 to 256)") from None
    if args.range_size is not None:
        try:
            out["range_size"] = size_arg(args.range_size)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"--range-size {args.range_size}: {exc}") from None
    try:
        check_options(**out)
    except (TypeError, ValueError) as exc:
        flag = "--range-size" if "range_size" in str(exc) else "--concurrency"
        given = args.range_size if flag == "--range-size" else args.concurrency
        raise ValueError(f"{flag} {given}: {exc}") from None
    return out


def cmd_fetch(args: argparse.Namespace) -> int:
    """Run ``trtet-store fetch``; returns the exit code (0 done, 1 failed, 130 interrupted)."""
    from trtet_store.remote import RemoteError
    from trtet_store.remote.download.receive import fetch, resume_command
    from trtet_store.remote.keys import KeyFileError

    try:
        options = _options(args)
    except ValueError as exc:
        return fail("fetch", str(exc), 2)
    flags = {"replace_needed": args.replace_needed, "program_only": args.program_only}
    resume = resume_command(args.url, args.out, reuse=args.reuse,
                            endpoint_url=args.endpoint_url, if_replaced=args.if_replaced,
                            trusted_keys=args.trusted_key or (), **options, **flags)
    kwargs: dict[str, Any] = {"reuse": args.reuse, "endpoint_url": args.endpoint_url,
                              "if_replaced": args.if_replaced,
                              "trusted_keys": args.trusted_key, **options, **flags}
    bar = ProgressBar("fetch", _postfix, enabled=not args.no_progress and not args.json)
    kwargs["progress"] = bar
    try:
        with bar:
            report = fetch(args.url, args.out, **kwargs)
    except (KeyboardInterrupt, KeyFileError, RemoteError, OSError) as exc:
        # The CLI's one error table (cli._common.ERROR_TABLE) says what failed and what to do.
        return report_error(exc, "fetch", out=args.out, resume=resume)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    how = ", ".join(f"{mib(n)} by {k}" for k, n in sorted(report.reused_by.items()))
    state = "already up to date" if report.up_to_date else "fetched"
    print(f"{args.url} -> {args.out}: {state}, {len(report.objects)} object(s), "
          f"{mib(report.size)}: downloaded {mib(report.bytes_downloaded)}, reused "
          f"{mib(report.bytes_reused)}" + (f" ({how})" if how else "")
          + (f", resumed {mib(report.bytes_resumed)}" if report.bytes_resumed else "")
          + f", {report.seconds:.1f} s")
    # Names from a manifest or the directory, quoted where one could split a line.
    for o in report.objects:
        print(f"  {shown(o.path)}: {o.size} bytes, {o.checksum or 'no checksum'}")
    for path in report.removed:
        print(f"  {shown(path)}: removed (the previous version's; no longer in the manifest)")
    if not report.verified:
        print(f"trtet-store fetch: warning: {report.unverified_reason}", file=sys.stderr)
    return 0
