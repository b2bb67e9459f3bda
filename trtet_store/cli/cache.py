"""``trtet-store cache``: list, measure, prune, verify and clear the engine cache.

A thin shell over :class:`trtet_store.EngineCache` (``entries``, ``stats``,
``prune``, ``verify``, ``clear``)::

    trtet-store cache [--dir DIR] [--json] list    # key, kind, size, last use, hits, versions, GPU
    trtet-store cache [--dir DIR] [--json] stats
    trtet-store cache [--dir DIR] [--json] prune [--max-bytes N]
    trtet-store cache [--dir DIR] [--json] verify    # exit 1 when a damaged entry was dropped
    trtet-store cache [--dir DIR] [--json] clear

``--dir`` and ``--json`` may also follow the action. The default directory is
the per-user one (``$XDG_CACHE_HOME/trtet_store/engines``). The bound is not
stored in the cache (each program opens it with its own), so ``prune``
without ``--max-bytes`` prunes to EngineCache's default bound, and ``stats``
prints the bound this command opened it with. A directory that does not
exist holds nothing: it is reported, never created. Entries in use by
another process (a hit being placed) are never evicted or cleared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from trtet_store.cli._common import mib, report_error, size_arg

__all__ = ["add_parser", "cmd_cache"]

#: The kinds of entries, as the metadata names them, and how ``list`` shows them.
KINDS = {"trtet_store.tensorrt.engine": "engine", "trtet_store.tensorrt.build": "build",
         "torch_tensorrt.packed": "torch-tensorrt"}


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # On the actions too, so `cache list --json` works as well as `cache --json list`;
    # there SUPPRESS keeps an option given before the action from being reset.
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--dir", type=Path, default=default, metavar="DIR",
                        help="the cache directory (default: $XDG_CACHE_HOME/trtet_store/engines)")
    parser.add_argument("--json", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="print JSON instead of text")


def add_parser(sub: Any) -> None:
    """Register ``cache`` (with its actions) on the ``trtet-store`` subparsers."""
    c = sub.add_parser(
        "cache",
        help="list, prune, verify or clear the engine cache",
        description="The persistent TensorRT engine cache (trtet_store.EngineCache): its "
        "entries, its size, pruning to a bound, a full re-digest, clearing.",
    )
    _common_options(c, suppress=False)
    actions = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("list", "every entry: key, kind, size, last use, hits, versions, GPU"),
                       ("stats", "entries, distinct bytes, hits, free space"),
                       ("prune", "evict least recently used entries down to a bound"),
                       ("verify", "re-digest every entry; drop (and report) damaged ones"),
                       ("clear", "remove every entry not in use")):
        a = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _common_options(a, suppress=True)
        if name == "prune":
            a.add_argument("--max-bytes", type=size_arg, default=None, metavar="N",
                           help="the bound to prune to (16G, 512M, bytes); default: "
                           "EngineCache's default bound")
    c.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    """``trtet-store cache ACTION``: exit 0, or 1 on an error or when verify dropped entries."""
    from trtet_store import EngineCache
    from trtet_store.cache import default_directory

    directory = args.dir if args.dir is not None else default_directory()
    if not os.path.lexists(directory):
        return _absent(args, directory)
    try:
        # min_free=0: the CLI only reads, or prunes to a byte bound it is given.
        cache = EngineCache(directory, min_free=0)
        return ACTIONS[args.action](cache, args)
    except Exception as exc:
        return report_error(exc, "cache")


def _absent(args: argparse.Namespace, directory: Path) -> int:
    """A directory that does not exist: nothing cached, nothing created."""
    if args.json:
        out: Any = [] if args.action == "list" else {
            "directory": os.fspath(directory), "exists": False}
        print(json.dumps(out, indent=1))
    else:
        print(f"no engine cache at {directory}: nothing cached")
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _rows(cache: Any) -> list[dict[str, Any]]:
    """Every entry as ``list`` shows it; an engine takes its build record's versions."""
    entries = cache.entries()
    versions = {e.key: e.metadata.get("versions") for e in entries}
    rows = []
    for e in entries:
        meta = e.metadata
        kind = meta.get("kind")
        found = meta.get("versions") or versions.get(meta.get("build")) or []
        rows.append({
            "key": e.key, "kind": KINDS.get(kind, kind or "-"), "size": e.size,
            "last_use": e.last_use, "hits": e.hits, "created": e.created, "digest": e.digest,
            "versions": {str(name): str(version) for name, version in found},
            "gpu": meta.get("compute_capability"), "metadata": meta,
        })
    return rows


