"""``trtet-store compile-and-save [MODULE.py:FACTORY] OUT``: the command over ``compile_and_save``.

MODULE.py is imported and FACTORY() gives the module and its inputs
(:mod:`trtet_store.cli.sources`); the program is lowered and saved with the
engines moved, not copied. With ``--publish s3://...`` the files written are
then published; without OUT, :func:`trtet_store.remote.compile_and_publish`
publishes the program straight from its pieces and writes nothing local.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from trtet_store.cli._common import (
    OptionValueError,
    ProgressBar,
    add_option,
    add_s3_options,
    fail,
    mib,
    one_line,
    report_error,
    size_arg,
)
from trtet_store.cli.stub_builder import ENV, StubBuilderError, stub_builder

__all__ = ["add_parser", "cmd_compile_and_save"]


#: compile-and-save's backends (``trtet_store.export.options.BACKENDS``, which imports no
#: further here: the CLI judges ``--backend`` before torch is imported).
BACKENDS = ("tensorrt", "xnnpack")


def backend_arg(text: str) -> str:
    """``--backend``'s value (argparse ``type=``): a typo is named as a typo, before anything
    else is judged (the stub variable, the factory).

    Raises
    ------
    OptionValueError
        ``text`` is not one of :data:`BACKENDS`.
    """
    if text in BACKENDS:
        return text
    import difflib

    close = difflib.get_close_matches(text, BACKENDS, n=1)
    guess = f"did you mean {close[0]}? " if close else ""
    raise OptionValueError(f"{text!r} is not a backend: {guess}choose tensorrt (the default) "
                           "or xnnpack")


def add_parser(sub: Any) -> None:
    """Register ``compile-and-save`` on the ``trtet-store`` subparsers."""
    c = sub.add_parser(
        "compile-and-save",
        help="lower a model and save it (engines moved, not copied)",
        description="Import MODULE.py, call FACTORY() for (module, inputs), and "
        "run trtet_store.compile_and_save(module, inputs, OUT); with --method, one "
        "method per factory in one program.",
        epilog=f"Test aid: {ENV}=1 builds the engines with the stub TensorRT builder "
        "(trtet_store.testing.stub_tensorrt: pseudo-random engine bytes, no GPU) and runs "
        "everything after the build for real, so the engine cache can be tried from a shell.",
    )
    c.add_argument(
        "paths",
        nargs="*",
        metavar="[MODULE.py:FACTORY] OUT",
        help="FACTORY() returns (module, example_inputs), a dict with 'module' and "
        "'inputs', or a module with an 'example_inputs' attribute; OUT is the .pte to "
        "write (with --publish, optional). Without FACTORY, give --method",
    )
    c.add_argument(
        "--method",
        action="append",
        default=[],
        metavar="NAME=MODULE.py:FACTORY",
        help="a method of the program (repeat: e.g. prefill=m.py:prefill "
        "decode=m.py:decode); each is exported with its own example inputs",
    )
    c.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ExecutorchBackendConfig field for to_executorch (repeat), e.g. "
        "segment_alignment=4096, extract_delegate_segments=true",
    )
    # (argparse's default is None: only other defaults are given)
    c.add_argument("--external-weights", metavar="NAME",
                   help="weights of what TensorRT leaves to other partitioners in NAME.ptd")
    c.add_argument("--backend", default="tensorrt", type=backend_arg,
                   help="tensorrt (default) or xnnpack")
    c.add_argument(
        "--refittable", action="store_true",
        help="build refittable engines (the API's immutable_weights=False): with "
             "--engine-cache, an export that changes only the weights refits the cached "
             "engine instead of building (with TRTET_STUB_TENSORRT=1, the stub refitter)")
    c.add_argument("--external-engine-data", metavar="NAME",
                   help="put engines (xnnpack: weights) in NAME.ptd beside OUT")
    c.add_argument("--segment-alignment", type=size_arg, metavar="N",
                   help="segment alignment of the program (4096: page-aligned payloads)")
    c.add_argument("--etrecord", action="store_true", help="also write OUT_etrecord.bin")
    c.add_argument(
        "--store",
        type=Path,
        default=None,
        metavar="DIR",
        help="staging directory for engines (default beside OUT); engines of a failed run "
        "stay there and the next run of the same export reuses them",
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wait this long for another write of OUT to finish (default: refuse at once)",
    )
    c.add_argument(
        "--versioned",
        action="store_true",
        help="write the .pte and .ptd files as a new version in OUT's .versions/ and switch "
        "the symlink OUT without its suffix to it atomically (readers resolve it once and "
        "get one consistent set); 3 versions are kept",
    )
    c.add_argument(
        "--keep-versions",
        type=int,
        default=None,
        metavar="N",
        help="with --versioned (implied), keep N versions instead of 3",
    )
    add_option(c, "--replace-needed", "replace a .ptd that another .pte beside OUT needs (by "
               "default refused, before the build: ExecuTorch names .ptd files by tag, so two "
               "programs collide)")
    c.add_argument(
        "--publish", default=None, metavar="s3://BUCKET/KEY.pte",
        help="publish the program there (as `trtet-store publish` does). Without OUT, "
             "nothing local is written: the program is exported, its engines staged in a "
             "temporary store under --store (default: the current directory), and published "
             "straight from its pieces; with OUT, the files written are published")
    add_option(c, "--replace", "with --publish: replace an existing program there")
    c.add_argument(
        "--engine-cache", nargs="?", const="", default=None, metavar="DIR",
        help="take engines from the engine cache and put new builds in it (a hit skips the "
             "build); DIR, or the per-user default ($XDG_CACHE_HOME/trtet_store/engines). A "
             "MODULE.py:FACTORY or .pte after it is a positional, not DIR "
             "(--engine-cache=DIR always takes DIR)")
    c.add_argument(
        "--engine-cache-remote", default=None, metavar="s3://BUCKET[/PREFIX]",
        help="share the engine cache through this bucket (implies --engine-cache): a local "
             "miss is looked up there and downloaded, verified, instead of built; a build is "
             "published there (first wins). The remote never fails the compile: a warning, "
             "and the local cache alone. --endpoint-url applies")
    c.add_argument(
        "--engine-cache-verify", choices=("seal", "full"), default=None,
        help="what an engine cache hit trusts (implies --engine-cache): seal (default) serves "
             "a cached engine whose file is unchanged since it was sealed (device, inode, "
             "size, mtime, ctime) without reading it; full reads and digests every hit "
             "again. `trtet-store cache verify` scrubs the whole cache")
    add_option(c, "--signing-key", "with --engine-cache-remote: sign what is published with "
               "this ed25519 private key (`trtet-store cache keygen`; default: "
               "TRTET_SIGNING_KEY or the config file)")
    add_option(c, "--trusted-key", "with --engine-cache-remote: use only shared entries "
               "signed by this public key (repeatable; default: TRTET_TRUSTED_KEYS or the "
               "config file); others are a miss, never served")
    add_s3_options(c)  # --endpoint-url, --json, --no-progress
    c.set_defaults(func=cmd_compile_and_save)


def cmd_compile_and_save(args: argparse.Namespace) -> int:
    """``trtet-store compile-and-save``: lower and save through ``trtet_store.compile_and_save``."""
    from trtet_store import compile_and_save
    from trtet_store.cli import sources

    try:
        stub = stub_builder(args.backend)
    except StubBuilderError as exc:
        return fail("compile-and-save", str(exc), 2)
    if stub is not None:
        print(f"trtet-store compile-and-save: {ENV}=1: engines are built by the stub builder "
              "(a test aid, no TensorRT): the programs hold no runnable engine",
              file=sys.stderr)
    # Without OUT (--publish alone), the flags that need it are refused first: a usage
    # error before any request.
    no_out = args.publish is not None and len(args.paths) == (0 if args.method else 1)
    refused = (_needs_out(args) if no_out else None) or _check_before_build(args)
    if refused is not None:
        return refused
    try:
        source, inputs, out = sources.compile_source(
            args.paths, args.method, out_optional=args.publish is not None)
        backend_config = sources.backend_config(args.backend_config)
    except Exception as exc:
        return report_error(exc, "compile-and-save", plain=True)
    if out is None:  # --publish without OUT: from the program's pieces, nothing written here
        return _compile_and_publish(args, source, inputs, backend_config, stub)
    kwargs: dict[str, Any] = {}
    if backend_config is not None:
        kwargs["backend_config"] = backend_config
    if args.segment_alignment is not None:
        kwargs["segment_alignment"] = args.segment_alignment
    if args.store is not None:
        # A directory, not a BlobStore: the call's own store there keeps a
        # failed run's engines as orphans, where the next run finds them.
        kwargs["store"] = args.store
    if args.timeout is not None:
        kwargs["timeout"] = args.timeout
    if args.versioned or args.keep_versions is not None:
        kwargs["versioned"] = True if args.keep_versions is None else args.keep_versions
    if args.replace_needed:
        kwargs["replace_needed"] = True
    if args.refittable:
        kwargs["immutable_weights"] = False  # Torch-TensorRT's spelling of "refittable"
    if args.engine_cache_remote is None and (args.signing_key or args.trusted_key):
        return fail("compile-and-save", "--signing-key and --trusted-key need "
                    "--engine-cache-remote s3://BUCKET")
    bar = ProgressBar("writing", enabled=not args.no_progress, leave=False)
    if args.engine_cache is not None or args.engine_cache_remote is not None or \
            args.engine_cache_verify is not None:
        from trtet_store import EngineCache

        verify = args.engine_cache_verify or "seal"
        try:
            if args.engine_cache_remote is None:
                kwargs["engine_cache"] = EngineCache(args.engine_cache or None, verify=verify)
            else:
                from trtet_store.cache.tier import RemoteTier

                # A bad URL is refused here, before the build and before the cache
                # directory is made (no request is sent).
                tier = RemoteTier(args.engine_cache_remote, endpoint_url=args.endpoint_url,
                                  signing_key=args.signing_key, trusted_keys=args.trusted_key)
                kwargs["engine_cache"] = EngineCache(
                    args.engine_cache or None, remote=args.engine_cache_remote,
                    endpoint_url=args.endpoint_url, signing_key=tier.signing_key,
                    trusted_keys=None if tier.trusted_keys is None
                    else list(tier.trusted_keys.values()), verify=verify,
                    on_wait=bar.waiting)
        except Exception as exc:
            return report_error(exc, "compile-and-save", out=out)
    kwargs["progress"] = bar  # (done, total) today, an object with .done/.total tomorrow
    from trtet_store.cli.publish import warnings_shown

    try:
        # The shared cache's warnings (a wait on another machine's build, a tier that
        # cannot be used) are one line each on stderr, as publish's are. The bar is
        # closed before an error or the report.
        with bar, stub or contextlib.nullcontext(), warnings_shown(args, bar, "compile-and-save"):
            report = compile_and_save(source, inputs, out, lowering=_lowering(args), **kwargs)
    except Exception as exc:
        return report_error(exc, "compile-and-save", out=out)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(f"wrote {_written(report, versioned='versioned' in kwargs)}")
        for w in report.writes:
            print(f"  {w.path}: {w.size} bytes in {w.seconds:.2f} s")
            for p in w.placements:
                print(f"    payload at {p.offset}, {p.size} bytes: {p.placement} ({p.reason})")
        for e in getattr(report, "engine_cache", None) or ():
            print(f"  engine {e.engine_id}: {_engine_event(e)}")
    if args.publish is not None:
        return _publish_written(args, [w.path for w in report.writes])
    return 0


#: Said after each refusal of :func:`_check_before_build`.
_BEFORE = "(checked before the build: nothing built or written)"


def _check_before_build(args: argparse.Namespace) -> int | None:
    """The remote destinations checked before the factory runs and any engine is built
    (with real TensorRT a build takes minutes to hours); a refusal is one line, exit 1.

    ``--publish``: the URL, the bucket and the credentials (HeadBucket), and, without
    ``--replace``, that neither the key nor its manifest exists. ``--engine-cache-remote``:
    the URL, the key files (``--signing-key``, ``--trusted-key``, or the configured
    ones), the bucket and the credentials; an endpoint that does not answer is left to
    the tier (its rule: a warning, and the build goes on). None: go on.
    """
    if args.publish is None and args.engine_cache_remote is None:
        return None
    from trtet_store.remote.errors import EndpointUnreachableError

    def refuse(text: str) -> int:
        return fail("compile-and-save", f"{text} {_BEFORE}")

    if args.publish is not None:
        from trtet_store.remote.manifest import manifest_key
        from trtet_store.remote.s3 import S3
        from trtet_store.remote.url import RemoteURL

        try:
            dest = RemoteURL.parse(args.publish)
        except Exception as exc:  # noqa: BLE001 - the URL's own message quotes it
            return refuse(one_line(exc))
        try:
            s3 = S3(args.endpoint_url)
            s3.check_bucket(dest.bucket)
            existing = [] if args.replace else \
                [k for k in (dest.key, manifest_key(dest.key)) if s3.head(dest.bucket, k)]
        except Exception as exc:  # noqa: BLE001 - one line, whatever it is
            return refuse(f"--publish {args.publish}: {one_line(exc)}")
        if existing:  # as publish says it, before the build
            from trtet_store.remote.errors import KeyExistsError

            return refuse(one_line(KeyExistsError.of(dest.bucket, existing)))
    if args.engine_cache_remote is not None:
        from trtet_store.remote.keyconfig import resolve_signing, resolve_trusted

        for flag, resolve, value in (("--signing-key", resolve_signing, args.signing_key),
                                     ("--trusted-key", resolve_trusted, args.trusted_key)):
            try:
                resolve(value)
            except FileNotFoundError as exc:
                return refuse(f"{flag} {exc.filename}: no such file")
            except Exception as exc:  # noqa: BLE001
                return refuse(f"{flag}: {one_line(exc)}")
        from trtet_store.cache.tier import RemoteTier
        from trtet_store.remote.errors import RemoteURLError

        try:
            tier = RemoteTier(args.engine_cache_remote, endpoint_url=args.endpoint_url)
        except RemoteURLError as exc:  # its message quotes the URL
            return refuse(one_line(exc))
        try:
            tier.check()
        except EndpointUnreachableError:
            pass  # the tier's rule: an outage warns, the build goes on
        except Exception as exc:  # noqa: BLE001
            return refuse(f"--engine-cache-remote {args.engine_cache_remote}: "
                          f"{one_line(exc)}")
    return None


def _written(report: Any, *, versioned: bool) -> str:
    """The program's path to print: a versioned write's OUT does not exist, so the path
    through the link it switched (``out/a/a.pte``), and where the link points now."""
    if not versioned:
        return str(report.path)
    import os

    from trtet_store.io.versioned import version_link

    link = version_link(report.path)
    return f"{link / report.path.name} ({link} -> {os.readlink(link)})"


def _engine_event(e: Any) -> str:
    """One engine's cache outcome: local hit, remote hit (bytes downloaded), refit, or built."""
    if e.outcome == "hit":
        return f"hit, {e.placement}"
    if e.outcome == "remote-hit":
        got = getattr(e, "downloaded", None)
        return (f"remote-hit, {mib(got) if got is not None else '?'} downloaded, "
                f"{e.placement}")
    text = f"{e.outcome}, " + (f"cached ({e.placement})" if e.stored
                              else f"not cached ({e.reason})")
    if e.outcome == "refit" and getattr(e, "written", None) is not None:
        # What the refit cost instead of a build: its engine's bytes, its seconds.
        got = getattr(e, "downloaded", None)  # the shared structure entry's download
        text = f"refit ({mib(e.written)} written, {e.seconds:.1f} s" + \
            (f", structure entry {mib(got)} downloaded" if got else "") + "), " + \
            text.removeprefix("refit, ")
    if e.stored and e.reason:  # a rebuilt damaged entry: how it was damaged
        text += f", {e.reason}"
    if getattr(e, "missed_because", None):  # what differs from the closest cached build
        text += f", missed because {e.missed_because}"
    published = getattr(e, "published", None)
    if published is not None:  # a remote tier was asked: say what became of the build there
        text += ", published" if published else \
            f", not published ({getattr(e, 'publish_reason', None) or 'no reason given'})"
    if getattr(e, "remote_reason", None):
        text += f"; the shared entry was not used: {e.remote_reason}"
    if getattr(e, "timing_cache", None):  # where the build's tactic timing started
        text += f"; {e.timing_cache}"
    return text


