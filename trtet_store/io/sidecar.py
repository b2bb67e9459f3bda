"""A blob's sidecar: the JSON record ``<token>-<n>.blob.meta`` beside its file.

It holds the blob's size, its identity (device, inode, size, mtime, ctime as
sealed), its digests, who staged it and when, where an adopted file came
from, and a small user ``metadata`` dict (e.g. a build fingerprint). It is
what makes an orphan recognisable and adoptable without reading it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trtet_store.io import fs, names
from trtet_store.io.names import PART_SUFFIX

META_VERSION = 1


def write_meta(blob_path: os.PathLike | str, *, size: int, identity: Sequence[int],
               origin: str | None, metadata: Mapping[str, Any], chunk_size: int,
               digest: str | None, chunk_digests: Sequence[int] | None) -> None:
    """Write the sidecar of the blob at ``blob_path``, replacing any earlier one whole.

    Written to a ``.part`` file and renamed over the sidecar, so a reader
    never sees a torn record.

    Raises
    ------
    TypeError
        ``metadata`` is not JSON-serializable.
    """
    record = {
        "version": META_VERSION, "size": size, "identity": list(identity),
        "created": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
        "origin": origin, "metadata": metadata, "chunk_size": chunk_size,
        "digest": digest,
        "chunk_digests": list(chunk_digests) if chunk_digests is not None else None,
    }
    meta = names.meta_path_of(blob_path)
    part = meta + PART_SUFFIX
    try:
        text = json.dumps(record, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(f"blob metadata must be JSON-serializable: {exc}") from None
    # A new file, never one that is there (a link planted beside the blob is
    # not written through): a leftover .part of ours is removed and made anew.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = fs.calls.open(part, flags, 0o644)
    except FileExistsError:
        os.unlink(part)
        fd = fs.calls.open(part, flags, 0o644)
    try:
        try:
            fs.pwrite_all(fd, text.encode(), 0)
        finally:
            fs.calls.close(fd)
        fs.calls.rename(part, meta)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        raise


def read_meta(blob_path: os.PathLike | str) -> dict:
    """A blob's sidecar record, or {} when it is missing or unreadable."""
    try:
        raw = json.loads(Path(names.meta_path_of(blob_path)).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
