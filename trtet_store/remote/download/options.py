"""A fetch's options: :class:`FetchConfig`, their defaults and bounds, the check that
refuses bad ones, and the command that continues a fetch with every option it had.

The CLI, the shared tier and :func:`~trtet_store.remote.download.receive.fetch`
check options here, before anything is read, created or sent.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtet_store.io import GiB, MiB
from trtet_store.remote.url import RemoteURL

DEFAULT_RANGE_SIZE = 32 * MiB
DEFAULT_CONCURRENCY = 4
#: The bounds :func:`check_options` holds ``range_size`` and ``concurrency`` to: a
#: range is at least one manifest chunk (ranges end on chunk boundaries, and a
#: smaller one would be one GET per few KiB), and memory is ``(concurrency + 2)
#: x range_size``, so neither may be so large that the buffers cannot be had.
MIN_RANGE_SIZE = MiB
MAX_RANGE_SIZE = GiB
MAX_CONCURRENCY = 256


def _whole(name: str, value: object, low: int, high: int | None = None,
           unit: str = "") -> None:
    # bool is an int to Python, but concurrency=True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if value < low or (high is not None and value > high):
        span = f"at least {low}{unit}" if high is None else f"{low}{unit} to {high}{unit}"
        raise ValueError(f"{name} must be {span}, not {value}{unit}")


def check_options(*, concurrency: int = DEFAULT_CONCURRENCY,
                  range_size: int = DEFAULT_RANGE_SIZE, attempts: int = 5,
                  max_restarts: int = 3, wait_replaced: float = 30.0) -> None:
    """Refuse bad fetch options before anything is read, created or sent.

    The CLI calls it too, so a bad flag is one line, not a traceback from
    deep inside botocore or a buffer allocation.

    Raises
    ------
    TypeError
        A count that is not an ``int`` (``True`` and ``1.5`` included).
    ValueError
        ``concurrency`` or ``attempts`` below 1 (or ``concurrency`` above
        :data:`MAX_CONCURRENCY`), ``range_size`` outside
        :data:`MIN_RANGE_SIZE` to :data:`MAX_RANGE_SIZE` (memory is
        ``(concurrency + 2) x range_size``), a negative ``max_restarts`` or
        ``wait_replaced``.
    """
    _whole("concurrency", concurrency, 1, MAX_CONCURRENCY)
    if isinstance(range_size, bool) or not isinstance(range_size, int):
        raise TypeError(f"range_size must be an int (bytes), not {type(range_size).__name__} "
                        f"({range_size!r})")
    if not MIN_RANGE_SIZE <= range_size <= MAX_RANGE_SIZE:
        raise ValueError(f"range_size must be {MIN_RANGE_SIZE >> 20} MiB to "
                         f"{MAX_RANGE_SIZE >> 20} MiB ({MIN_RANGE_SIZE} to {MAX_RANGE_SIZE} "
                         f"bytes), not {range_size} bytes")
    _whole("attempts", attempts, 1)
    _whole("max_restarts", max_restarts, 0)
    if isinstance(wait_replaced, bool) or not isinstance(wait_replaced, (int, float)):
        raise TypeError(f"wait_replaced must be a number of seconds, not "
                        f"{type(wait_replaced).__name__} ({wait_replaced!r})")
    if not wait_replaced >= 0:  # NaN too
        raise ValueError(f"wait_replaced must be at least 0 seconds, not {wait_replaced}")


@dataclass(frozen=True)
class FetchConfig:
    """How a fetch brings bytes down; ``config=`` of ``fetch`` and ``fetch_set``.

    The fetch-side twin of :class:`~trtet_store.PublishConfig`. The old
    keywords of the same names still work; one given beside ``config`` with
    another value is a ``TypeError``.

    Parameters
    ----------
    concurrency : int
        Ranged GETs in flight, 1 to 256. Memory is bounded by
        ``(concurrency + 2) x range_size``.
    range_size : int
        Bytes per GET, 1 MiB to 1 GiB (ranges end on the manifest's 1 MiB chunk
        boundaries). A resume may use another range size than the fetch it
        continues: staged bytes are kept by what they cover.
    attempts : int
        Tries per range (network errors, bytes that fail their digests).

    Raises
    ------
    TypeError, ValueError
        A bad value (:func:`check_options`), when it is made.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    range_size: int = DEFAULT_RANGE_SIZE
    attempts: int = 5

    def __post_init__(self) -> None:
        check_options(concurrency=self.concurrency, range_size=self.range_size,
                      attempts=self.attempts)


def resume_command(url: str, dest: os.PathLike | str, *,
                   reuse: Sequence[os.PathLike | str] = (), endpoint_url: str | None = None,
                   concurrency: int = DEFAULT_CONCURRENCY,
                   range_size: int = DEFAULT_RANGE_SIZE, if_replaced: str = "restart",
                   trusted_keys: Sequence[os.PathLike | str] = (), **flags: bool) -> str:
    """The ``trtet-store fetch`` command that continues a fetch, with every option it had.

    Options at their defaults are left out; every other one is repeated, so
    the command reaches the same endpoint and plans the same ranges (a resume
    with other ranges keeps what is staged anyway, but costs a re-read).
    ``flags`` are boolean options by their API name (``replace_needed=True``
    becomes ``--replace-needed``), written when true.
    """
    words = ["trtet-store", "fetch", url, os.fspath(dest)]
    for r in reuse:
        words += ["--reuse", os.fspath(r)]
    if endpoint_url:
        words += ["--endpoint-url", endpoint_url]
    if concurrency != DEFAULT_CONCURRENCY:
        words += ["--concurrency", str(concurrency)]
    if range_size != DEFAULT_RANGE_SIZE:
        words += ["--range-size", str(range_size)]
    if if_replaced != "restart":
        words += ["--if-replaced", if_replaced]
    for k in trusted_keys:  # given ones; the environment's apply again by themselves
        words += ["--trusted-key", os.fspath(k)]
    words += [f"--{name.replace('_', '-')}" for name, on in flags.items() if on]
    return shlex.join(words)


def client_endpoint(client: Any) -> str | None:
    """A given client's endpoint, for the resume command (AWS's own needs no flag)."""
    url = getattr(getattr(client, "meta", None), "endpoint_url", None)
    if not isinstance(url, str) or ".amazonaws.com" in url:
        return None
    return url


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; anything else is a ``RemoteURLError``."""
    parsed = RemoteURL.parse(url)
    return parsed.bucket, parsed.key
