"""io/blobstore.py BlobStore.adopt_orphan: a sidecar with an identity but no chunk digests.

``if sealed and same_identity(sealed, st, relink=True) and meta.get("chunk_digests")``:
an orphan kept before its digests were taken (its sidecar records its identity, and
``chunk_digests: null``) is adopted unread and without digests, which are taken from its
bytes when first needed; never a crash on the missing list.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from digests import digest

from trtet_store.io import BlobStore
from trtet_store.io.digests import file_identity
from trtet_store.io.sidecar import read_meta, write_meta


def test_an_orphan_whose_sidecar_has_no_chunk_digests_is_adopted_without_them(
        here_fs: Path) -> None:
    data = random.Random(5).randbytes(1024 * 1024 + 3)
    with BlobStore(here_fs) as store:
        kept = store.put(data)
        kept.keep()
        path = Path(kept.path)
    meta = read_meta(path)
    write_meta(path, size=len(data), identity=file_identity(os.stat(path)),
               origin=meta.get("origin"), metadata=meta.get("metadata") or {},
               chunk_size=meta["chunk_size"], digest=None, chunk_digests=None)
    with BlobStore(here_fs) as store:
        (orphan,) = store.orphans()
        blob = store.adopt_orphan(orphan)
        assert not blob.has_digests
        assert blob.digest == digest(data)
        blob.close()
