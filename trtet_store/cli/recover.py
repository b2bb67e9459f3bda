"""``trtet-store recover DIR``: finish or undo the writes a crash interrupted in DIR.

Over :func:`trtet_store.recover`; it also names the publishes of DIR's files
a crash left open (their journals; no request is made), so an abandoned
upload is never left billing silently.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

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
    r.add_argument("--json", action="store_true", help="print JSON instead of text")
    r.add_argument(
        "--abandon",
        action="store_true",
        help="give up writes that can be neither finished nor rolled back (a file they need "
        "is gone): delete their journals and the temp files they kept, saying what is given up",
    )
    r.set_defaults(func=cmd_recover)


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