def _short(key: str) -> str:
    """``trtet-1a2b3c4d-sm_90.e0``: a key's digest cut to 8 digits (``--json`` has it whole)."""
    m = re.fullmatch(r"([A-Za-z_]+)-([0-9a-f]{16,})(.*)", key)
    return f"{m.group(1)}-{m.group(2)[:8]}{m.group(3)}" if m else key


def _list(cache: Any, args: argparse.Namespace) -> int:
    rows = _rows(cache)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"{cache.directory}: no entries")
        return 0
    width = max(len("KEY"), *(len(_short(r["key"])) for r in rows))
    print(f"{'KEY':{width}}  {'KIND':14}  {'SIZE':>11}  {'LAST USE':19}  {'HITS':>4}  "
          f"{'GPU':7}  VERSIONS")
    for r in rows:
        versions = " ".join(f"{n}={v}" for n, v in sorted(r["versions"].items())) or "-"
        print(f"{_short(r['key']):{width}}  {r['kind']:14}  {mib(r['size']):>11}  "
              f"{_when(r['last_use']):19}  {r['hits']:>4}  {r['gpu'] or '-':7}  {versions}")
    total = sum(r["size"] for r in rows)
    print(f"{len(rows)} entries, {mib(total)} (identical bytes are stored once: see stats)")
    return 0


def _stats(cache: Any, args: argparse.Namespace) -> int:
    s = cache.stats()
    if args.json:
        print(json.dumps(dict(dataclasses.asdict(s), directory=os.fspath(s.directory)),
                         indent=1))
        return 0
    print(f"directory:  {s.directory}{' (read-only)' if s.read_only else ''}")
    print(f"entries:    {s.entries} ({s.blobs} distinct blobs)")
    print(f"bytes:      {mib(s.bytes)} of a {mib(s.max_bytes)} bound (this command's; each "
          "program opens the cache with its own)")
    print(f"hits:       {s.hits}")
    print(f"free:       {mib(s.free_bytes)} on its filesystem")
    return 0


def _prune(cache: Any, args: argparse.Namespace) -> int:
    target = args.max_bytes if args.max_bytes is not None else cache.max_bytes
    evicted = cache.prune(target)
    s = cache.stats()
    if args.json:
        print(json.dumps({"evicted": evicted, "bytes": s.bytes, "max_bytes": target,
                          "entries": s.entries}, indent=1))
        return 0
    print(f"evicted {len(evicted)} entries; {s.entries} left, {mib(s.bytes)} "
          f"(bound {mib(target)})" + (" : entries in use were kept" if s.bytes > target else ""))
    for key in evicted:
        print(f"  {key}")
    return 0


def _verify(cache: Any, args: argparse.Namespace) -> int:
    report = cache.verify()
    if args.json:
        print(json.dumps({"checked": report.checked, "ok": report.ok,
                          "dropped": [{"key": k, "problem": p} for k, p in report.dropped]},
                         indent=1))
    else:
        print(f"checked {report.checked} entries: " + (
            "all as sealed" if report.ok else f"{len(report.dropped)} damaged, dropped "
            "(never served; the next build of each enters again)"))
        for key, problem in report.dropped:
            print(f"  {key}: {problem}")
    return 0 if report.ok else 1


def _clear(cache: Any, args: argparse.Namespace) -> int:
    removed = cache.clear()
    left = cache.stats().entries
    if args.json:
        print(json.dumps({"removed": removed, "left": left}, indent=1))
    else:
        print(f"removed {len(removed)} entries" +
              (f"; {left} in use by another process kept" if left else ""))
    return 0


ACTIONS = {"list": _list, "stats": _stats, "prune": _prune, "verify": _verify, "clear": _clear}
