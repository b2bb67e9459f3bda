"""``trtet-store cache``: list, measure, prune, verify and clear the engine cache; share it.

A thin shell over :class:`trtet_store.EngineCache` (``entries``, ``stats``,
``prune``, ``verify``, ``clear``; with ``--remote``: ``remote_entries``,
``push``, ``pull``, ``prune_remote``)::

    trtet-store cache [--dir DIR] [--json] list    # key, kind, size, last use, hits, versions, GPU
    trtet-store cache [--dir DIR] [--json] stats
    trtet-store cache [--dir DIR] [--json] prune [--max-bytes N]
    trtet-store cache [--dir DIR] [--json] verify    # exit 1 when a damaged entry was dropped
    trtet-store cache [--dir DIR] [--json] clear
    trtet-store cache [--dir DIR] [--json] recover   # remove what interrupted writers left
    trtet-store cache [--dir DIR] [--json] export-timing OUT [--key KEY] [--replace]
        # a merged TensorRT timing cache (default: this machine's) to OUT, for
        # trtexec --timingCacheFile OUT or TensorRT-LLM's --input_timing_cache OUT

    # the shared tier in a bucket (issue 37); --endpoint-url URL on each. push and pull
    # show a bar (bytes across the keys) when stderr is a terminal; --no-progress: none.
    trtet-store cache list --remote s3://BUCKET[/PREFIX]     # key, size, created, host, origin
    trtet-store cache push --remote URL [KEY...] [--no-progress]   # publish local builds
    trtet-store cache pull --remote URL KEY... [--no-progress]     # into the local cache
    trtet-store cache prune --remote URL --older-than AGE [--dry-run]   # AGE: 7d, 12h, 30m, 90s

    # signed entries (issue 44): list, push and pull with --remote take
    # --signing-key PATH and --trusted-key PATH (repeatable); default TRTET_SIGNING_KEY,
    # TRTET_TRUSTED_KEYS, the config file (trtet_store.remote.keyconfig)
    trtet-store cache keygen PATH    # PATH (private, 0600) + PATH.pub; prints the key id

``list --remote`` and ``prune --remote`` work on the bucket alone: the local
directory is neither read nor created. ``push`` and ``pull`` need it (``pull``
creates it). ``push`` prints, per key, whether it was published, already
there, or lost the race to another machine (first wins, nothing replaced);
``pull`` the bytes downloaded (0: already here). A bad URL or AGE is refused
before any request and before any file is written.

``--dir`` and ``--json`` may also follow the action. The default directory is
the per-user one (``$XDG_CACHE_HOME/trtet_store/engines``). The bound is not
stored in the cache (each program opens it with its own), so ``prune``
without ``--max-bytes`` prunes to EngineCache's default bound, and ``stats``
prints the bound this command opened it with. A directory that does not
exist holds nothing: it is reported, never created. Entries in use by
another process (a hit being placed) are never evicted or cleared.

``list`` and ``stats`` open the cache read-only: they create nothing (no
lock, no tag, no subdirectory) and remove nothing. Recovery (temp files of
dead writers, records without their blob) runs when a writing action opens
the cache, or on ``recover``, which prints what it removed. A link, or a
directory that is not a trtet_store cache (no ``CACHEDIR.TAG``, and not
empty), is refused by every action in one line, before anything is touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
import types
from pathlib import Path
from typing import Any

from trtet_store.cli._common import (
    OptionValueError,
    ProgressBar,
    add_option,
    add_s3_options,
    fail,
    mib,
    report_error,
    size_arg,
)

__all__ = ["add_parser", "cmd_cache", "parse_age"]

#: The kinds of entries, as the metadata names them, and how ``list`` shows them.
KINDS = {"trtet_store.tensorrt.engine": "engine", "trtet_store.tensorrt.build": "build",
         "trtet_store.tensorrt.structure": "structure", "torch_tensorrt.packed": "torch-tensorrt",
         "trtet_store.tensorrt.timing": "timing"}
#: A TensorRT timing cache's kind (``trtet_store.export.timing_cache.TIMING_KIND``).
TIMING = "trtet_store.tensorrt.timing"


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # On the actions too, so `cache list --json` works as well as `cache --json list`;
    # there SUPPRESS keeps an option given before the action from being reset.
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--dir", type=Path, default=default, metavar="DIR",
                        help="the cache directory (default: $XDG_CACHE_HOME/trtet_store/engines)")
    add_option(parser, "--json", default=argparse.SUPPRESS if suppress else False)


#: ``--older-than`` units, in seconds.
AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGE = re.compile(r"(-?)(\d+(?:\.\d+)?)([smhdw])")


def parse_age(text: str) -> float:
    """Seconds from an age like ``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or ``1.5h``.

    Raises
    ------
    OptionValueError
        Anything else (a bare number, a negative one, another unit): one
        line, exit code 2.
    """
    m = _AGE.fullmatch(text.strip())
    if m is None:
        raise OptionValueError(
            f"not an age: {text!r}; give a number and a unit: 7d, 12h, 30m, 90s or 2w")
    if m.group(1):
        raise OptionValueError(f"an age cannot be negative: {text!r}; give how long ago, "
                               "e.g. 7d (0s: everything)")
    return float(m.group(2)) * AGE_UNITS[m.group(3)]


def add_parser(sub: Any) -> None:
    """Register ``cache`` (with its actions) on the ``trtet-store`` subparsers."""
    c = sub.add_parser(
        "cache",
        help="list, prune, verify or clear the engine cache; share it through a bucket",
        description="The persistent TensorRT engine cache (trtet_store.EngineCache): its "
        "entries, its size, pruning to a bound, a full re-digest, clearing; with --remote, "
        "the shared tier in a bucket: its entries, push, pull, prune by age.",
    )
    _common_options(c, suppress=False)
    actions = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("list", "every entry: key, kind, size, last use, hits, versions, GPU "
                        "(--remote: the bucket's: key, size, created, host, origin)"),
                       ("stats", "entries, distinct bytes, hits, free space"),
                       ("prune", "evict least recently used entries down to a bound "
                        "(--remote: remove the bucket's entries older than --older-than)"),
                       ("verify", "re-digest every entry; drop (and report) damaged ones"),
                       ("clear", "remove every entry not in use"),
                       ("recover", "remove what interrupted writers left (temp files, "
                        "records without their blob) and say what"),
                       ("push", "publish local builds to the bucket (first wins)"),
                       ("pull", "download builds from the bucket into the local cache"),
                       ("keygen", "write a new ed25519 key pair for signed shared entries: "
                        "PATH (private, 0600) and PATH.pub; never overwrites"),
                       ("export-timing", "write a merged TensorRT timing cache (default: this "
                        "machine's) to a file, for trtexec --timingCacheFile or TensorRT-LLM's "
                        "--input_timing_cache")):
        a = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _common_options(a, suppress=True)
        if name == "prune":
            a.add_argument("--max-bytes", type=size_arg, default=None, metavar="N",
                           help="the bound to prune to (16G, 512M, bytes); default: "
                           "EngineCache's default bound")
            a.add_argument("--older-than", type=parse_age, default=None, metavar="AGE",
                           help="with --remote: remove entries created more than AGE ago "
                           "(7d, 12h, 30m, 90s, 2w) and unnamed upload leftovers as old")
            add_option(a, "--dry-run", "with --remote: say what would be removed, remove "
                       "nothing")
        if name in ("list", "prune", "push", "pull"):
            a.add_argument("--remote", required=name in ("push", "pull"), default=None,
                           metavar="s3://BUCKET[/PREFIX]",
                           help="the shared tier: a bucket (and a prefix) every machine uses")
            # Not add_s3_options' --json: the cache command has its own.
            add_s3_options(a, json=False, progress=name in ("push", "pull"))
        if name in ("list", "push", "pull"):
            add_option(a, "--signing-key", "with --remote: sign the entries published with "
                       "this ed25519 private key (default: TRTET_SIGNING_KEY or the config file)")
            add_option(a, "--trusted-key", "with --remote: accept only entries signed by this "
                       "public key (repeatable; default: TRTET_TRUSTED_KEYS or the config file)")
        if name == "export-timing":
            a.add_argument("out", type=Path, metavar="OUT",
                           help="the file to write (atomically; an existing one is left alone "
                           "unless --replace)")
            a.add_argument("--key", default=None, metavar="KEY",
                           help="the timing entry (trt-t-..., as `cache list` shows it, or a "
                           "prefix naming one); default: the one made for this machine's GPU, "
                           "TensorRT, CUDA and driver")
            add_option(a, "--replace", "overwrite OUT if it exists")
        if name == "keygen":
            a.add_argument("path", type=Path, metavar="PATH",
                           help="the private key file to create (the public one: PATH.pub)")
        if name == "push":
            a.add_argument("keys", nargs="*", metavar="KEY",
                           help="build keys to publish (default: every local build)")
        elif name == "pull":
            a.add_argument("keys", nargs="+", metavar="KEY", help="build keys to download")
    c.set_defaults(func=cmd_cache)


def _usage(text: str) -> int:
    return fail("cache", text, 2)


def _check_remote_args(args: argparse.Namespace) -> int | None:
    """Options that need (or refuse) ``--remote``: None when they agree, else the exit code."""
    remote = getattr(args, "remote", None)
    if args.action == "prune":
        if remote is None and args.older_than is not None:
            return _usage("--older-than prunes the shared tier: give --remote s3://BUCKET "
                          "(the local cache prunes to a bound: --max-bytes N)")
        if remote is not None and args.older_than is None:
            return _usage("prune --remote needs --older-than AGE (7d, 12h, 30m): a bucket "
                          "has no size bound to prune to")
        if remote is not None and args.max_bytes is not None:
            return _usage("--max-bytes bounds the local cache; prune --remote takes "
                          "--older-than AGE only")
        if remote is None and args.dry_run:
            return _usage("--dry-run applies to prune --remote")
    if remote is None and getattr(args, "endpoint_url", None) is not None:
        return _usage("--endpoint-url needs --remote s3://BUCKET")
    if remote is None and (getattr(args, "signing_key", None) is not None
                           or getattr(args, "trusted_key", None) is not None):
        return _usage("--signing-key and --trusted-key need --remote s3://BUCKET")
    return None


def cmd_cache(args: argparse.Namespace) -> int:
    """``trtet-store cache ACTION``: exit 0, or 1 on an error or when verify dropped entries."""
    from trtet_store import EngineCache
    from trtet_store.cache import default_directory

    refused = _check_remote_args(args)
    if refused is not None:
        return refused
    directory = args.dir if args.dir is not None else default_directory()
    remote = getattr(args, "remote", None)
    try:
        if args.action == "keygen":  # no cache directory: a key pair where PATH says
            return _keygen(args)
        if remote is not None:
            # The URL judged before anything else: no request, no file written.
            from trtet_store.cache.tier import RemoteTier

            keys = {"signing_key": getattr(args, "signing_key", None),
                    "trusted_keys": getattr(args, "trusted_key", None)}
            tier = RemoteTier(remote, endpoint_url=args.endpoint_url, **keys)
            if args.action in ("list", "prune"):  # the bucket alone: no local directory
                return REMOTE_ACTIONS[args.action](tier, args)
            if args.action == "pull":
                args.keys = _keys_as_listed(tier, args.keys)
        if not os.path.lexists(directory) and args.action == "export-timing":
            return fail("cache", f"no engine cache at {directory}: no timing cache to export "
                        "(nothing written)")
        if not os.path.lexists(directory) and args.action != "pull":
            return _absent(args, directory)
        # min_free=0: the CLI only reads, or prunes to a byte bound it is given.
        if remote is None:
            # list and stats only look: nothing created, nothing removed (no recovery).
            cache = EngineCache(directory, min_free=0,
                                read_only=args.action in ("list", "stats"))
        else:
            cache = EngineCache(directory, min_free=0, remote=remote,
                                endpoint_url=args.endpoint_url,
                                signing_key=tier.signing_key,
                                trusted_keys=None if tier.trusted_keys is None
                                else list(tier.trusted_keys.values()))
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


def _structures(cache: Any, rows: list[dict[str, Any]] | None = None) -> dict[str, list[str]]:
    """:func:`~trtet_store.export.engine_refit.structure_uses` of the cache's entries."""
    from trtet_store.export.engine_refit import structure_uses

    entries = cache.entries() if rows is None else \
        [types.SimpleNamespace(key=r["key"], metadata=r["metadata"]) for r in rows]
    return structure_uses(entries)


