"""``trtet-store publish FILE... s3://BUCKET/KEY``: the command over :func:`trtet_store.publish`.

The first FILE is the program (published at KEY); the others (its ``.ptd``
files) go beside it under their own names; a manifest
(``KEY.trtet.json``) is written last. A tqdm bar shows the bytes accounted
for, with how many were sent and how many copied server-side. An
interrupted publish is resumed by running the same command again
(``--resume`` insists that there is one to resume); ``--abort`` gives it up;
``--list`` shows unfinished uploads under a prefix. Credentials and the
endpoint are found the way boto3 finds them (``AWS_*`` variables, profiles).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "cmd_publish"]


def add_parser(sub: Any) -> None:
    """Register ``publish`` on the ``trtet-store`` subparsers."""
    p = sub.add_parser(
        "publish",
        help="publish a program (.pte and .ptd files) to S3-compatible storage",
        description="Upload FILE... to s3://BUCKET/KEY (the first file at KEY, the others "
        "beside it) in parallel multipart uploads with per-part and full-object CRC64NVME "
        "checksums, conditional on the key being new (or, with --replace, on the version "
        "found), then a manifest KEY.trtet.json. An interrupted publish resumes where it "
        "stopped; a re-publish copies unchanged bytes server-side.",
    )
    p.add_argument("paths", nargs="+", metavar="FILE... s3://BUCKET/KEY",
                   help="the files, then the destination (with --abort or --list: only the "
                        "destination)")
    p.add_argument("--replace", action="store_true",
                   help="replace an existing program (only the version found now)")
    p.add_argument("--resume", action="store_true",
                   help="resume an interrupted publish of this destination; fail if there "
                        "is none (without it, one is resumed when found)")
    p.add_argument("--abort", action="store_true",
                   help="give up the interrupted publish of s3://BUCKET/KEY: abort its "
                        "uploads and any other unfinished upload of its objects")
    p.add_argument("--list", action="store_true",
                   help="list the unfinished multipart uploads under s3://BUCKET[/PREFIX]")
    p.add_argument("--part-size", type=_size, default=None, metavar="SIZE",
                   help="bytes per part, 5M to 5G (default 8M, grown to fit 10,000 parts)")
    p.add_argument("--concurrency", type=int, default=None, help="parts in flight (default 8)")
    p.add_argument("--endpoint-url", default=None,
                   help="the S3 endpoint (default: what boto3 finds, e.g. AWS_ENDPOINT_URL)")
    p.add_argument("--journal-dir", type=Path, default=None,
                   help="where resume journals live (default $XDG_STATE_HOME/trtet_store/"
                        "publish)")
    p.add_argument("--no-index", action="store_true",
                   help="neither use nor update the bucket's engine-digest index")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_publish)


def _size(text: str) -> int:
    from trtet_store.bench.config import size_arg

    return size_arg(text)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class _Bar:
    """A tqdm bar over :class:`~trtet_store.remote.publish.PublishProgress` updates."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def __call__(self, p: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=p.total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc="publish", file=sys.stderr, dynamic_ncols=True)
        self.bar.n = p.done
        self.bar.set_postfix_str(f"sent {_mib(p.sent)}, copied {_mib(p.copied)}"
                                 + (f", resumed {_mib(p.resumed)}" if p.resumed else ""),
                                 refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _fail(text: str) -> int:
    print(f"trtet-store publish: {text}", file=sys.stderr)
    return 1


def cmd_publish(args: argparse.Namespace) -> int:
    """``trtet-store publish``: publish, resume, abort or list."""
    from trtet_store import remote

    *files, url = args.paths
    if args.list:
        if files:
            return _fail("--list takes only s3://BUCKET[/PREFIX]")
        try:
            uploads = remote.list_uploads(url, endpoint_url=args.endpoint_url)
        except (remote.RemoteError, ValueError) as exc:
            return _fail(f"{type(exc).__name__}: {exc}")
        for u in uploads:
            print(f"{u.initiated}  {u.upload_id}  {u.key}")
        if not uploads:
            print(f"{url}: no unfinished uploads")
        return 0
    if args.abort:
        if files:
            return _fail("--abort takes only s3://BUCKET/KEY")
        try:
            aborted = remote.abort(url, endpoint_url=args.endpoint_url,
                                   journal_dir=args.journal_dir)
        except (remote.RemoteError, ValueError) as exc:
            return _fail(f"{type(exc).__name__}: {exc}")
        for u in aborted:
            print(f"aborted {u.upload_id} of s3://{url[5:].partition('/')[0]}/{u.key}")
        if not aborted:
            print(f"{url}: nothing to abort")
        return 0
    if not files:
        return _fail("give the files to publish, then s3://BUCKET/KEY")
    if args.resume:
        try:
            journal = remote.pending(url, endpoint_url=args.endpoint_url,
                                     journal_dir=args.journal_dir)
        except (remote.RemoteError, ValueError) as exc:
            return _fail(f"{type(exc).__name__}: {exc}")
        if journal is None:
            return _fail(f"--resume: no interrupted publish of {url} to resume")
    import trtet_store

    bar = _Bar(not args.no_progress and not args.json)
    kwargs: dict[str, Any] = {"endpoint_url": args.endpoint_url, "part_size": args.part_size,
                              "replace": args.replace, "journal_dir": args.journal_dir,
                              "progress": bar, "index": not args.no_index}
    if args.concurrency is not None:
        kwargs["concurrency"] = args.concurrency
    try:
        report = trtet_store.publish(files, url, **kwargs)
    except remote.UploadKeptError as exc:
        bar.close()
        return _fail(f"{type(exc).__name__}: {exc}\n  resume: trtet-store publish --resume "
                     f"{' '.join(files)} {url}\n  give up: trtet-store publish --abort {url}")
    except (remote.RemoteError, OSError, ValueError, TypeError) as exc:
        bar.close()
        return _fail(f"{type(exc).__name__}: {exc}")
    bar.close()
    if args.json:
        print(report.to_json())
    else:
        for o in report.objects:
            print(f"s3://{url[5:].partition('/')[0]}/{o.key}: {_mib(o.size)}, {o.parts} parts "
                  f"({o.parts_sent} sent, {o.parts_copied} copied, {o.parts_resumed} resumed), "
                  f"CRC64NVME {o.crc64nvme}")
        print(f"manifest {report.manifest_key}; {_mib(report.bytes_sent)} sent, "
              f"{_mib(report.bytes_copied)} copied server-side, {_mib(report.bytes_resumed)} "
              f"resumed, in {report.seconds:.1f} s")
    return 0


def print_interrupted(out: Any = None) -> int:
    """Say which publishes were interrupted (their journals; no request is made).

    ``trtet-store recover`` calls it, so an abandoned upload is never left
    billing silently. Returns how many there are.
    """
    from trtet_store.remote import interrupted

    out = out if out is not None else sys.stderr
    found = interrupted()
    for i in found:
        print(f"interrupted publish {i.url} ({i.endpoint}, {len(i.uploads)} upload(s) open, "
              f"journal {i.journal}): resume it with `trtet-store publish --resume FILE... "
              f"{i.url}`, or give it up with `trtet-store publish --abort {i.url}"
              f"{' --endpoint-url ' + i.endpoint if i.endpoint else ''}`", file=out)
    return len(found)
