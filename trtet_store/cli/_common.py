"""What the commands share: options, sizes, the one progress bar and the one error table.

The S3 options (``--endpoint-url``, ``--json``, ``--no-progress``:
:func:`add_s3_options`), a size argument (``16M``, parsed by
:func:`trtet_store.io.units.parse_size`), sizes printed in MiB, the one tqdm
bar over the API's progress callbacks (:class:`ProgressBar`), SIGTERM as an
exit (so cleanup runs), the one-line error (``trtet-store CMD: Type:
message``) and the CLI's one error table (:data:`ERROR_TABLE`,
:func:`explain`), which every command's failure goes through. Only argument
handling and printing: the work is the API's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtet_store.io.units import format_mib, parse_size

__all__ = ["DEFAULT_WIDTH", "ERROR_TABLE", "LOG_INTERVAL", "OPTIONS", "ErrorContext",
           "OptionValueError", "Parser", "ProgressBar", "add_option", "add_s3_options",
           "bar_interval", "cli_words", "endpoint_url_arg", "explain", "fail", "mib", "one_line",
           "report_error", "sigterm_as_exit", "size_arg"]


class OptionValueError(argparse.ArgumentTypeError):
    """An option's value refused by a message that says what to give: one line, no usage block.

    Raised by an argparse ``type=`` function; :class:`Parser` prints it as
    ``trtet-store CMD: argument --OPTION: message`` with exit code 2.
    """


class Parser(argparse.ArgumentParser):
    """argparse's parser, but an :class:`OptionValueError` is one line (its subparsers too)."""

    def error(self, message: str) -> Any:  # noqa: D102 - argparse's
        # argparse raises its ArgumentError inside the `except` of the type function's
        # error and calls error() inside its own: the type function's error is the context.
        handled = sys.exc_info()[1]
        if isinstance(getattr(handled, "__context__", None), OptionValueError):
            self.exit(2, f"{self.prog}: {message}\n")
        super().error(message)


def endpoint_url_arg(text: str) -> str:
    """``--endpoint-url``'s value, judged before any request (argparse ``type=``).

    Raises
    ------
    OptionValueError
        Not ``http://host[:port]`` or ``https://host[:port]`` (with an optional path).
    """
    from urllib.parse import urlsplit

    why = None
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        why = str(exc)
    else:
        if parts.scheme not in ("http", "https"):
            why = "no http:// or https://" if not parts.scheme else \
                f"the scheme is {parts.scheme!r}"
        elif not parts.hostname:
            why = "no host"
    if why is not None:
        raise OptionValueError(f"{text!r} is not an endpoint URL ({why}); give "
                               "http(s)://host[:port], e.g. http://127.0.0.1:8333")
    return text


#: The options several commands take, each declared once: its argparse keywords, and
#: the help every command shows unless it says what the option does there (huggingface_hub's
#: ``TokenOpt``/``RevisionOpt``). :func:`add_option` adds one.
OPTIONS: dict[str, dict[str, Any]] = {
    "--endpoint-url": {"default": None, "type": endpoint_url_arg,
                       "metavar": "http(s)://HOST[:PORT]", "help": "the S3 endpoint (default: "
                       "what boto3 finds, e.g. AWS_ENDPOINT_URL)"},
    "--json": {"action": "store_true", "help": "print JSON instead of text"},
    "--no-progress": {"action": "store_true",
                      "help": "no progress bar (there is none when stderr is no terminal)"},
    "--replace": {"action": "store_true"},
    "--dry-run": {"action": "store_true"},
    "--replace-needed": {"action": "store_true"},
    "--journal-dir": {"type": Path, "default": None, "metavar": "DIR"},
    "--signing-key": {"type": Path, "default": None, "metavar": "PATH"},
    "--trusted-key": {"type": Path, "action": "append", "default": None, "metavar": "PATH"},
}


def add_option(parser: argparse.ArgumentParser, flag: str, help: str | None = None,
               **changes: Any) -> None:
    """Add the shared option ``flag`` (:data:`OPTIONS`) to ``parser``, with ``help`` where
    the command says what it does there, and ``changes`` to its keywords (a default)."""
    parser.add_argument(flag, **{**OPTIONS[flag], **({"help": help} if help else {}),
                                 **changes})


def add_s3_options(parser: argparse.ArgumentParser, *, json: bool = True,
                   progress: bool = True) -> None:
    """Add the options of every command that talks to S3 (publish, fetch, compile-and-save).

    ``--endpoint-url`` (default: what boto3 finds), ``--json`` (print the
    report as JSON; ``json=False`` where the command has its own) and
    ``--no-progress`` (``progress=False``: the command draws no bar).
    """
    add_option(parser, "--endpoint-url")
    if json:
        add_option(parser, "--json", "print the report as JSON")
    if progress:
        add_option(parser, "--no-progress")