def _short(key: str) -> str:
    """``trtet-1a2b3c4d-sm_90.e0``: a key's digest cut to 8 digits (``--json`` has it whole)."""
    m = re.fullmatch(r"([A-Za-z_]+)-([0-9a-f]{16,})(.*)", key)
    return f"{m.group(1)}-{m.group(2)[:8]}{m.group(3)}" if m else key


def _keys_as_listed(tier: Any, given: list[str]) -> list[str]:
    """``cache pull``'s keys: each whole, as ``cache list --remote`` shows it (its digest
    cut to 8 digits), or any prefix of it that names one entry, as git takes a commit's.
    An ambiguous prefix is refused naming the entries; a key no entry has is left to
    ``pull`` (it is in neither cache). The bucket is listed only when a key is not whole
    (no 32-digit digest)."""
    if all(re.search(r"[0-9a-f]{32}", k) for k in given):
        return list(given)
    entries, _damaged = tier.listing()
    known = sorted({e.key for e in entries})
    out = []
    for k in given:
        found = [full for full in known if full == k or _short(full) == k
                 or full.startswith(k) or _short(full).startswith(k)]
        if len(found) > 1 and k not in known:
            shown = ", ".join(_short(f) for f in found[:8]) + (", ..." if len(found) > 8 else "")
            raise ValueError(f"{k!r} names {len(found)} entries of {tier.url}: {shown}; give "
                             "more of the key")
        out.append(found[0] if len(found) == 1 else k)
    return out


