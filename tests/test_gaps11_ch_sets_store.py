"""sets/store.py ``ContentStore.holds``: a blob of another size than the set's is not held.

A store blob left shorter than the set says (a disk that filled, a crash mid-copy, a
truncation) is not "in the store": ``fetch_set`` downloads it again (its bytes counted)
and places the member's bytes, where taking it as held would have had the placement's
check refuse the whole member. Real SeaweedFS, a real ext4 (tmp_path).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sets_helpers import write, xxh

from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import ContentStore, fetch_set, publish_set


def test_fetch_set_downloads_again_a_store_blob_of_another_size(s3env: Any,
                                                                tmp_path: Path) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 70_000, 1)
    publish_set({"a": [pte]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    store = tmp_path / "store"
    first = fetch_set(url, tmp_path / "one", "a", endpoint_url=s3env.endpoint.url,
                      store=store, placements=["clone", "copy"])  # the store keeps the blob
    assert first.bytes_downloaded == 70_000
    blob = store / xxh(pte)
    assert ContentStore(store).holds(xxh(pte), 70_000)
    os.chmod(blob, 0o644)
    os.truncate(blob, 70_000 - 1)
    os.chmod(blob, 0o444)
    assert not ContentStore(store).holds(xxh(pte), 70_000)

    again = fetch_set(url, tmp_path / "two", "a", endpoint_url=s3env.endpoint.url,
                      store=store, placements=["clone", "copy"])
    assert again.bytes_downloaded == 70_000 and again.bytes_in_store == 0, again
    assert (tmp_path / "two" / "model.pte").read_bytes() == pte.read_bytes()
    assert blob.read_bytes() == pte.read_bytes()


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split(":")[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_fetch_set_link_keeps_the_blobs_sealed_and_reads_none_back(s3env: Any,
                                                                  tmp_path: Path) -> None:
    """``fetch_set(link=True)`` (sets/fetch.py ``_check_after``): our own hard link changes
    only the blob's ctime, so the store seals it again (``relink``) rather than reading the
    placed files back: after the fetch every blob is sealed, and neither that fetch nor
    the next member's (another directory, the same blobs) reads the blobs' bytes
    (this process's rchar stays far below their size)."""
    url = f"s3://{s3env.bucket}/rel/"
    big = 4 * 1024 * 1024 + 3
    pte = write(tmp_path / "src" / "model.pte", 9000, 1)
    ptd = write(tmp_path / "src" / "w.ptd", big, 2)
    publish_set({"a": [pte, ptd]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    store = tmp_path / "store"
    before = _rchar()
    fetch_set(url, tmp_path / "one", "a", endpoint_url=s3env.endpoint.url, store=store,
              link=True)
    first = _rchar() - before
    cas = ContentStore(store)
    assert cas.sealed(xxh(pte)) and cas.sealed(xxh(ptd)), "a linked blob lost its seal"
    before = _rchar()
    again = fetch_set(url, tmp_path / "two", "a", endpoint_url=s3env.endpoint.url,
                      store=store, link=True)
    second = _rchar() - before
    assert again.bytes_downloaded == 0
    assert first < big and second < big, (first, second)
    assert os.lstat(tmp_path / "two" / "w.ptd").st_ino == os.lstat(store / xxh(ptd)).st_ino


def test_fetch_set_with_the_store_on_another_filesystem_keeps_its_blobs(
        s3env: Any, tmp_path: Path, make_fs: Any) -> None:
    """``_may_move`` (sets/fetch.py): a blob is moved out of the store into place only on
    the destination's filesystem. A store on another filesystem (tmpfs here, the
    destination on ext4) keeps every blob it downloaded, whole and sealed, and the member
    is placed by copy; the next member finds them in the store (nothing downloaded)."""
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 9000, 1)
    ptd = write(tmp_path / "src" / "w.ptd", 70_000, 2)
    publish_set({"a": [pte, ptd]}, url, endpoint_url=s3env.endpoint.url,
                config=PublishConfig(journal_dir=s3env.journal_dir))
    store = make_fs("tmpfs", 80) / "store"
    assert os.stat(store.parent).st_dev != os.stat(tmp_path).st_dev
    first = fetch_set(url, tmp_path / "one", "a", endpoint_url=s3env.endpoint.url,
                      store=store)
    assert "move" not in first.placed, first.placed
    cas = ContentStore(store)
    for src in (pte, ptd):
        assert (store / xxh(src)).read_bytes() == src.read_bytes()
        assert cas.sealed(xxh(src))
        assert (tmp_path / "one" / src.name).read_bytes() == src.read_bytes()
    again = fetch_set(url, tmp_path / "two", "a", endpoint_url=s3env.endpoint.url,
                      store=store)
    assert again.bytes_downloaded == 0
