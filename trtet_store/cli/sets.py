"""``trtet-store publish-set`` and ``fetch-set``: the commands over :mod:`trtet_store.sets`.

``publish-set`` takes each member as ``--member NAME FILE.pte [FILE.ptd ...]``
and what its engines need as ``--needs NAME KEY=VALUE,...``; ``fetch-set``
picks the member for this machine (or ``--member``), with
``--compute-capability``/``--tensorrt`` to say what the machine is instead of
asking it. Both print what was shared: bytes uploaded and present already,
bytes downloaded, in the store already, and placed (clone, move, copy, link).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trtet_store.cli._common import add_option, add_s3_options, fail, mib, report_error
from trtet_store.cli._shown import shown

__all__ = ["add_parser", "cmd_fetch_set", "cmd_publish_set"]

#: ``--needs`` keys -> the Member field each sets.
NEEDS = {"compute_capability": "compute_capability", "cc": "compute_capability",
         "tensorrt": "tensorrt", "executorch": "executorch",
         "version_compatible": "version_compatible",
         "hardware_compatibility": "hardware_compatibility"}


def add_parser(sub: Any) -> None:
    """Register ``publish-set`` and ``fetch-set`` on the ``trtet-store`` subparsers."""
    p = sub.add_parser(
        "publish-set",
        help="publish a release of several programs, each distinct file once",
        description="Publish every member's files under s3://BUCKET/PREFIX/: each distinct "
        "file once (blobs/<xxh3-128>), only those the bucket lacks sent, committed by one "
        "set manifest written last.")
    p.add_argument("url", metavar="s3://BUCKET/PREFIX/")
    p.add_argument("--member", nargs="+", action="append", required=True,
                   metavar=("NAME", "FILE"),
                   help="a member: its name, its .pte, then its .ptd files (repeatable)")
    p.add_argument("--needs", nargs=2, action="append", default=[],
                   metavar=("NAME", "KEY=VALUE,..."),
                   help="what a member's engines need: cc=8.9, tensorrt=10.3.0, "
                   "executorch=1.5.1, version_compatible=true, "
                   "hardware_compatibility=ampere_plus")
    add_option(p, "--replace", "replace an existing set")
    add_option(p, "--journal-dir", "where each blob's resumable upload journal goes")
    p.add_argument("--gc-grace", type=float, default=24.0, metavar="HOURS",
                   help="after the commit, prune blobs no manifest names that are older "
                   "than this (default 24; 0 only where no other publisher of the set runs)")
    add_option(p, "--signing-key", "sign the set manifest with this ed25519 key (blobs named "
               "by sha256 too; default TRTET_SIGNING_KEY, else the config file's)")
    add_option(p, "--dry-run", "send, commit and delete nothing: print the blobs the publish "
               "would remove and prune, and those it keeps and why")
    add_s3_options(p)
    p.set_defaults(func=cmd_publish_set)

    f = sub.add_parser(
        "fetch-set",
        help="fetch the member of a set this machine runs",
        description="Fetch one member of the set at s3://BUCKET/PREFIX/ into DIR: the one "
        "this machine runs (its GPU's compute capability and TensorRT), or --member; only "
        "the blobs the local store lacks are downloaded; the files are placed in one "
        "transaction (reflink where the filesystem can, else copied; --link: hard links, "
        "read-only).")
    f.add_argument("url", metavar="s3://BUCKET/PREFIX/")
    f.add_argument("out", type=Path, metavar="DIR", help="the directory the files go into")
    f.add_argument("--member", default=None, metavar="NAME",
                   help="the member to fetch (default: the one this machine runs)")
    f.add_argument("--store", type=Path, default=None, metavar="DIR",
                   help="the local content store (default: .trtet-blobs beside DIR)")
    f.add_argument("--link", action="store_true",
                   help="place hard links to the store (read-only files, no new disk)")
    add_option(f, "--replace-needed", "replace a .ptd that another .pte of DIR needs "
               "(default: refused, and such a .ptd of the previous member is kept)")
    f.add_argument("--compute-capability", default=None, metavar="X.Y",
                   help="this machine's GPU, instead of asking nvidia-smi")
    f.add_argument("--tensorrt", default=None, metavar="VERSION",
                   help="this machine's TensorRT, instead of the installed package's")
    add_option(f, "--trusted-key", "fetch only a set signed by this public key, each blob "
               "checked by sha256 (repeatable; default TRTET_TRUSTED_KEYS, else the config "
               "file's)")
    add_s3_options(f)
    f.set_defaults(func=cmd_fetch_set)


def _needs(pairs: list[list[str]], names: set[str]) -> dict[str, dict[str, Any]]:
    """``--needs NAME k=v,...`` as Member keywords per member; ValueError naming the flag."""
    out: dict[str, dict[str, Any]] = {}
    for name, text in pairs:
        if name not in names:
            raise ValueError(f"--needs {name}: no --member {name}")
        for item in text.split(","):
            key, eq, value = item.partition("=")
            field = NEEDS.get(key.strip().replace("-", "_"))
            if not eq or field is None:
                raise ValueError(f"--needs {name} {text}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(sorted(NEEDS))}")
            value = value.strip()
            if field == "version_compatible":
                if value.lower() not in ("true", "false"):
                    raise ValueError(f"--needs {name}: version_compatible is true or false")
                out.setdefault(name, {})[field] = value.lower() == "true"
            else:
                out.setdefault(name, {})[field] = value
    return out


def cmd_publish_set(args: argparse.Namespace) -> int:
    """Run ``trtet-store publish-set``; 0 done, 1 failed, 2 bad arguments."""
    from trtet_store.remote import PublishConfig, RemoteError
    from trtet_store.sets import Member, publish_set

    members: dict[str, Any] = {}
    for name, *files in args.member:
        if not files:
            return fail("publish-set", f"--member {name}: give its .pte (and .ptd files) after "
                        "the name", 2)
        if name in members:
            return fail("publish-set", f"--member {name} given twice", 2)
        members[name] = files
    try:
        needs = _needs(args.needs, set(members))
        members = {n: Member(files, **needs.get(n, {})) for n, files in members.items()}
        config = PublishConfig(journal_dir=args.journal_dir)
        if not 0 <= args.gc_grace < float("inf"):
            raise ValueError(f"--gc-grace must be a number of hours >= 0, not {args.gc_grace}")
    except (TypeError, ValueError) as exc:
        return fail("publish-set", str(exc), 2)
    try:
        report = publish_set(members, args.url, endpoint_url=args.endpoint_url, config=config,
                             if_exists="replace" if args.replace else "error",
                             gc_grace=args.gc_grace * 3600, signing_key=args.signing_key,
                             dry_run=args.dry_run)
    except (KeyboardInterrupt, RemoteError, OSError, ValueError, TypeError) as exc:
        return report_error(exc, "publish-set")
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    if report.dry_run:
        print(f"{report.url}: dry run, nothing sent, committed or deleted: would remove "
              f"{len(report.removed)} blob(s) no member names any more, prune "
              f"{len(report.pruned)} no manifest names")
        for verb, digests in (("removed", report.removed), ("pruned", report.pruned)):
            print("".join(f"  blobs/{d}: would be {verb}\n" for d in digests), end="")
        for digest, why in sorted(report.kept.items()):
            print(f"  kept blobs/{digest}: {why}")
        return 0
    print(f"{report.url}: {len(report.members)} member(s), {mib(report.bytes_files)} of files "
          f"in {mib(report.bytes_distinct)} distinct: uploaded {mib(report.bytes_uploaded)}, "
          f"copied server-side {mib(report.bytes_copied)}, present already "
          f"{mib(report.bytes_present)}; manifest {report.manifest_key}")
    for name, files in report.members.items():
        print(f"  {shown(name)}: {', '.join(shown(f) for f in files)}")
    for digest in report.removed:
        print(f"  blobs/{digest}: removed (no member names it any more)")
    for digest in report.pruned:
        print(f"  blobs/{digest}: pruned (no manifest named it, older than the grace period)")
    return 0


def cmd_fetch_set(args: argparse.Namespace) -> int:
    """Run ``trtet-store fetch-set``; 0 done, 1 failed, 2 bad arguments."""
    from trtet_store.cache.tier import KeyFileError
    from trtet_store.remote import RemoteError
    from trtet_store.sets import Machine, fetch_set
    from trtet_store.sets.fetch import fetch_set_command

    machine = None
    if args.compute_capability is not None or args.tensorrt is not None:
        try:
            detected = Machine.detect()
            machine = Machine(args.compute_capability or detected.compute_capability,
                              args.tensorrt or detected.tensorrt)
        except ValueError as exc:
            return fail("fetch-set", str(exc), 2)
    try:
        report = fetch_set(args.url, args.out, args.member, machine=machine, store=args.store,
                           link=args.link, endpoint_url=args.endpoint_url,
                           replace_needed=args.replace_needed, trusted_keys=args.trusted_key)
    except KeyError as exc:
        return fail("fetch-set", str(exc.args[0] if exc.args else exc))
    except (KeyboardInterrupt, KeyFileError, RemoteError, OSError) as exc:
        # Ctrl-C says to run the same fetch-set again (a network failure's message does).
        again = fetch_set_command(args.url, Path(args.out).absolute(), args.member,
                                  machine=machine, store=args.store, link=args.link,
                                  endpoint_url=args.endpoint_url,
                                  replace_needed=args.replace_needed,
                                  trusted_keys=args.trusted_key)
        return report_error(exc, "fetch-set", out=args.out, resume=again)
    for line in report.left_alone:  # a file we did not make: said, never acted on
        print(f"trtet-store fetch-set: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    how = ", ".join(f"{mib(n)} by {k}" for k, n in sorted(report.placed.items()))
    print(f"{report.url} member {shown(report.member)}"
          f"{' (picked for this machine)' if report.picked else ''} -> {shown(args.out)}: "
          f"{mib(report.bytes_total)}: downloaded {mib(report.bytes_downloaded)}, in the store "
          f"already {mib(report.bytes_in_store)}; placed {how}")
    for path in report.paths:
        print(f"  {shown(path)}")
    return 0