def _list(cache: Any, args: argparse.Namespace) -> int:
    rows = _rows(cache)
    uses = _structures(cache, rows)
    for r in rows:  # issue 46 item 7: which full entries came from which structure entry
        if r["key"] in uses:
            r["full_entries"] = uses[r["key"]]
        elif isinstance(r["metadata"].get("refit_from"), str):
            r["refit_from"] = r["metadata"]["refit_from"]
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
    for skey, full in sorted(uses.items()):
        print(f"structure {_short(skey)} (refits new weights): "
              + (", ".join(_short(k) for k in full) or "no full entry")
              + " came from it")
    return 0


def _stats(cache: Any, args: argparse.Namespace) -> int:
    s = cache.stats()
    timing = [e for e in cache.entries() if e.metadata.get("kind") == TIMING]
    if args.json:
        print(json.dumps(dict(dataclasses.asdict(s), directory=os.fspath(s.directory),
                              timing={"entries": len(timing),
                                      "bytes": sum(e.size for e in timing)}), indent=1))
        return 0
    print(f"directory:  {s.directory}{' (read-only)' if s.read_only else ''}")
    print(f"entries:    {s.entries} ({s.blobs} distinct blobs)")
    print(f"bytes:      {mib(s.bytes)} of a {mib(s.max_bytes)} bound (this command's; each "
          "program opens the cache with its own)")
    print(f"hits:       {s.hits}")
    if timing:  # TensorRT timing caches, one per GPU, TensorRT build and flag set
        print(f"timing:     {len(timing)} timing cache(s), {mib(sum(e.size for e in timing))}, "
              f"{sum(int(e.metadata.get('entries') or 0) for e in timing):,} tactic entries")
    print(f"downloads:  {mib(s.downloads_bytes)} in downloads/ (remote hits being downloaded, "
          "or cut off and kept to resume; clear removes those no download holds)")
    print(f"free:       {mib(s.free_bytes)} on its filesystem")
    return 0


