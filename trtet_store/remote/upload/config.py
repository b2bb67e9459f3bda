"""How a publish sends: :class:`PublishConfig`, and ``if_exists`` beside ``replace``.

``publish`` and ``publish_sources`` took the same keyword list; the sending
options now travel as one frozen object (s3transfer's ``TransferConfig``),
handed down unchanged. The old keywords still work for one release and build
the object (:func:`trtet_store.io.merge_options`). ``if_exists`` names what
``replace: bool`` meant (object_store's ``PutMode``); ``replace`` is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trtet_store.io import UNSET, merge_options

__all__ = ["DEFAULT_CONCURRENCY", "IF_EXISTS", "PublishConfig", "config_of", "replace_of"]

#: Parts in flight by default (s3transfer sends 10 at once); memory is (8 + 1) x part size.
DEFAULT_CONCURRENCY = 8

#: What ``if_exists`` may say: refuse a key that exists, or replace our own program.
IF_EXISTS = ("error", "replace")


@dataclass(frozen=True)
class PublishConfig:
    """How a publish sends its objects; accepted as ``config=`` by ``publish``.

    Parameters
    ----------
    part_size : int, optional
        Bytes per part (5 MiB to 5 GiB, all parts but the last equal).
        Default 8 MiB, grown to fit 10,000 parts.
    concurrency : int
        Parts in flight (default 8); memory is about
        ``(concurrency + 1) * part_size``.
    journal_dir : path-like, optional
        Where the resume journal lives (default
        ``$XDG_STATE_HOME/trtet_store/publish``).
    index : bool
        Use and update the bucket's engine-digest index
        (``.trtet-store/pieces/``), so an engine already published in another
        program is copied server-side (default True).
    """

    part_size: int | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    journal_dir: os.PathLike | str | None = None
    index: bool = True

    def __post_init__(self) -> None:
        # Refused here, before any journal or connection exists.
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"concurrency must be a positive int, not {c!r}")
        p = self.part_size
        if p is not None and (isinstance(p, bool) or not isinstance(p, int)):
            raise TypeError(f"part_size must be a number of bytes or None, not {p!r}")
        if not isinstance(self.index, bool):
            raise TypeError(f"index must be a bool, not {self.index!r}")


def config_of(config: PublishConfig | None, where: str, **keywords: Any) -> PublishConfig:
    """``config``, or one built from the old keywords (:data:`UNSET` when not given).

    Raises
    ------
    TypeError
        ``config`` is not a PublishConfig, or a keyword is given beside it
        with another value.
    """
    return merge_options(PublishConfig, config, where, "config", keywords)


def replace_of(replace: Any, if_exists: Any, where: str) -> bool:
    """Whether to replace an existing program, from ``replace`` and ``if_exists``.

    Parameters
    ----------
    replace : bool or UNSET
    if_exists : ``"error"``, ``"replace"`` or UNSET
    where : str
        The function's name, for the errors.

    Raises
    ------
    ValueError
        ``if_exists`` is not one of :data:`IF_EXISTS`.
    TypeError
        ``replace`` is not a bool, or both are given and disagree.
    """
    if replace is not UNSET and not isinstance(replace, bool):
        raise TypeError(f"{where}(): replace must be True or False, got {replace!r}")
    if if_exists is UNSET:
        return False if replace is UNSET else replace
    if not isinstance(if_exists, str) or if_exists not in IF_EXISTS:
        raise ValueError(f"{where}(): if_exists must be one of "
                         f"{', '.join(repr(c) for c in IF_EXISTS)}, got {if_exists!r}")
    wanted = if_exists == "replace"
    if replace is not UNSET and replace != wanted:
        raise TypeError(f"{where}(): replace={replace!r} and if_exists={if_exists!r} disagree; "
                        f"give only if_exists=")
    return wanted
