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
    add_endpoint_url,
    add_report_flags,
    fail,
    mib,
    one_line,
    size_arg,
)

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
    p.add_argument("--part-size", type=size_arg, default=None, metavar="SIZE",
                   help="bytes per part, 5M to 5G (default 8M, grown to fit 10,000 parts)")
    p.add_argument("--concurrency", type=int, default=None, help="parts in flight (default 8)")
    add_endpoint_url(p)
    p.add_argument("--journal-dir", type=Path, default=None,
                   help="where resume journals live (default $XDG_STATE_HOME/trtet_store/"
                        "publish)")
    p.add_argument("--no-index", action="store_true",
                   help="neither use nor update the bucket's engine-digest index")
    add_report_flags(p)
    p.set_defaults(func=cmd_publish)


def _fail(text: str) -> int:
    return fail("publish", text)


def _postfix(p: Any) -> str:
    """What a :class:`~trtet_store.remote.upload.send.PublishProgress` update adds to the bar."""
    return (f"sent {mib(p.sent)}, copied {mib(p.copied)}"
            + (f", resumed {mib(p.resumed)}" if p.resumed else ""))


class _Warnings(logging.Handler):
    """The library's warnings on stderr, one line each, above the bar while it runs.

    The library logs to ``trtet_store`` with a NullHandler (a library never
    prints); without ``-v`` nothing configured logging, and a warning the
    user must act on (another unfinished upload of these keys, billed until
    aborted) would go nowhere.
    """

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__(logging.WARNING)
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"trtet-store publish: warning: {record.getMessage()}"
            if self.bar.bar is not None:
                self.bar.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own contract: never raise from emit
            self.handleError(record)


@contextlib.contextmanager
def warnings_shown(args: argparse.Namespace, bar: ProgressBar) -> Iterator[None]:
    """Print the library's warnings while a command runs, unless ``-v`` logs them already."""
    if getattr(args, "verbose", 0):
        yield
        return
    handler = _Warnings(bar)
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
    try:
        if args.list:
            return _list(files, url, args)
        if args.abort:
            return _abort(files, url, args)
        if not files:
            return _fail("give the files to publish, then s3://BUCKET/KEY")
        if args.resume and remote.pending(url, endpoint_url=args.endpoint_url,
                                          journal_dir=args.journal_dir) is None:
            return _fail(f"--resume: no interrupted publish of {url} to resume")
    except (remote.RemoteError, ValueError) as exc:
        return _fail(one_line(exc))
    import trtet_store

    bar = ProgressBar("publish", _postfix, not args.no_progress and not args.json)
    kwargs: dict[str, Any] = {"endpoint_url": args.endpoint_url, "part_size": args.part_size,
                              "replace": args.replace, "journal_dir": args.journal_dir,
                              "progress": bar, "index": not args.no_index}
    if args.concurrency is not None:
        kwargs["concurrency"] = args.concurrency
    try:
        with bar, warnings_shown(args, bar):
            report = trtet_store.publish(files, url, **kwargs)
    except remote.UploadKeptError as exc:
        return _fail(f"{one_line(exc)}\n  resume: trtet-store publish --resume "
                     f"{' '.join(files)} {url}\n  give up: trtet-store publish --abort {url}")
    except (remote.RemoteError, OSError, ValueError, TypeError) as exc:
        return _fail(one_line(exc))
    _print_report(report, url, args.json)
    return 0


def _print_report(report: Any, url: str, as_json: bool) -> None:
    if as_json:
        print(report.to_json())
        return
    for o in report.objects:
        print(f"s3://{url[5:].partition('/')[0]}/{o.key}: {mib(o.size)}, {o.parts} parts "
              f"({o.parts_sent} sent, {o.parts_copied} copied, {o.parts_resumed} resumed), "
              f"CRC64NVME {o.crc64nvme}")
    print(f"manifest {report.manifest_key}; {mib(report.bytes_sent)} sent, "
          f"{mib(report.bytes_copied)} copied server-side, {mib(report.bytes_resumed)} "
          f"resumed, in {report.seconds:.1f} s")


def _list(files: list[str], url: str, args: argparse.Namespace) -> int:
    """``--list``: the unfinished multipart uploads under ``url``."""
    from trtet_store import remote

    if files:
        return _fail("--list takes only s3://BUCKET[/PREFIX]")
    uploads = remote.list_uploads(url, endpoint_url=args.endpoint_url)
    for u in uploads:
        print(f"{u.initiated}  {u.upload_id}  {u.key}")
    if not uploads:
        print(f"{url}: no unfinished uploads")
    return 0


def _abort(files: list[str], url: str, args: argparse.Namespace) -> int:
    """``--abort``: give up the interrupted publish of ``url``."""
    from trtet_store import remote

    if files:
        return _fail("--abort takes only s3://BUCKET/KEY")
    aborted = remote.abort(url, endpoint_url=args.endpoint_url, journal_dir=args.journal_dir)
    for u in aborted:
        print(f"aborted {u.upload_id} of s3://{url[5:].partition('/')[0]}/{u.key}")
    if not aborted:
        print(f"{url}: nothing to abort")
    return 0


