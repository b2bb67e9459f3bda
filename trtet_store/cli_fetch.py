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
    f.add_argument("--endpoint-url", default=None,
                   help="the S3 endpoint (default: what boto3 finds, e.g. AWS_ENDPOINT_URL)")
    f.add_argument("--concurrency", type=int, default=None, help="ranged GETs in flight")
    f.add_argument("--range-size", type=_size, default=None, metavar="SIZE",
                   help="bytes per GET (e.g. 16M)")
    f.add_argument("--if-replaced", choices=("restart", "error"), default="restart",
                   help="when the program is replaced mid-fetch: start again (default) or fail")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.set_defaults(func=cmd_fetch)


def _size(text: str) -> int:
    from trtet_store.bench.config import size_arg

    return size_arg(text)


class _Bar:
    """A tqdm bar over :class:`~trtet_store.remote.fetch.FetchProgress` updates."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def __call__(self, p: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=p.total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc="fetch", file=sys.stderr)
        self.bar.n = p.done
        self.bar.set_postfix_str(f"downloaded {_mib(p.downloaded)}, reused {_mib(p.reused)}"
                                 + (f", resumed {_mib(p.resumed)}" if p.resumed else ""),
                                 refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def cmd_fetch(args: argparse.Namespace) -> int:
    """Run ``trtet-store fetch``; returns the exit code (0 done, 1 failed, 130 interrupted)."""
    from trtet_store import InsufficientSpaceError
    from trtet_store.remote import AccessDeniedError, BucketNotFoundError, RemoteError
    from trtet_store.remote.fetch import fetch
    from trtet_store.remote.fetch_errors import (
        FetchInterruptedError,
        FetchVerificationError,
        ObjectChangedError,
        ObjectNotFoundError,
    )

    resume = (f"trtet-store fetch {args.url} {args.out}"
              + "".join(f" --reuse {r}" for r in args.reuse)
              + (f" --endpoint-url {args.endpoint_url}" if args.endpoint_url else ""))
    kwargs: dict[str, Any] = {"reuse": args.reuse, "endpoint_url": args.endpoint_url,
                              "if_replaced": args.if_replaced}
    if args.concurrency is not None:
        kwargs["concurrency"] = args.concurrency
    if args.range_size is not None:
        kwargs["range_size"] = args.range_size
    bar = _Bar(enabled=not args.no_progress and not args.json)
    kwargs["progress"] = bar
    prefix = "trtet-store fetch"
    try:
        report = fetch(args.url, args.out, **kwargs)
    except KeyboardInterrupt:
        bar.close()
        print(f"{prefix}: interrupted; what was downloaded is kept: run `{resume}` to "
              "continue", file=sys.stderr)
        return 130
    except (ObjectNotFoundError, BucketNotFoundError) as exc:
        bar.close()
        print(f"{prefix}: not found: {exc}", file=sys.stderr)
        return 1
    except AccessDeniedError as exc:
        bar.close()
        print(f"{prefix}: access denied: {exc}", file=sys.stderr)
        return 1
    except InsufficientSpaceError as exc:
        bar.close()
        print(f"{prefix}: disk too small: {exc.strerror}", file=sys.stderr)
        return 1
    except FetchInterruptedError as exc:
        bar.close()
        print(f"{prefix}: interrupted: {exc}", file=sys.stderr)
        return 1
    except (ObjectChangedError, FetchVerificationError, RemoteError, OSError) as exc:
        bar.close()
        print(f"{prefix}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if isinstance(exc, FetchVerificationError):
            print(f"{prefix}: {args.out} and its .ptd files are unchanged", file=sys.stderr)
        return 1
    bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    how = ", ".join(f"{_mib(n)} by {k}" for k, n in sorted(report.reused_by.items()))
    state = "already up to date" if report.up_to_date else "fetched"
    print(f"{args.url} -> {args.out}: {state}, {len(report.objects)} object(s), "
          f"{_mib(report.size)}: downloaded {_mib(report.bytes_downloaded)}, reused "
          f"{_mib(report.bytes_reused)}" + (f" ({how})" if how else "")
          + (f", resumed {_mib(report.bytes_resumed)}" if report.bytes_resumed else "")
          + f", {report.seconds:.1f} s")
    for o in report.objects:
        print(f"  {o.path}: {o.size} bytes, {o.checksum or 'no checksum'}")
    if not report.verified:
        print(f"{prefix}: warning: {report.unverified_reason}", file=sys.stderr)
    return 0