#: compile-and-save's options that write local files, which --publish without OUT cannot.
_LOCAL_ONLY = {"etrecord": "--etrecord", "versioned": "--versioned",
               "keep_versions": "--keep-versions", "timeout": "--timeout"}


def _needs_out(args: argparse.Namespace) -> int | None:
    """--publish without OUT: the flags that write local files (or refit) refused."""
    given = [flag for attr, flag in _LOCAL_ONLY.items() if getattr(args, attr, None)]
    if given:
        return fail("compile-and-save", f"{', '.join(given)} need OUT (they write local "
                    "files); --publish without OUT writes none")
    if args.refittable:
        return fail("compile-and-save", "--refittable needs OUT (a refit reuses a cached "
                    "engine: give OUT and --engine-cache); --publish without OUT builds "
                    "immutable engines")
    return None


def _lowering(args: argparse.Namespace) -> Any:
    """The lowering options the command's flags give (a bad one raised as the call's error)."""
    from trtet_store import LoweringOptions

    return LoweringOptions(backend=args.backend, external_engine_data=args.external_engine_data,
                           external_weights=args.external_weights,
                           generate_etrecord=args.etrecord)


def _compile_and_publish(args: argparse.Namespace, source: Any, inputs: tuple | None,
                         backend_config: Any, stub: Any = None) -> int:
    """``compile-and-save --publish URL`` without OUT, over ``remote.compile_and_publish``."""
    from trtet_store import remote
    from trtet_store.cli.publish import print_report, progress_bar

    refused = _needs_out(args)
    if refused is not None:
        return refused
    bar = progress_bar(args)
    try:
        with bar, stub or contextlib.nullcontext():
            report = remote.compile_and_publish(
                source, inputs, args.publish, store=args.store, lowering=_lowering(args),
                backend_config=backend_config, segment_alignment=args.segment_alignment,
                endpoint_url=args.endpoint_url, replace=args.replace, progress=bar)
    except Exception as exc:  # noqa: BLE001 - every failure is one line, as compile-and-save's
        from trtet_store.remote.upload.program import publish_staging

        kept = publish_staging(args.store)
        hint = (f" (the built engines are kept in {kept}; run the same command again to "
                "reuse them)") if kept.is_dir() and any(kept.iterdir()) else ""
        return fail("compile-and-save", one_line(exc) + hint)
    print_report(report, args.publish, args.json)
    return 0


def _publish_written(args: argparse.Namespace, files: list[Path]) -> int:
    """``compile-and-save OUT --publish URL``: publish the files compile_and_save wrote."""
    import trtet_store
    from trtet_store.cli.publish import print_report, progress_bar

    bar = progress_bar(args)
    try:
        with bar:
            report = trtet_store.publish(files, args.publish, endpoint_url=args.endpoint_url,
                                         replace=args.replace, progress=bar)
    except Exception as exc:  # noqa: BLE001 - every failure is one line
        return fail("compile-and-save", f"{one_line(exc)} (the files are written: publish "
                    f"them with `trtet-store publish {' '.join(map(str, files))} "
                    f"{args.publish}`)")
    print_report(report, args.publish, args.json)
    return 0
