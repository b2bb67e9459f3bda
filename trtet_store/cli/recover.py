"""``trtet-store recover DIR``: finish or undo the writes a crash interrupted in DIR.

Over :func:`trtet_store.recover`; it also names the fetches into DIR that a
failure left staged in ``DIR/.trtet-staging`` (with the commands that resume
or discard them; ``--discard-fetches`` discards them), the downloads a killed
``fetch-set`` left in the set store beside DIR (``DIR/../.trtet-blobs``, its
default store, shared by the sets fetched into DIR's siblings: each blob and
its size; ``--discard-fetches`` discards them too; a store that is not ours,
checked as ``fetch-set`` checks it, is not looked into), and the publishes of
DIR's files a crash left open (their journals; no request is made), so
neither a staged download nor an abandoned upload is left silently.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from trtet_store.cli._common import add_option, fail, report_error
from trtet_store.cli._shown import shown

__all__ = ["add_parser", "cmd_recover"]


def add_parser(sub: Any) -> None:
    """Register ``recover`` on the ``trtet-store`` subparsers."""
    r = sub.add_parser(
        "recover",
        help="finish or undo writes a crash interrupted",
        description="Roll forward or back every interrupted write whose journal "
        "is in DIR (the output directory).",
    )
    r.add_argument("dir", type=Path, metavar="DIR")
    add_option(r, "--json")
    r.add_argument(
        "--abandon",
        action="store_true",
        help="give up writes that can be neither finished nor rolled back (a file they need "
        "is gone): delete their journals and the temp files they kept, saying what is given up",
    )
    r.add_argument(
        "--discard-fetches",
        action="store_true",
        help="remove the staged files and journals of the interrupted fetches into DIR, "
        "and of the set store's interrupted downloads beside DIR (never of one that is "
        "running)",
    )
    r.add_argument(
        "--discard-parts",
        action="store_true",
        help="remove the half-written files (.part) that killed runs left in "
        "DIR/.trtet-staging (never a running one's)",
    )
    r.set_defaults(func=cmd_recover)


def cmd_recover(args: argparse.Namespace) -> int:
    """``trtet-store recover``: roll interrupted writes in DIR forward or back."""
    import trtet_store

    if not args.dir.is_dir():
        return fail("recover", f"{args.dir} is not a directory")
    try:
        outcomes = trtet_store.recover(args.dir, abandon=args.abandon)
    except Exception as exc:
        return report_error(exc, "recover", plain=True)
    if args.json:
        print(json.dumps([o.to_json() for o in outcomes], indent=1))
    elif outcomes:
        for o in outcomes:
            outs = ", ".join(os.fspath(x) for x in o.outputs) or "-"
            print(f"{o.journal}: {o.action} ({outs})" + (f": {o.detail}" if o.detail else ""))
        orphans = [o for o in outcomes if o.action == "orphan"]
        fetched = [o for o in orphans if '"trtet_fetch"' in o.detail]
        orphans = [o for o in orphans if o not in fetched]
        if fetched:  # a killed fetch's runs: its line below says how to resume or discard it
            print(f"{len(fetched)} staged file(s) of interrupted fetches kept: see the "
                  "interrupted fetches below")
        if orphans:
            engines = sum('"trtet_store.tensorrt.' in o.detail for o in orphans)
            print(f"{len(orphans)} staged file(s) of dead or failed runs kept, {engines} of them "
                  "TensorRT engines or build records: run the same export again to reuse "
                  "them, or remove them with trtet_store.BlobStore(DIR).remove_orphans()")
    fetches_ok, fetches = _fetches(args)
    from trtet_store.cli.publish import print_interrupted

    # Uploads a crashed publish of DIR's files left open.
    publishes = print_interrupted(directory=args.dir)
    parts = _parts(args)
    if not args.json and not outcomes and not fetches and not publishes and not parts \
            and fetches_ok:
        print(f"{shown(args.dir)}: nothing to recover")
    stuck = [o for o in outcomes if o.action in ("busy", "damaged", "stuck")]
    return 1 if stuck or not fetches_ok else 0


def _parts(args: argparse.Namespace) -> int:
    """Name (or, with ``--discard-parts``, remove) the half-written files (``.part``) that
    killed runs left in ``DIR/.trtet-staging`` (a killed build's engine, say); how many."""
    from trtet_store.io import format_mib
    from trtet_store.io.orphans import collect_stale, stale_parts

    staging = args.dir / ".trtet-staging"
    parts = stale_parts(staging)
    if not parts:
        return 0
    out = sys.stderr if args.json else sys.stdout
    total = format_mib(sum(size for _, size in parts))
    if args.discard_parts:
        removed = {p for p in collect_stale(staging) if any(p == q for q, _ in parts)}
        total = format_mib(sum(size for p, size in parts if p in removed))
        print(f"{len(removed)} half-written file(s) of killed runs removed ({total}) from "
              f"{shown(staging)}", file=out)
        return len(parts)
    for path, size in parts:
        print(f"{shown(path)}: {format_mib(size)} half-written by a killed run (a .part: "
              "never used)", file=out)
    flag = shlex.join(["trtet-store", "recover", os.fspath(args.dir), "--discard-parts"])
    print(f"{len(parts)} half-written file(s) of killed runs, {total}: remove them with "
          f"{shown(flag)}", file=out)
    return len(parts)


def _fetches(args: argparse.Namespace) -> tuple[bool, int]:
    """Name (or, with ``--discard-fetches``, discard) DIR's interrupted fetches.

    Returns ``(ok, how many were named)``; not ok when the staging directory
    is refused or a running fetch was not discarded.
    """
    from trtet_store.remote.download.interrupted import StagingLinkError, interrupted_fetches
    from trtet_store.remote.download.receive import resume_command

    try:
        found = interrupted_fetches(args.dir)
    except StagingLinkError as exc:
        return not fail("recover", f"{exc.strerror}"), 0
    out = sys.stderr if args.json else sys.stdout  # --json's stdout is the JSON alone
    discard = shown(shlex.join(["trtet-store", "recover", os.fspath(args.dir),
                                "--discard-fetches"]))
    store_ok, in_store = _store_fetches(args, out, discard)
    ok = _each_fetch(args, out, args.dir, found, lambda f: {
        "what": f"{shown(f.url)} -> {shown(f.dest)}", "discard": discard,
        "resume": shown(resume_command(f.url, f.dest)) if f.url and f.dest else
        "(its journal is damaged: fetch it again)"}, {
        "discarded": "discarded fetch {what} ({staged}: {removed} staged file(s) and its "
                     "journal removed)",
        "running": "fetch {what} is running ({staged}): not discarded; wait for it to finish",
        "interrupted": "interrupted fetch {what} ({staged}, since {since}): resume: {resume}; "
                       "discard: {discard}"})
    return store_ok and ok, len(found) + in_store


def _store_fetches(args: argparse.Namespace, out: Any, discard: str) -> tuple[bool, int]:
    """Name (or discard) the downloads a killed ``fetch-set`` left in the set store beside DIR.

    ``fetch-set`` downloads each blob into its content store (default
    ``DIR/../.trtet-blobs``) with ``fetch``, staged in the store's own
    ``.trtet-staging``: that is where a killed one leaves its partial download.
    The store is looked into only when it is ours (checked as ``fetch-set``
    checks it: not a link, our own, not writable by group or others), and so
    is its staging directory; otherwise one line says it was left alone.
    """
    from trtet_store.io import STAGING_DIR, UnsafeDirectoryError, check_staging_directory
    from trtet_store.remote.download.interrupted import StagingLinkError, interrupted_fetches
    from trtet_store.sets.store import STORE_DIR

    store = args.dir.absolute().parent / STORE_DIR
    if not os.path.lexists(store / STAGING_DIR):
        return True, 0
    try:
        check_staging_directory(store, todo="not looked into")
        check_staging_directory(store / STAGING_DIR, todo="not looked into")
        found = interrupted_fetches(store)
    except (UnsafeDirectoryError, StagingLinkError) as exc:
        print(f"trtet-store recover: the set store beside {shown(args.dir)}: {exc.strerror}",
              file=out)
        return True, 0
    ok = _each_fetch(args, out, store, found, lambda f: {
        "what": f"blob {shown(Path(f.dest).name or f.id)} from {shown(f.url)}",
        "store": shown(store), "staging": shown(store / STAGING_DIR), "discard": discard}, {
        "discarded": "discarded the set store's download of {what} ({staged}: {removed} "
                     "staged file(s) and its journal removed from {staging})",
        "running": "the set store's download of {what} is running ({staged}): not "
                   "discarded; wait for it to finish",
        "interrupted": "interrupted download of a killed fetch-set in the set store {store}: "
                       "{what} ({staged}, since {since}): resume: run the same `trtet-store "
                       "fetch-set` again (it downloads only what is missing); discard: "
                       "{discard}"})
    return ok, len(found)


def _each_fetch(args: argparse.Namespace, out: Any, root: Path, found: list[Any],
                names: Any, lines: dict[str, str]) -> bool:
    """Discard (``--discard-fetches``) or name each interrupted fetch staged under ``root``,
    in the caller's ``lines`` (``names(f)`` fills them); not ok when one could not be."""
    from trtet_store.io import ConcurrentWriteError, UnsafeDirectoryError, format_mib
    from trtet_store.remote.download.interrupted import discard_fetch

    ok = True
    for f in found:
        fields = dict(names(f), staged=f"{format_mib(f.staged)[:-4]} of "
                      f"{format_mib(f.total)} staged",
                      since=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.since)))
        if args.discard_fetches and not f.running:
            try:
                fields["removed"] = discard_fetch(root, f)
            except (ConcurrentWriteError, UnsafeDirectoryError) as exc:
                ok = not fail("recover", str(exc))
                continue
            print(lines["discarded"].format(**fields), file=out)
        elif f.running:
            print(lines["running"].format(**fields),
                  file=sys.stderr if args.discard_fetches else out)
            ok = ok and not args.discard_fetches
        else:
            print(lines["interrupted"].format(**fields), file=out)
    return ok