def size_arg(text: str) -> int:
    """A byte count from ``text`` (``8M``, ``1G``, ``4096``), for argparse ``type=``.

    Raises
    ------
    argparse.ArgumentTypeError
        ``text`` is not a size; argparse prints it as a usage error.
    """
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def mib(n: int) -> str:
    """``n`` bytes as ``"12.3 MiB"``."""
    return format_mib(n)


def one_line(exc: BaseException) -> str:
    """``Type: message``, how the commands name an error."""
    return f"{type(exc).__name__}: {exc}"


#: The API's keyword spellings in its messages, and the flags the CLI spells them with
#: (:func:`cli_words`), first match first: the API keeps its spelling, the CLI says what
#: to type.
_CLI_WORDS: tuple[tuple[str, str], ...] = (
    (r"replace=True \(--replace\)", "--replace"),
    (r"\bif_exists=(['\"])replace\1", "--replace"),
    (r"\breplace=True\b", "--replace"),
    (r"\bbackend=(['\"])(tensorrt|xnnpack)\1", r"--backend \2"),
    (r"\bimmutable_weights=False\b", "--refittable"),
    (r"\bengine_cache (applies to)\b", r"--engine-cache \1"),
)


def cli_words(text: str) -> str:
    """``text`` with the API's keywords in the CLI's spelling (``if_exists='replace'``:
    ``--replace``; ``backend='xnnpack'``: ``--backend xnnpack``)."""
    import re

    for pattern, flag in _CLI_WORDS:
        text = re.sub(pattern, flag, text)
    return text


def fail(command: str, text: str, code: int = 1) -> int:
    """Print ``trtet-store COMMAND: text`` to stderr, in the CLI's spelling
    (:func:`cli_words`); return the exit code ``code`` (2: a usage error found after
    parsing, as argparse's own)."""
    print(f"trtet-store {command}: {cli_words(text)}", file=sys.stderr)
    return code


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so cleanup (unmounting, closing bars) runs."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- the one error table -------------------------------------------------------------


@dataclass(frozen=True)
class ErrorContext:
    """What an explanation may name besides the error: the command, its output, a resume line."""

    command: str
    out: Path | None = None
    resume: str | None = None


def _no_space(exc: BaseException, ctx: ErrorContext) -> list[str]:
    """A bare ``ENOSPC``: the file, the free space now and what to do."""
    assert isinstance(exc, OSError)
    where = Path(exc.filename) if exc.filename else ctx.out
    free = "free space unknown"
    if where is not None:
        probe = where if where.is_dir() else where.parent
        try:
            st = os.statvfs(probe if probe.exists() else (ctx.out or where).parent)
            free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB available"
        except OSError:
            pass
    kept = (": staged engines are kept and the next run reuses them"
            if ctx.command == "compile-and-save" else "")
    return [f"no space left on device writing {where} ({free}; the size it needed is "
            f"unknown: {exc.strerror}); free some space or write OUT to a larger filesystem"
            + kept]


def _interrupted(exc: BaseException, ctx: ErrorContext) -> list[str]:
    if ctx.resume:
        return [f"interrupted; what was downloaded is kept: run `{ctx.resume}` to continue"]
    return ["interrupted"]


def _endpoint(exc: BaseException, ctx: ErrorContext) -> list[str]:
    url = getattr(exc, "kwargs", {}).get("endpoint_url") or "the endpoint"
    return [f"could not connect to {url}: check --endpoint-url (host and port) and that the "
            "server is running"]


