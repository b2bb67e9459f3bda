"""The write options as one object, and the one progress shape.

:class:`WriteOptions` carries the keywords that every writer shares
(:func:`~trtet_store.io.writer.write_files`, ``export.save*``, ``formats.*``),
so that each entry point takes one ``options=`` and hands it down unchanged
instead of repeating five keywords (the model is s3transfer's
``TransferConfig`` and object_store's ``PutOptions``). The old keywords still
work for one release: :func:`resolve` builds the object from them.

A progress callback receives one :class:`Progress` (``.done``, ``.total``),
the shape the remote side's ``PublishProgress`` and ``FetchProgress`` already
have. The old ``progress(done, total)`` form is still called that way for one
release; :func:`progress_caller` decides which, once per write.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from trtet_store.io.units import MiB

__all__ = ["DEFAULT_CHUNK_SIZE", "UNSET", "AutoChunk", "Progress", "ProgressCallback",
           "WriteOptions", "merge_options", "progress_caller", "resolve"]


# A move's peak-disk budget (two steps of half this; see transfer.move_step)
# and a copy's step. One fdatasync per 32 MiB step instead of two per 8 MiB
# cut a third off a durable 1 GiB move (benchmarks/README.md); 64 MiB is
# small next to any disk that holds an engine.
DEFAULT_CHUNK_SIZE = 64 * MiB


@dataclass(frozen=True)
class AutoChunk:
    """``chunk_size`` that fits the free space: at most ``limit``, halved until the write fits.

    A move's steps are a third of the budget, so a smaller budget only means
    more syncs: on the plain disk measured, 64 MiB moved 2 GiB at 1.33x the
    floor and 192 MiB at 1.40x (benchmarks/README.md), so the budget never
    grows past ``limit`` and shrinks only where the disk is nearly full.

    Parameters
    ----------
    limit : int
        The largest budget (default 64 MiB, the fixed default).
    minimum : int
        The smallest: below three digest chunks a step cannot shrink.
    """

    limit: int = DEFAULT_CHUNK_SIZE
    minimum: int = 3 * MiB

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.limit:
            raise ValueError(f"AutoChunk needs 0 < minimum <= limit, got {self.minimum}, "
                             f"{self.limit}")



class Progress(NamedTuple):
    """What a progress callback receives: payload bytes written so far, of ``total``."""

    done: int
    total: int


#: ``progress(update)`` with a :class:`Progress`; the old ``progress(done, total)``
#: is still accepted (see :func:`progress_caller`).
ProgressCallback = Callable[[Progress], Any] | Callable[[int, int], Any]


class _Unset:
    """The default of an old option keyword: tells "not given" from a given default."""

    def __repr__(self) -> str:
        return "<default>"


_T = TypeVar("_T")

#: Default of the old option keywords in signatures; typed Any so that the
#: keywords keep their own types.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class WriteOptions:
    """How a write places its bytes; accepted as ``options=`` by every writer.

    Parameters
    ----------
    consume : bool
        Allow moving :class:`~trtet_store.io.Blob` pieces into the output
        (they are used up) when they share its filesystem. Default False:
        every source is left as it was.
    chunk_size : int, "auto" or AutoChunk, optional
        The most extra disk a move may use, and a copy's largest window
        (default 64 MiB); ``"auto"`` shrinks it until the write fits.
    progress : callable, optional
        Called with a :class:`Progress` (``.done``, ``.total`` payload bytes)
        as bytes land. A callable that needs two positional arguments is
        called the old way, ``progress(done, total)`` (kept for one release;
        see :func:`progress_caller`).
    placements : collection of str or str, optional
        Limit the ladder (``clone``, ``insert``, ``move``, ``copy``); default
        every placement the filesystem allows.
    timeout : float, optional
        Seconds to wait for another write of the same destination; default
        refuse at once with :class:`~trtet_store.io.ConcurrentWriteError`.
    """

    consume: bool = False
    chunk_size: int | str | AutoChunk | None = None
    progress: ProgressCallback | None = None
    placements: Collection[str] | str | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        # Type errors here, at the call, rather than deep inside a transaction.
        if not isinstance(self.consume, bool):
            raise TypeError(f"WriteOptions.consume must be a bool, got {self.consume!r}")
        if self.progress is not None and not callable(self.progress):
            raise TypeError(f"WriteOptions.progress must be callable, got {self.progress!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool)
                                         or not isinstance(self.timeout, (int, float))):
            raise TypeError(f"WriteOptions.timeout must be a number of seconds or None, "
                            f"got {self.timeout!r}")


def resolve(options: WriteOptions | None, where: str, **keywords: Any) -> WriteOptions:
    """The options of a call: ``options``, with the old keywords given beside it.

    Parameters
    ----------
    options : WriteOptions, optional
        What the caller passed as ``options=``.
    where : str
        The function's name, for the errors.
    **keywords
        The old option keywords as the caller gave them; :data:`UNSET` for
        those not given.

    Raises
    ------
    TypeError
        ``options`` is not a WriteOptions, or a keyword is given with a value
        other than ``options``'s (which one wins would be a guess).
    """
    return merge_options(WriteOptions, options, where, "options", keywords)


def merge_options(cls: type[_T], given_object: _T | None, where: str, argument: str,
          keywords: dict[str, Any]) -> _T:
    """``given_object`` (an instance of the frozen dataclass ``cls``), or one made of ``keywords``.

    The shim behind every ``options=`` / ``config=`` that replaced a keyword
    list: keywords left at :data:`UNSET` were not given; one given with the
    value ``given_object`` already has is accepted, one with another value
    is a ``TypeError`` (neither silently wins).

    Parameters
    ----------
    cls : type
        The frozen dataclass.
    given_object : cls, optional
        What the caller passed as ``argument``.
    where, argument : str
        The function's and the argument's names, for the errors.
    keywords : dict
        The old keywords, each a field of ``cls``, or :data:`UNSET`.
    """
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(keywords) - fields
    if unknown:  # a caller bug in this package, not the user's
        raise TypeError(f"{where}() got unexpected keyword argument(s) {sorted(unknown)}")
    given = {k: v for k, v in keywords.items() if v is not UNSET}
    if given_object is None:
        return cls(**given)
    if not isinstance(given_object, cls):
        raise TypeError(f"{where}(): {argument} must be a {cls.__module__}.{cls.__qualname__}, "
                        f"got {type(given_object).__name__}")
    clash = sorted(k for k, v in given.items() if v != getattr(given_object, k))
    if clash:
        raise TypeError(f"{where}(): {', '.join(clash)} given both as keyword "
                        f"({', '.join(f'{k}={given[k]!r}' for k in clash)}) and in {argument} "
                        f"({', '.join(f'{k}={getattr(given_object, k)!r}' for k in clash)}); "
                        f"give each once, preferably in {argument}=")
    return given_object


def progress_caller(callback: ProgressCallback | None) -> Callable[[int, int], None] | None:
    """A function ``(done, total)`` that calls ``callback`` in the shape it takes.

    Decided once, from the callback's signature: one that needs two
    positional arguments (``def cb(done, total)``, the old form, kept for one
    release) is called ``callback(done, total)``; one that can be called with
    one argument gets one :class:`Progress` (``lambda update: ...``, and also
    ``def cb(update, log=log)`` or ``def cb(*args)``: one argument is what a
    callback is given from now on). A callable whose signature cannot be
    read (some builtins) is called the old way, as before this shape.
    """
    if callback is None:
        return None
    try:
        signature = inspect.signature(callback)
    except (ValueError, TypeError):  # no signature to read: the old way, as before
        return callback  # type: ignore[return-value]
    try:
        signature.bind(0)
    except TypeError:  # needs more than one argument: the old (done, total)
        return callback  # type: ignore[return-value]
    return lambda done, total: callback(Progress(done, total))  # type: ignore[call-arg]
