"""A remote hit that did not happen: what the user is told, and when not to build at all.

:func:`trtet_store.export.engine_build.build_cached` downloads a shared
entry before it would build. When that download fails, this module says
what failed and what happens next (never the fetch's own resume command:
the engine cache resumes it by itself), and refuses the build when the
disk cannot hold the engines the entry's pointer says the build makes: a
build of hours that fails when it is saved helps no one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtet_store.io.units import MiB, format_mib

if TYPE_CHECKING:
    from trtet_store.cache.tier import RemoteEntry

__all__ = ["download_failed", "refuse_build_without_room"]

#: What a save needs beyond the engines: the program's headers and the writer's slack
#: (as :func:`~trtet_store.export.engine_build.save_reserve` counts it).
_SAVE_SLACK = 2 * MiB


def download_failed(key: str, exc: BaseException, seen: Any, directory: Path) -> str:
    """One line: the shared cache's download of ``key`` failed, why, and what happens next.

    ``seen`` is the download's last progress (``.done``, ``.total``), as the
    two-level cache (:mod:`trtet_store.cache.tiered`) keeps it.
    """
    from trtet_store.cache.tier.health import download_failed as cause

    kept = bool(seen.done) and directory.is_dir() and any(directory.rglob("*"))
    return (f"the shared cache's download of {key} failed ({cause(exc, seen.done, seen.total)}); "
            "building locally; " + (f"the partial download is kept in {directory} and resumed "
                                    "next time" if kept else "nothing was kept"))


def refuse_build_without_room(key: str, entry: RemoteEntry, staging: Path,
                              refused: BaseException) -> None:
    """Raise :class:`~trtet_store.io.InsufficientSpaceError` when ``entry``'s build cannot fit.

    ``entry`` is the shared tier's entry of the key about to be built (its
    download was just refused for space: ``refused``); its pointer says what
    the build's engines and record take. A build stages them in ``staging``
    and the save needs a little more; when that much is not free there, the
    build would only fail after it ran.
    """
    from trtet_store.io import InsufficientSpaceError
    from trtet_store.io.fs import free_bytes

    needed = sum(int(f["size"]) for f in entry.files) + _SAVE_SLACK
    try:
        available = free_bytes(staging)
    except OSError:
        return  # unknown: the build's own preflight decides
    if needed <= available:
        return
    download = getattr(refused, "needed", None)
    raise InsufficientSpaceError(
        needed, available, os.fspath(staging),
        hint=f"the shared cache's entry {key} says its build takes "
        f"{format_mib(needed - _SAVE_SLACK)}; its download"
        + (f" ({format_mib(download)})" if download else "") + " was refused too; nothing "
        "was built") from refused