def _swept(cache: Any) -> dict[str, Any]:
    """The last clear/prune/recover's partial downloads: removed (and bytes), kept held."""
    sweep = cache.blobs.swept
    return {"downloads_removed": [os.fspath(p) for p in sweep.removed],
            "downloads_removed_bytes": sweep.removed_bytes,
            "downloads_held": [os.fspath(p) for p in sweep.held]}


def _print_swept(cache: Any) -> None:
    sweep = cache.blobs.swept
    if sweep.removed:
        print(f"removed {len(sweep.removed)} partial downloads no download holds "
              f"({mib(sweep.removed_bytes)})")
    _print_kept(sweep.held)


def _print_kept(held: list[Path]) -> None:
    for path in held:
        print(f"kept the partial download {path}: a download running in another process "
              "holds it (run this again once it is done)")


def _prune(cache: Any, args: argparse.Namespace) -> int:
    target = args.max_bytes if args.max_bytes is not None else cache.max_bytes
    uses = _structures(cache)
    evicted = cache.prune(target)
    s = cache.stats()
    # A structure entry goes by its last use like any entry (a full entry never needs it
    # to be served); prune says which full entries came from one it dropped: their
    # next fine-tune builds (or downloads the shared tier's structure entry).
    dropped = {k: [f for f in uses[k] if f not in evicted] for k in evicted if k in uses}
    if args.json:
        print(json.dumps({"evicted": evicted, "bytes": s.bytes, "max_bytes": target,
                          "entries": s.entries, "structures_dropped": dropped,
                          **_swept(cache)}, indent=1))
        return 0
    print(f"evicted {len(evicted)} entries; {s.entries} left, {mib(s.bytes)} "
          f"(bound {mib(target)})" + (" : entries in use were kept" if s.bytes > target else ""))
    for key in evicted:
        print(f"  {key}")
    for key, full in dropped.items():
        print(f"dropped the structure entry {key}: "
              + (f"{', '.join(full)} came from it and stay (served as they are)"
                 if full else "no cached full entry came from it")
              + "; the next fine-tune of that structure builds")
    _print_swept(cache)
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
        print(json.dumps({"removed": removed, "left": left, **_swept(cache)}, indent=1))
    else:
        print(f"removed {len(removed)} entries" +
              (f"; {left} in use by another process kept" if left else ""))
        _print_swept(cache)
    return 0


