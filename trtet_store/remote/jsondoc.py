"""Small JSON documents read from a bucket: a size cap before the body, a depth cap before parsing.

Manifests, pointers, records and leases come from a bucket that others can
write. Each is read with a cap fit for what it is (the object's size is
checked before its body is read: :meth:`trtet_store.remote.s3.S3.get_dated`)
and parsed here, where nesting deeper than :data:`MAX_DEPTH` is refused
before :func:`json.loads` sees it (its C parser recurses and raises
``RecursionError`` a few thousand levels down). Every caller turns the
``ValueError`` into its own refusal (``ManifestError``, a damaged entry).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from trtet_store.io import MiB

__all__ = ["LEASE_MAX_BYTES", "Dated", "MANIFEST_MAX_BYTES", "MAX_DEPTH", "POINTER_MAX_BYTES",
           "loads"]

#: Deepest nesting of arrays and objects read: ours nest 6 at most (a manifest's
#: chunk digests); a caller's metadata gets the rest.
MAX_DEPTH = 64
#: A manifest: per object ~20 bytes per MiB chunk digest and ~200 per part (S3's
#: at most 10,000 parts), so 16 MiB holds the manifest of a program of several
#: hundred GiB; a 200 MB "manifest" is refused before a byte of it is read.
MANIFEST_MAX_BYTES = 16 * MiB
#: A tier pointer: a few files' names, sizes and digests and the caller's metadata
#: (an engine cache's record fields, a signature): a few KiB; 256 KiB leaves room.
POINTER_MAX_BYTES = MiB // 4
#: A build lease: holder, host, pid, three numbers (about 200 bytes).
LEASE_MAX_BYTES = 4096

# A JSON string (escapes included): its brackets are not structure.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")


def depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in ``data`` (strings skipped)."""
    structure = _STRING.sub(b"", data).translate(None, _BRACKETS)
    if not structure:
        return 0
    return max(itertools.accumulate(1 if c in b"[{" else -1 for c in structure))


def loads(data: bytes | str, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing nesting deeper than ``max_depth`` before parsing.

    Parameters
    ----------
    data : bytes or str
        The document (UTF-8).
    what : str
        What it is, for the message ("the manifest", "the pointer").
    max_depth : int
        The deepest nesting of arrays and objects allowed.

    Raises
    ------
    ValueError
        Not UTF-8, not JSON, or nested deeper than ``max_depth``: one line
        that says which (never ``RecursionError``).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    deepest = depth(raw)
    if deepest > max_depth:
        raise ValueError(f"{what} nests arrays or objects {deepest} deep; at most {max_depth} "
                         "is read")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # not reached after the depth check; never let it out
        raise ValueError(f"{what} nests too deep to read") from None


@dataclass(frozen=True)
class Dated:
    """A small object as :meth:`S3.get_dated` read it.

    ``data`` is None when the object was over the caller's limit (not read).
    ``modified`` (its Last-Modified) and ``server_now`` (the answer's Date)
    are both the server's clock, in seconds since the epoch, or None.
    """

    data: bytes | None
    etag: str
    size: int
    modified: float | None
    server_now: float | None

    @property
    def age(self) -> float | None:
        """Seconds since it was last written, on the server's clock (None: unknown)."""
        if self.modified is None or self.server_now is None:
            return None
        return self.server_now - self.modified