# --- compile-and-save --publish ----------------------------------------------------------


def add_compile_publish_arguments(parser: argparse.ArgumentParser) -> None:
    """``--publish``, ``--replace`` and ``--endpoint-url`` of ``trtet-store compile-and-save``."""
    parser.add_argument(
        "--publish", default=None, metavar="s3://BUCKET/KEY.pte",
        help="publish the program there (as `trtet-store publish` does). Without OUT, "
             "nothing local is written: the program is exported, its engines staged in a "
             "temporary store under --store (default: the current directory), and published "
             "straight from its pieces; with OUT, the files written are published")
    parser.add_argument("--replace", action="store_true",
                        help="with --publish: replace an existing program there")
    add_endpoint_url(parser)


#: compile-and-save's options that write local files, which --publish without OUT cannot.
_LOCAL_ONLY = {"etrecord": "--etrecord", "versioned": "--versioned",
               "keep_versions": "--keep-versions", "timeout": "--timeout"}


#: Where ``compile-and-save --publish`` without OUT stages its engines, under ``--store``.
PUBLISH_STAGING = ".trtet-publish-staging"


def compile_and_publish(args: argparse.Namespace, source: Any, inputs: tuple | None,
                        backend_config: Any) -> int:
    """``compile-and-save --publish URL`` without OUT: export, ``to_executorch``, publish.

    The program manager goes to :func:`trtet_store.publish` as it is (the
    objects are streamed from its pieces, the bytes ``save_program`` would
    write); no ``.pte`` or ``.ptd`` file is written locally. The engines are
    staged in ``.trtet-publish-staging`` under ``--store``: released once
    published, kept there when the publish fails (a dropped link must not
    cost the build), and reused by the next run of the same build.
    """
    import contextlib

    import trtet_store

    # The same to_executorch config compile_and_save uses (page-aligned segments for
    # TensorRT unless set), so the object equals what compile-and-save OUT writes.
    from trtet_store.export.compile import executorch_config

    given = [flag for attr, flag in _LOCAL_ONLY.items() if getattr(args, attr, None)]
    if given:
        return fail("compile-and-save", f"{', '.join(given)} need OUT (they write local "
                    "files); --publish without OUT writes none")
    export_kwargs: dict[str, Any] = {"backend": args.backend}
    if args.external_engine_data is not None:
        export_kwargs["external_engine_data"] = args.external_engine_data
    if args.external_weights is not None:
        export_kwargs["external_weights"] = args.external_weights
    staging = Path(args.store) if args.store is not None else Path.cwd()
    bar = ProgressBar("publish", _postfix, not args.no_progress and not args.json)
    try:
        config = executorch_config(backend_config, args.backend, args.segment_alignment)
        directory = staging / PUBLISH_STAGING
        directory.mkdir(parents=True, exist_ok=True)
        with trtet_store.BlobStore(directory) as store:
            edge = trtet_store.export_program(source, inputs=inputs, store=store,
                                              **export_kwargs)
            program = edge.to_executorch(config)
            try:
                with bar:
                    report = trtet_store.publish(program, args.publish,
                                                 endpoint_url=args.endpoint_url,
                                                 replace=args.replace, progress=bar)
            except BaseException:
                # The engines (and their build records) stay as orphans of the
                # directory: the next run of the same build takes them instead
                # of building again.
                for blob in store.blobs():
                    blob.keep()
                raise
        with contextlib.suppress(OSError):
            directory.rmdir()  # empty once every engine is released
    except Exception as exc:  # noqa: BLE001 - every failure is one line, as compile-and-save's
        kept = staging / PUBLISH_STAGING
        hint = (f" (the built engines are kept in {kept}; run the same command again to "
                "reuse them)") if kept.is_dir() and any(kept.iterdir()) else ""
        return fail("compile-and-save", one_line(exc) + hint)
    _print_report(report, args.publish, args.json)
    return 0


def publish_written(args: argparse.Namespace, files: list[Path]) -> int:
    """``compile-and-save OUT --publish URL``: publish the files compile_and_save wrote."""
    import trtet_store

    bar = ProgressBar("publish", _postfix, not args.no_progress and not args.json)
    try:
        with bar:
            report = trtet_store.publish(files, args.publish, endpoint_url=args.endpoint_url,
                                         replace=args.replace, progress=bar)
    except Exception as exc:  # noqa: BLE001 - every failure is one line
        return fail("compile-and-save", f"{one_line(exc)} (the files are written: publish "
                    f"them with `trtet-store publish {' '.join(map(str, files))} "
                    f"{args.publish}`)")
    _print_report(report, args.publish, args.json)
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