def _recover(cache: Any, args: argparse.Namespace) -> int:
    # Opening to write already ran recovery (its removals are in .recovered); once more
    # under the lock picks up what a writer that died since left.
    removed = [*cache.blobs.recovered, *cache.recover()]
    if args.json:
        held = [os.fspath(p) for p in cache.blobs.swept.held]
        print(json.dumps({"removed": [os.fspath(p) for p in removed], "downloads_held": held},
                         indent=1))
        return 0
    print(f"{cache.directory}: " + (f"removed {len(removed)} leftover files" if removed
                                    else "nothing to recover"))
    for path in removed:
        print(f"  {os.path.relpath(path, cache.directory)}")
    _print_kept(cache.blobs.swept.held)
    return 0


# --- the shared tier (--remote) -------------------------------------------------------


def _remote_row(e: Any, tier: Any) -> dict[str, Any]:
    """One entry of the listing. ``signed_by`` is a key id only when one of the trusted
    keys verified its signature; ``claims`` is what the pointer says (anyone who can
    write the bucket can write that), ``checked`` whether trusted keys looked."""
    from trtet_store.cache.tier.signing import claimed_keys, verified_by

    checked = tier.trusted_keys is not None
    return {"key": e.key, "size": e.size, "created": e.created, "host": e.host,
            "origin": e.origin, "attempt": e.attempt, "etag": e.etag, "files": e.files,
            "metadata": e.metadata, "claims": claimed_keys(e), "checked": checked,
            "signed_by": verified_by(e, tier.trusted_keys) if checked else None,
            "refused": tier.signature_problem(e)}


def _signer_shown(r: dict[str, Any]) -> str:
    """The SIGNED BY column: a key id only when a trusted key verified it."""
    if r["signed_by"] is not None:
        return str(r["signed_by"])
    if not r["claims"]:
        return "unsigned" + (" (refused)" if r["refused"] else "")
    claims = "claims " + ", ".join(r["claims"])
    return f"{claims} (refused)" if r["checked"] else f"{claims}, not checked"


def _remote_list(tier: Any, args: argparse.Namespace) -> int:
    entries, damaged = tier.listing()
    rows = [_remote_row(e, tier) for e in sorted(entries, key=lambda e: -e.created)]
    # A pointer nobody can read is listed, never served; the next publish replaces it.
    bad = [{"key": d.key, "size": d.size, "damaged": d.reason, "etag": d.etag}
           for d in damaged]
    if args.json:
        print(json.dumps(rows + bad, indent=1))
        return 0
    for d in bad:
        print(f"{d['key']}: damaged pointer, never used ({d['damaged']}); the next build "
              "of it replaces it")
    if not rows:
        print(f"{tier.url}: no entries")
        return 0
    width = max(len("KEY"), *(len(_short(r["key"])) for r in rows))
    print(f"{'KEY':{width}}  {'SIZE':>11}  {'CREATED':19}  {'HOST':20}  {'ORIGIN':32}  "
          "SIGNED BY")
    for r in rows:
        signed = _signer_shown(r)
        print(f"{_short(r['key']):{width}}  {mib(r['size']):>11}  {_when(r['created']):19}  "
              f"{r['host'] or '-':20}  {r['origin'] or '-':32}  {signed}")
    print(f"{len(rows)} entries, {mib(sum(r['size'] for r in rows))} in {tier.url}")
    return 0


