"""An orphan changed since its digests were recorded is adopted without them.

A kept blob outlives its store with its digests in a sidecar, so a later store adopts it
without reading it. Written in place since (same size: only its mtime tells), its recorded
digests are not its bytes': adopting it must not carry them over; the digests are taken
from the bytes when first needed, so a placement never publishes stale ones.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from digests import digest

from trtet_store.io import BlobStore


def test_an_orphan_written_in_place_is_adopted_with_its_own_bytes_digests(here_fs: Path) -> None:
    first = random.Random(3).randbytes(3 * 1024 * 1024 + 7)
    with BlobStore(here_fs) as store:
        kept = store.put(first)
        assert kept.has_digests and kept.digest == digest(first)
        kept.keep()
        path = Path(kept.path)
    then = os.stat(path)
    later = bytearray(first)
    later[1024 * 1024:1024 * 1024 + 4096] = b"\xee" * 4096  # same size, other bytes
    with open(path, "r+b") as f:
        f.seek(1024 * 1024)
        f.write(later[1024 * 1024:1024 * 1024 + 4096])
    os.utime(path, ns=(then.st_atime_ns, then.st_mtime_ns + 1_000_000))  # a writer's mtime
    with BlobStore(here_fs) as store:
        (orphan,) = store.orphans()
        blob = store.adopt_orphan(orphan)
        assert not blob.has_digests, "the sidecar's digests were carried to changed bytes"
        assert blob.digest == digest(bytes(later))
        blob.close()
