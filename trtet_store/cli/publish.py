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
import contextlib
import logging
import sys
from collections.abc import Iterator
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

__all__ = ["add_parser", "cmd_publish", "print_interrupted", "print_report", "progress_bar"]


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
    add_option(p, "--replace", "replace an existing program (only the version found now)")
    add_option(p, "--dry-run", "with --replace: send and delete nothing; print the replaced "
               "version's objects the publish would remove, and those it keeps and why")
    p.add_argument("--resume", action="store_true",
                   help="resume an interrupted publish of this destination; fail if there "
                        "is none (without it, one is resumed when found)")
    p.add_argument("--abort", action="store_true",
                   help="give up the interrupted publish of s3://BUCKET/KEY: abort its "
                        "uploads and any other unfinished upload of its objects")
    p.add_argument("--list", action="store_true",
                   help="list the unfinished multipart uploads under s3://BUCKET[/PREFIX]")
    p.add_argument("--part-size", type=size_arg, default=None, metavar="SIZE",
                   help="bytes per part, 5M to 5G (default 8M, grown to fit 10,000 parts)")
    p.add_argument("--concurrency", type=int, default=None, help="parts in flight (default 8)")
    add_option(p, "--journal-dir", "where resume journals live (default $XDG_STATE_HOME/"
               "trtet_store/publish)")
    p.add_argument("--no-index", action="store_true",
                   help="neither use nor update the bucket's engine-digest index")
    add_option(p, "--signing-key", "sign the manifest with this ed25519 key (objects named "
               "by sha256 too; default TRTET_SIGNING_KEY, else the config file's)")
    add_s3_options(p)  # --endpoint-url, --json, --no-progress
    p.set_defaults(func=cmd_publish)


def _postfix(p: Any) -> str:
    """What a :class:`~trtet_store.remote.report.PublishProgress` update adds to the bar."""
    return (f"sent {mib(p.sent)}, copied {mib(p.copied)}"
            + (f", resumed {mib(p.resumed)}" if p.resumed else ""))


def progress_bar(args: argparse.Namespace) -> ProgressBar:
    """The bar of a publish (``publish``, ``compile-and-save --publish``): off with --json."""
    return ProgressBar("publish", _postfix, not args.no_progress and not args.json)


class _Warnings(logging.Handler):
    """The library's warnings on stderr, one line each, above the bar while it runs.

    The library logs to ``trtet_store`` with a NullHandler (a library never
    prints); without ``-v`` nothing configured logging, and a warning the
    user must act on (another unfinished upload of these keys, billed until
    aborted) would go nowhere.
    """

    def __init__(self, bar: ProgressBar, command: str = "publish") -> None:
        super().__init__(logging.WARNING)
        self.bar = bar
        self.command = command

    def emit(self, record: logging.LogRecord) -> None:
        from trtet_store.cache.tier.health import SAID_AS_WARNING

        if getattr(record, SAID_AS_WARNING, False):
            return  # a SharedCacheWarning too: main() shows that one
        try:
            line = f"trtet-store {self.command}: warning: {record.getMessage()}"
            if self.bar.bar is not None:
                self.bar.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own contract: never raise from emit
            self.handleError(record)


@contextlib.contextmanager
def warnings_shown(args: argparse.Namespace, bar: ProgressBar,
                   command: str = "publish") -> Iterator[None]:
    """Print the library's warnings while a command runs, unless ``-v`` logs them already."""
    if getattr(args, "verbose", 0):
        yield
        return
    handler = _Warnings(bar, command)
    logger = logging.getLogger("trtet_store")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def cmd_publish(args: argparse.Namespace) -> int:
    """``trtet-store publish``: publish, resume, abort or list."""
    from trtet_store import remote

    *files, url = args.paths
    if args.dry_run and (args.list or args.abort or args.resume):
        # Before any request: --abort would otherwise abort for real.
        return fail("publish", "--dry-run plans what --replace would remove; it does not "
                    "go with --list, --abort or --resume", 2)
    try:
        if args.list:
            return _list(files, url, args)
        if args.abort:
            return _abort(files, url, args)
        if not files:
            return fail("publish", "give the files to publish, then s3://BUCKET/KEY")
        if args.dry_run:
            return _dry_run(files, url, args)
        if args.resume and remote.pending(url, endpoint_url=args.endpoint_url,
                                          journal_dir=args.journal_dir) is None:
            return fail("publish", f"--resume: no interrupted publish of {url} to resume")
    except (remote.RemoteError, ValueError) as exc:
        return report_error(exc, "publish", plain=True)
    import trtet_store

    bar = progress_bar(args)
    kwargs: dict[str, Any] = {"endpoint_url": args.endpoint_url, "part_size": args.part_size,
                              "replace": args.replace, "journal_dir": args.journal_dir,
                              "progress": bar, "index": not args.no_index,
                              "signing_key": args.signing_key}
    if args.concurrency is not None:
        kwargs["concurrency"] = args.concurrency
    try:
        with bar, warnings_shown(args, bar):
            report = trtet_store.publish(files, url, **kwargs)
    except (remote.RemoteError, OSError, ValueError, TypeError) as exc:
        again = f"trtet-store publish --resume {' '.join(files)} {url}"
        return report_error(exc, "publish", plain=True,
                            resume=f"{again}\n  give up: trtet-store publish --abort {url}")
    print_report(report, url, args.json)
    return 0


