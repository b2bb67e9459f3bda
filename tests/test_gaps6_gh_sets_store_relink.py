"""``ContentStore.seal(relink=True)``: after our own hard link, the seal is renewed only
for a blob whose identity but its ctime is still the sealed one.

Our link changes the blob's ctime and nothing else, so the seal is taken again
unread. A blob written since it was sealed (its mtime, or its size, changed)
is not: the old seal stays, no longer matches, and the blob is read again at
its next use (``check`` refuses it if its bytes are not the set's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash

from trtet_store.sets.store import ContentStore

DATA = b"B" * (2 * 4096 + 3)


def _store(tmp_path: Path) -> tuple[ContentStore, str]:
    cas = ContentStore(tmp_path / "store")
    digest = xxhash.xxh3_128(DATA).hexdigest()
    cas.path(digest).write_bytes(DATA)
    os.chmod(cas.path(digest), 0o444)
    cas.seal(digest)
    return cas, digest


def test_our_own_link_renews_the_seal_unread(tmp_path: Path) -> None:
    cas, digest = _store(tmp_path)
    os.link(cas.path(digest), tmp_path / "placed.ptd")  # changes the blob's ctime only
    assert not cas.sealed(digest)
    cas.seal(digest, relink=True)
    assert cas.sealed(digest)


def test_a_blob_written_since_its_seal_is_not_sealed_again_by_a_relink(tmp_path: Path) -> None:
    cas, digest = _store(tmp_path)
    old = cas.seal_path(digest).read_bytes()
    path = cas.path(digest)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:  # another writer: other bytes, a new mtime
        f.seek(4096)
        f.write(b"Z")
    os.chmod(path, 0o444)
    st = os.lstat(path)  # its mtime surely another than the sealed (a coarse clock may not tick)
    os.utime(path, ns=(st.st_atime_ns, json.loads(old)["identity"][3] + 10**9))
    os.link(path, tmp_path / "placed.ptd")
    cas.seal(digest, relink=True)
    assert not cas.sealed(digest)
    assert cas.seal_path(digest).read_bytes() == old  # the old seal left as it was
    assert json.loads(old)["identity"][3] != os.lstat(path).st_mtime_ns