#: The CLI's one error table (the model: huggingface_hub's ``cli/_errors.py``
#: ``CLI_ERROR_MAPPINGS``): ``(module, class name, lines)``, first match wins,
#: so subclasses come before their bases. A class is looked up only in a
#: module already imported: an error of a module never loaded cannot have been
#: raised, and botocore is not imported to explain a local failure. Anything
#: not listed is ``Type: message`` (:func:`one_line`), and so is everything but
#: :data:`PLAIN_ROWS` where the caller asks for ``plain`` (publish's lines name
#: the type); every error is printed as ``trtet-store COMMAND: line`` with a
#: non-zero exit, never a traceback (``-v`` shows it).
ERROR_TABLE: list[tuple[str, str, Callable[[BaseException, ErrorContext], list[str]]]] = [
    ("builtins", "KeyboardInterrupt", _interrupted),
    ("trtet_store.remote.errors", "UploadKeptError", lambda e, c: [
        f"{one_line(e)}\n  resume: {c.resume}" if c.resume else one_line(e)]),
    ("botocore.exceptions", "NoCredentialsError", lambda e, c: [
        "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, choose a "
        "profile with AWS_PROFILE, or run where an instance role applies"]),
    ("botocore.exceptions", "PartialCredentialsError", lambda e, c: [
        f"incomplete AWS credentials ({e}): set both AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY"]),
    ("botocore.exceptions", "NoRegionError", lambda e, c: [
        "no AWS region: set AWS_DEFAULT_REGION (any name works for a custom --endpoint-url)"]),
    ("botocore.exceptions", "EndpointConnectionError", _endpoint),
    ("trtet_store.remote.errors", "ObjectNotFoundError",
     lambda e, c: [f"not found: {e}"]),
    ("trtet_store.remote.errors", "BucketNotFoundError", lambda e, c: [f"not found: {e}"]),
    ("trtet_store.remote.errors", "AccessDeniedError", lambda e, c: [f"access denied: {e}"]),
    ("trtet_store.io.errors", "InsufficientSpaceError", lambda e, c: [
        f"disk too small: {e.strerror}"]),  # it names the file, both sizes and a hint
    ("trtet_store.remote.errors", "FetchInterruptedError",
     lambda e, c: [f"interrupted: {e}"]),
    ("trtet_store.remote.errors", "FetchVerificationError", lambda e, c: [
        one_line(e)] + ([f"{c.out} and its .ptd files are unchanged"] if c.out else [])),
    # The engine cache's shared tier (issue 37). LeaseWaitTimeout is a TimeoutError, so an
    # OSError: it comes before the OSError row.
    ("trtet_store.cache.tier", "TierSignatureError", lambda e, c: [
        f"TierSignatureError: {e} (refused by the trusted keys; never served)"]),
    ("trtet_store.cache.tier", "TierEntryError", lambda e, c: [
        f"a damaged entry in the shared cache, never served: {e}; the next build replaces "
        "it"]),
    ("trtet_store.cache.tier", "LeaseWaitTimeout", lambda e, c: [
        f"gave up waiting for another machine's build: {e}"]),
    ("builtins", "OSError", lambda e, c: (_no_space(e, c) if getattr(e, "errno", None)
                                          == errno.ENOSPC else [one_line(e)])),
]


#: The rows a ``plain`` report still takes: what says how to go on.
PLAIN_ROWS = ("KeyboardInterrupt", "UploadKeptError")