def _remote_prune(tier: Any, args: argparse.Namespace) -> int:
    kept: dict[str, str] = {}
    removed = tier.prune(args.older_than, dry_run=args.dry_run, kept=kept)
    if args.json:
        print(json.dumps({"removed": removed, "older_than": args.older_than,
                          "dry_run": args.dry_run, "kept": kept}, indent=1))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} entries and leftovers older than {args.older_than:g} s "
          f"from {tier.url}")
    for name in removed:
        print(f"  {name}")
    for name, why in sorted(kept.items()):
        print(f"  kept {name}: {why}")
    return 0


def _push_status(p: Any) -> str:
    """``published``, ``already there`` or ``lost race`` (EngineCache.push raises on errors)."""
    if p.published:
        return "published"
    # Bytes sent and then our pointer refused: another machine committed between our look
    # and our commit. Nothing sent: the entry was there before we began.
    return "lost race" if p.sent else "already there"


def _bar(args: argparse.Namespace, desc: str) -> ProgressBar:
    """push's or pull's bar: on a terminal only, as every command's (ProgressBar's rule)."""
    return ProgressBar(desc, enabled=not args.no_progress and not args.json)


def _push(cache: Any, args: argparse.Namespace) -> int:
    with _bar(args, "push") as bar:  # closed before the report (or the error) is printed
        results = cache.push(args.keys or None, progress=bar)
    rows = [{"key": p.key, "status": _push_status(p), "published": p.published,
             "reason": p.reason, "sent": p.sent,
             "host": p.entry.host if p.entry is not None else None} for p in results]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"{cache.directory}: no local builds to push")
    for r in rows:
        how = f"{mib(r['sent'])} sent" if r["status"] == "published" else r["reason"] or "-"
        print(f"{_short(r['key'])}: {r['status']} ({how})")
    return 0


def _pull(cache: Any, args: argparse.Namespace) -> int:
    with _bar(args, "pull") as bar:
        results = cache.pull(args.keys, progress=bar)
    if args.json:
        print(json.dumps([{"key": k, "downloaded": n} for k, n in results], indent=1))
        return 0
    for key, n in results:
        print(f"{_short(key)}: " + (f"{mib(n)} downloaded" if n else
                                    "already in the local cache (nothing downloaded)"))
    print(f"{len(results)} keys, {mib(sum(n for _, n in results))} downloaded into "
          f"{cache.directory}")
    return 0


def _export_timing(cache: Any, args: argparse.Namespace) -> int:
    done = cache.export_timing_cache(args.out, args.key, replace=args.replace)
    facts = done.facts
    if args.json:
        print(json.dumps({"key": done.key, "path": os.fspath(done.path), "bytes": done.size,
                          "entries": done.entries, "xxh3_128": done.digest, "facts": facts},
                         indent=1))
        return 0
    entries = f"{done.entries:,} entries, " if done.entries is not None else ""
    made = ", ".join(str(x) for x in (
        facts.get("gpu"), facts.get("compute_capability"), *(facts.get("tensorrt") or []),
        f"CUDA {facts.get('cuda')}", f"driver {facts.get('driver')}") if x is not None)
    print(f"wrote {done.path}: the timing cache {done.key} ({entries}{done.size:,} bytes) of "
          f"{made}; on such a machine: trtexec --timingCacheFile={done.path}, or "
          f"TensorRT-LLM's --input_timing_cache {done.path}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from trtet_store.cache.tier.signing import keygen

    public = keygen(args.path)
    if args.json:
        print(json.dumps({"private_key": os.fspath(args.path), "public_key": public.source,
                          "key_id": public.key_id}, indent=1))
    else:
        print(f"wrote {args.path} (private key, mode 0600: keep it secret) and {public.source} "
              f"(public key: give it to trusted_keys); key id {public.key_id}")
    return 0


ACTIONS = {"list": _list, "stats": _stats, "prune": _prune, "verify": _verify, "clear": _clear,
           "recover": _recover, "push": _push, "pull": _pull, "export-timing": _export_timing}
REMOTE_ACTIONS = {"list": _remote_list, "prune": _remote_prune}
