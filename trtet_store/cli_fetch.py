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

from trtet_store.cli_s3_common import (
    ProgressBar,
    add_endpoint_url,
    add_report_flags,
    mib,
    one_line,
    size_arg,
)

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
    add_endpoint_url(f)
    f.add_argument("--concurrency", type=int, default=None, help="ranged GETs in flight")
    f.add_argument("--range-size", type=size_arg, default=None, metavar="SIZE",
                   help="bytes per GET (e.g. 16M)")
    f.add_argument("--if-replaced", choices=("restart", "error"), default="restart",
                   help="when the program is replaced mid-fetch: start again (default) or fail")
    add_report_flags(f)
    f.set_defaults(func=cmd_fetch)


def _postfix(p: Any) -> str:
    """What a :class:`~trtet_store.remote.fetch.FetchProgress` update adds to the bar."""
    return (f"downloaded {mib(p.downloaded)}, reused {mib(p.reused)}"
            + (f", resumed {mib(p.resumed)}" if p.resumed else ""))


def _explain(exc: BaseException, args: argparse.Namespace, resume: str) -> list[str]:
    """The lines that say what failed and what to do (printed after ``trtet-store fetch: ``)."""
    from trtet_store import InsufficientSpaceError
    from trtet_store.remote import AccessDeniedError, BucketNotFoundError
    from trtet_store.remote.fetch_errors import (
        FetchInterruptedError,
        FetchVerificationError,
        ObjectNotFoundError,
    )

    if isinstance(exc, KeyboardInterrupt):
        return [f"interrupted; what was downloaded is kept: run `{resume}` to continue"]
    if isinstance(exc, ObjectNotFoundError | BucketNotFoundError):
        return [f"not found: {exc}"]
    if isinstance(exc, AccessDeniedError):
        return [f"access denied: {exc}"]
    if isinstance(exc, InsufficientSpaceError):
        return [f"disk too small: {exc.strerror}"]
    if isinstance(exc, FetchInterruptedError):
        return [f"interrupted: {exc}"]
    if isinstance(exc, FetchVerificationError):
        return [one_line(exc), f"{args.out} and its .ptd files are unchanged"]
    return [one_line(exc)]


def cmd_fetch(args: argparse.Namespace) -> int:
    """Run ``trtet-store fetch``; returns the exit code (0 done, 1 failed, 130 interrupted)."""
    from trtet_store.remote import RemoteError
    from trtet_store.remote.fetch import fetch

    resume = (f"trtet-store fetch {args.url} {args.out}"
              + "".join(f" --reuse {r}" for r in args.reuse)
              + (f" --endpoint-url {args.endpoint_url}" if args.endpoint_url else ""))
    kwargs: dict[str, Any] = {"reuse": args.reuse, "endpoint_url": args.endpoint_url,
                              "if_replaced": args.if_replaced}
    if args.concurrency is not None:
        kwargs["concurrency"] = args.concurrency
    if args.range_size is not None:
        kwargs["range_size"] = args.range_size
    bar = ProgressBar("fetch", _postfix, enabled=not args.no_progress and not args.json)
    kwargs["progress"] = bar
    prefix = "trtet-store fetch"
    try:
        with bar:
            report = fetch(args.url, args.out, **kwargs)
    except (KeyboardInterrupt, RemoteError, OSError) as exc:
        for line in _explain(exc, args, resume):
            print(f"{prefix}: {line}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
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
    for o in report.objects:
        print(f"  {o.path}: {o.size} bytes, {o.checksum or 'no checksum'}")
    if not report.verified:
        print(f"{prefix}: warning: {report.unverified_reason}", file=sys.stderr)
    return 0