def _table_class(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return cls if isinstance(cls, type) else None


def explain(exc: BaseException, command: str, *, out: os.PathLike | str | None = None,
            resume: str | None = None, plain: bool = False) -> list[str]:
    """The lines that say what failed and what to do (each printed after ``trtet-store CMD: ``).

    Parameters
    ----------
    exc : BaseException
        The error.
    command : str
        The subcommand (``fetch``, ``compile-and-save``, ...).
    out : path-like, optional
        The command's output, where it has one.
    resume : str, optional
        The command line that resumes an interrupted run (a kept upload's, and the one
        that gives it up).
    plain : bool
        ``Type: message`` but for :data:`PLAIN_ROWS`.

    Returns
    -------
    list of str
        One line, or a short explanation of a few.
    """
    ctx = ErrorContext(command, Path(out) if out is not None else None, resume)
    for module, name, lines in ERROR_TABLE:
        cls = None if plain and name not in PLAIN_ROWS else _table_class(module, name)
        if cls is not None and isinstance(exc, cls):
            return lines(exc, ctx)
    return [one_line(exc)]


def report_error(exc: BaseException, command: str, **context: Any) -> int:
    """Print :func:`explain`'s lines (``context``: its keywords) to stderr, each through
    :func:`fail`; return the exit code (130 interrupted, else 1)."""
    for line in explain(exc, command, **context):
        fail(command, line)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


# --- progress ---------------------------------------------------------------------------

#: Seconds between a bar's lines when stderr is not a terminal. Kept for callers
#: of :func:`bar_interval`; the bar itself draws only on a terminal.
LOG_INTERVAL = 5.0

#: A bar's width and the screen's rows on a terminal that reports no size
#: (``script``, a pty of 0x0); tqdm would draw nothing in 0 rows of 0 columns.
DEFAULT_WIDTH, DEFAULT_ROWS = 80, 24


def bar_interval(file: Any = None) -> float:
    """tqdm's ``mininterval`` for a bar written to ``file`` (default stderr)."""
    return 0.1 if _terminal_columns(sys.stderr if file is None else file) is not None \
        else LOG_INTERVAL


def _terminal_columns(file: Any) -> int | None:
    """The width ``file``'s terminal reports (0: none reported); None when it is no terminal."""
    try:
        if not file.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    try:
        return max(os.get_terminal_size(file.fileno()).columns, 0)
    except (AttributeError, ValueError, OSError):
        return 0


#: The phase of a :meth:`ProgressBar.waiting` line (no API phase is spelled so).
_WAIT = "\0wait"


class ProgressBar:
    """The CLI's one progress bar: tqdm (bytes) over an API's progress updates.

    Every progress shape the API has is accepted, so one class serves every
    command: an update object with ``.done`` and ``.total`` (publish, fetch,
    io's ``Progress``; with a ``.phase`` too, the benchmark's), ``(done,
    total)`` (the old write callback) and ``(phase, done, total)`` (the
    benchmark's old form). A phase gets a bar of its own, a new one when
    the phase changes. The bar is made at the first update, and only when
    stderr is a terminal (tqdm's own rule, ``disable=None``): a pipe or a log
    gets no bar lines. A terminal that reports no size (0x0: ``script``, a
    bare pty) gets a bar :data:`DEFAULT_WIDTH` wide, not blank lines.

    Parameters
    ----------
    desc : str
        The bar's label (the command); a phase given with an update replaces it.
    postfix : callable, optional
        ``postfix(update) -> str``, shown after the counts (only for update objects).
    enabled : bool
        False: every update is ignored (``--no-progress``, ``--json``).
    leave : bool
        Keep the finished bar on screen (False: erased when closed, as the
        benchmark's and the write's phases are).

    A context manager: the bar is closed on leaving, before any error or
    report is printed.
    """

    def __init__(self, desc: str = "", postfix: Callable[[Any], str] | None = None,
                 enabled: bool = True, *, leave: bool = True) -> None:
        self.desc = desc
        self.postfix = postfix
        self.enabled = enabled
        self.leave = leave
        self.bar: Any = None
        self._phase: str | None = None

    def __call__(self, update: Any, total: int | None = None, *more: int) -> None:
        """One update: ``(obj)``, ``(done, total)`` or ``(phase, done, total)``."""
        if not self.enabled:
            return
        # Three positional shapes, told apart by count: the callers predate one shape.
        phase: str | None = None
        obj: Any = None
        if more:
            phase, done, total = update, total, more[0]
        elif total is not None:
            done = update
        else:
            obj = update
            done, total = update.done, update.total
            phase = getattr(update, "phase", None)  # the benchmark's BenchProgress has one
        if (phase is not None and phase != self._phase) or self._phase == _WAIT:
            self.close()  # a new phase, or the end of a wait's line: a bar of its own
            self._phase = phase
        if self.bar is None:
            columns = _terminal_columns(sys.stderr)
            if columns is None:  # not a terminal: no bar at all, for every command alike
                return
            from tqdm import tqdm

            # A terminal that reports width 0 would get a bar of width 0 (blank lines):
            # a fixed width there; else tqdm follows the terminal's size.
            unsized = columns == 0
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=phase if phase is not None else self.desc, leave=self.leave,
                            file=sys.stderr, disable=None, dynamic_ncols=not unsized,
                            ncols=DEFAULT_WIDTH if unsized else None,
                            nrows=DEFAULT_ROWS if unsized else None, mininterval=0.1,
                            miniters=1)
        bar = self.bar
        if bar.total != total:
            bar.total = total  # a restarted fetch, a phase that learns its size late
        if obj is not None and self.postfix is not None:
            bar.set_postfix_str(self.postfix(obj), refresh=False)
        if done != bar.n:
            bar.update(done - bar.n)  # prints only once mininterval has passed

    def waiting(self, wait: Any) -> None:
        """A line for a wait on another machine's build (a ``LeaseWait`` of the tier).

        Redrawn at each look (the seconds waited, the holder), on a terminal
        only; erased when the wait is over. A warning logged meanwhile is
        written above it, as above a bar.
        """
        if not self.enabled:
            return
        if wait.over:
            if self._phase == _WAIT:
                self.close()
            return
        if self.bar is None or self._phase != _WAIT:
            self.close()
            columns = _terminal_columns(sys.stderr)
            if columns is None:
                return
            from tqdm import tqdm

            self._phase = _WAIT
            self.bar = tqdm(total=None, bar_format="{desc}", leave=False, file=sys.stderr,
                            disable=None, dynamic_ncols=columns != 0,
                            ncols=DEFAULT_WIDTH if columns == 0 else None)
        minutes, seconds = divmod(int(wait.waited), 60)
        self.bar.set_description_str(
            f"waiting {minutes}:{seconds:02d} for {wait.host} (pid {wait.pid}) to build "
            f"{wait.key}", refresh=True)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._phase = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