def print_report(report: Any, url: str, as_json: bool) -> None:
    """Print a :class:`~trtet_store.remote.PublishReport` of ``url``: a line per object, or JSON."""
    if as_json:
        print(report.to_json())
        return
    bucket = url[5:].partition("/")[0]
    for o in report.objects:
        print(f"{shown(f's3://{bucket}/{o.key}')}: {mib(o.size)}, {o.parts} parts "
              f"({o.parts_sent} sent, {o.parts_copied} copied, {o.parts_resumed} resumed), "
              f"CRC64NVME {o.crc64nvme}")
    print(f"manifest {report.manifest_key}; {mib(report.bytes_sent)} sent, "
          f"{mib(report.bytes_copied)} copied server-side, {mib(report.bytes_resumed)} "
          f"resumed, in {report.seconds:.1f} s")


def _dry_run(files: list[str], url: str, args: argparse.Namespace) -> int:
    """``--replace --dry-run``: the replaced version's objects the publish would remove."""
    import json

    from trtet_store.remote.upload.owners import replace_dry_run

    if not args.replace:
        return fail("publish", "--dry-run plans what --replace would remove: give --replace", 2)
    plan, keys = replace_dry_run([Path(f).name for f in files], url,
                                 endpoint_url=args.endpoint_url)
    bucket = url[5:].partition("/")[0]
    if plan is None:
        return fail("publish", f"{url}: the other programs' manifests beside it could not be "
                    "listed: a publish would remove nothing")
    if args.json:
        print(json.dumps({"dry_run": True, "removed": [i.key for i in plan.doomed],
                          "kept": plan.kept, "keys": keys}, indent=1))
        return 0
    print(f"{url}: dry run, nothing sent or deleted: would remove {len(plan.doomed)} "
          "object(s) of the replaced version that the new one does not name")
    for i in plan.doomed:
        print(f"  {shown(f's3://{bucket}/{i.key}')}: would be removed")
    for key, why in sorted(plan.kept.items()):
        print(f"  kept {shown(f's3://{bucket}/{key}')}: {why}")
    return 0


def _list(files: list[str], url: str, args: argparse.Namespace) -> int:
    """``--list``: the unfinished multipart uploads under ``url``."""
    from trtet_store import remote

    if files:
        return fail("publish", "--list takes only s3://BUCKET[/PREFIX]")
    uploads = remote.list_uploads(url, endpoint_url=args.endpoint_url)
    for u in uploads:
        print(f"{u.initiated}  {shown(u.upload_id)}  {shown(u.key)}")  # the bucket's names
    if not uploads:
        print(f"{url}: no unfinished uploads")
    return 0


def _abort(files: list[str], url: str, args: argparse.Namespace) -> int:
    """``--abort``: give up the interrupted publish of ``url``."""
    from trtet_store import remote

    if files:
        return fail("publish", "--abort takes only s3://BUCKET/KEY")
    aborted = remote.abort(url, endpoint_url=args.endpoint_url, journal_dir=args.journal_dir)
    bucket = url[5:].partition("/")[0]
    for u in aborted:
        print(f"aborted {shown(u.upload_id)} of {shown(f's3://{bucket}/{u.key}')}")
    if not aborted:
        print(f"{url}: nothing to abort")
    return 0


def print_interrupted(out: Any = None, directory: Path | None = None) -> int:
    """Say which publishes were interrupted (their journals; no request is made).

    ``trtet-store recover DIR`` calls it with ``directory=DIR``, so an
    abandoned upload of DIR's files is never left billing silently; the
    publishes of other folders' files are not DIR's business and are left
    out. Returns how many were printed.
    """
    from trtet_store.remote import interrupted

    out = out if out is not None else sys.stderr
    found = interrupted(directory=directory)
    for i in found:
        print(f"interrupted publish {i.url} ({i.endpoint}, {len(i.uploads)} upload(s) open, "
              f"journal {i.journal}): resume it with `trtet-store publish --resume FILE... "
              f"{i.url}`, or give it up with `trtet-store publish --abort {i.url}"
              f"{' --endpoint-url ' + i.endpoint if i.endpoint else ''}`", file=out)
    return len(found)
