"""The cache directory: where each file of an entry lives, and whose files we accept.

::

    <directory>/            mode 0700, the user's own (checked in directory.py)
      CACHEDIR.TAG          the marker: the tagging spec's signature + our format version
      lock                  the cache-wide flock (commits, evictions, recovery)
      summary               what the bound needs (each key's blob, size, last use): a snapshot
                            line, then one line per change; trusted only while keys/'s mtime is
                            the marker its last line set, else rebuilt from the records
                            (cache/summary.py)
      keys/<key>.json       an entry's record: key, blob name, size, metadata, created
      keys/<key>.use        its use stamp: mtime = last use, one byte per hit
      blobs/<name>          the bytes, content addressed (<xxh3-128 hex>-<size>)
      blobs/<name>.json     the blob's seal: size, identity, digest, chunk digests
      flights/<key>.lock    single-flight locks (one builder per key)
      tmp/                  files being written, each flocked by its writer

    The two-level policy's (cache/tiered.py), beside them:
      downloads/<key>/      a shared entry being downloaded (resumable), then linked in; a cut
                            one is kept for the next hit to resume (stats counts it; clear,
                            prune and recover remove it once no fetch holds its lock:
                            cache/downloads.py)
      remote-pending/<key>  a build cached here and not yet in the shared tier
      remote-origin         this cache's id in the shared tier (random hex, made once)
      remote-journal/       publish journals (a killed publish resumes from its journal)

Nothing here knows what a key means: the caller hands a hex digest.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

SUBDIRS = ("keys", "blobs", "flights", "tmp")

#: <cache>/summary: the used bytes and last-use order the bound needs (cache/summary.py).
SUMMARY = "summary"

#: Shared entries are downloaded into <cache>/downloads/<key>/ (resumable), then cached.
DOWNLOADS = "downloads"
#: <cache>/remote-pending/<key>: a build cached here and not yet in the shared tier
#: (the publish was cut or the server was down); the next hit of the key publishes it.
PENDING = "remote-pending"
#: In the cache directory: this machine's id in the shared tier (random hex, made once).
ORIGIN_FILE = "remote-origin"
#: Publish journals (a killed publish resumes from its journal).
REMOTE_JOURNAL = "remote-journal"


def owned_by_cache(directory: Path, path: os.PathLike | str) -> bool:
    """Whether ``path`` is one of the cache's own files (under one of :data:`SUBDIRS`).

    Other directories inside the cache directory are its callers' (the engine
    cache downloads remote entries into ``downloads/``, on the cache's
    filesystem so that a put can link them in): the cache never removes or
    consumes its own files on a caller's say, and leaves those alone.
    """
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(directory / sub) + os.sep) for sub in SUBDIRS)

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_key(key: object) -> str:
    """``key`` if it can name files (letters, digits, ``._-``, at most 200), else ValueError.

    Keys are file names in ``keys/`` and ``flights/``: a key from data must never
    leave the directory (``../x``) or collide with an internal suffix.
    """
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(
            f"cache key {key!r} is not a plain name: use 1-200 letters, digits, '.', '_' or "
            "'-' starting with a letter or digit (e.g. a hex digest)")
    return key


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/trtet_store/engines``, else ``~/.cache/trtet_store/engines``.

    Per user (never a shared temporary directory, unlike Torch-TensorRT's
    ``<tmp>/torch_tensorrt_engine_cache``): another user must not be able to
    plant or read engines.
    """
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec ignores relative values
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "trtet_store", "engines")


def refuse_foreign(path: Path, st: os.stat_result, what: str) -> None:
    """PermissionError unless ``st`` (of ``path``) is owned by this process's user.

    The cache serves bytes that end up executed on a GPU: a file another user
    owns could have been planted, so it is refused, never served or removed.
    """
    uid = os.geteuid()
    if st.st_uid != uid:
        raise PermissionError(
            errno.EACCES,
            f"refusing the engine cache {what} {path}: it is owned by uid {st.st_uid}, not by "
            f"you (uid {uid}); use a cache directory of your own (remove this one, or pass "
            "directory=)", os.fspath(path))


def blob_name(digest: str, size: int) -> str:
    """A blob's file name: its content digest and size (identical bytes, one file)."""
    return f"{digest}-{size}"


def is_blob_name(name: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{32}-[0-9]+", name) is not None
