"""``trtet-store inspect FILE`` and ``trtet-store verify FILE``: the commands over the inspector.

``inspect`` prints the layout of a ``.pte`` or ``.ptd`` (no payload bytes
read); ``verify`` checks it structurally (with ``--data`` the ``.ptd`` and the
keys the program needs from it, with ``--run`` a runtime load, with
``--engine-digest`` each TensorRT engine's digest; for a set member that
``fetch_set`` placed, the files beside it against the digests it was released
with). Exit 1 on any error found.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trtet_store.cli._common import add_option, fail

__all__ = ["add_parser", "cmd_inspect", "cmd_verify"]


def _engine_digest_arg(text: str) -> str:
    """``--engine-digest``: 32 hex digits (or ``<digest>_trt_engine``), refused otherwise."""
    from trtet_store.inspector.verify import parse_engine_digest

    try:
        return parse_engine_digest(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any) -> None:
    """Register ``inspect`` and ``verify`` on the ``trtet-store`` subparsers."""
    i = sub.add_parser(
        "inspect",
        help="the layout of a .pte or .ptd",
        description="Headers, segments, named data, delegates and TensorRT "
        "blob headers of a .pte or .ptd; payload bytes are not read.",
    )
    i.add_argument("file", type=Path, metavar="FILE")
    add_option(i, "--json")
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
    add_option(v, "--json")
    v.set_defaults(func=cmd_verify)


def cmd_inspect(args: argparse.Namespace) -> int:
    """``trtet-store inspect``: print the layout; exit 1 if it has structural errors."""
    from trtet_store.inspector import format_inspection, inspect_file

    try:
        ins = inspect_file(args.file)
    except OSError as exc:
        return fail("inspect", str(exc))
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
        return fail("verify", str(exc), 2 if isinstance(exc, ValueError) else 1)
    member = _set_member(args.file)
    if isinstance(member, str):
        return fail("verify", member)
    if args.json:
        doc = result.to_json()
        if member is not None:
            doc["set_member"] = member.to_json()
        print(json.dumps(doc, indent=1))
    else:
        print(format_verify(result))
        if member is not None:
            print(f"set member {member.member!r} of {member.set}: " + (
                f"{', '.join(member.files)} are the files it was released with"
                if member.ok else "; ".join(member.problems)))
    return 0 if result.ok and (member is None or member.ok) else 1


def _set_member(pte: Path) -> Any:
    """The set member check of ``pte``'s directory (a member ``fetch_set`` placed there,
    whose program is ``pte``), None where there is none, or a line saying why it failed."""
    from trtet_store.sets.record import RECORD, verify_member

    if not (pte.parent / RECORD).is_file():
        return None
    try:
        check = verify_member(pte.parent)
    except (OSError, ValueError) as exc:
        return f"{pte.parent / RECORD}: {exc}"
    return check if check.files and check.files[0] == pte.name else None
