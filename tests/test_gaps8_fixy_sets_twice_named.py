"""fetch-set on ext4 where a member names one blob twice (sets/fetch.py ``_moves``).

On ext4 (no reflink, the store on the destination's filesystem) a blob the
fetch just downloaded is moved into place (through the store's
``.trtet-moving``, ``MOVING_DIR``) instead of copied. A member whose two
``.ptd`` names hold the same bytes (one blob) must not have that blob moved
for both names: it is placed by copy (the store keeps it), both names get
the bytes, two separate files, and the store still holds the sealed blob
(0444). Real SeaweedFS, a real ext4 loop mount.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sets_helpers import write, xxh

from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import fetch_set, publish_set, verify_member
from trtet_store.sets.store import MOVING_DIR, STORE_DIR


def test_a_blob_named_twice_by_a_member_is_not_moved_for_both_names(
        s3env: Any, make_fs: Any, tmp_path: Path) -> None:
    mnt = make_fs("ext4", 64)
    src = tmp_path / "src"
    pte = write(src / "model.pte", 70_000, 1)
    a = write(src / "a.ptd", 300_000, 2)
    b = src / "b.ptd"
    b.write_bytes(a.read_bytes())  # the same bytes under another name: one blob
    url = f"s3://{s3env.bucket}/rel/"
    publish_set({"m": [pte, a, b]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    out = mnt / "out"
    rep = fetch_set(url, out, "m", endpoint_url=s3env.endpoint.url)
    for name, want in (("model.pte", pte), ("a.ptd", a), ("b.ptd", b)):
        assert (out / name).read_bytes() == want.read_bytes(), name
    assert os.lstat(out / "a.ptd").st_ino != os.lstat(out / "b.ptd").st_ino
    store = mnt / STORE_DIR
    blob = store / xxh(a)
    st = os.lstat(blob)
    assert stat.S_IMODE(st.st_mode) == 0o444 and blob.read_bytes() == a.read_bytes(), \
        "the blob named twice left the store"
    assert not list((store / MOVING_DIR).iterdir()) if (store / MOVING_DIR).exists() else True
    assert rep.bytes_downloaded == 70_000 + 300_000
    assert verify_member(out).ok
