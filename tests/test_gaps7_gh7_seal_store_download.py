"""ContentStore.download (sets/store.py): a blob downloaded into the store is read-only
(0444: never written again, and a hard link to it is 0444 too), sealed as the file just
checked, its sha256 kept in the seal when asked for (a signed set's), not otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from sets_helpers import write

from trtet_store.remote.download.options import FetchConfig
from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set
from trtet_store.sets.fetch import read_set
from trtet_store.sets.manifest import blob_key
from trtet_store.sets.store import ContentStore


def test_a_downloaded_blob_is_read_only_and_sealed(s3env: Any, tmp_path: Path) -> None:
    src = write(tmp_path / "a" / "model.pte", 70_000, 5)
    publish_set({"a": [src]}, f"s3://{s3env.bucket}/rel/", endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    s3 = S3(client=s3env.client)
    manifest, _ = read_set(s3, s3env.bucket, "rel/")
    [(digest, blob)] = manifest.blobs.items()
    for sha, store in ((True, "signed"), (False, "plain")):
        cas = ContentStore(tmp_path / store)
        got = cas.download(s3, s3env.bucket, blob_key("rel/", digest), digest, blob.size,
                           blob.crc64nvme, config=FetchConfig(concurrency=2, range_size=1 << 20),
                           sha256=sha)
        assert got == blob.size
        st = os.lstat(cas.path(digest))
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_uid == os.geteuid()
        assert cas.path(digest).read_bytes() == src.read_bytes()
        assert cas.sealed(digest)
        seal = json.loads(cas.seal_path(digest).read_bytes())
        want = hashlib.sha256(src.read_bytes()).hexdigest() if sha else None
        assert seal.get("sha256") == want
