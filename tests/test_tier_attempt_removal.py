"""An attempt's removal deletes its manifest before any of its objects.

A directory of the shared tier without its manifest is never taken for a complete
upload; one with its manifest but missing objects would be. So a removal cut short (a
dropped link, a server gone after the first delete) must leave the first kind, never the
second: the manifest goes first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtet_store.cache.tier import RemoteTier
from trtet_store.remote.errors import RemoteError
from trtet_store.remote.manifest import MANIFEST_SUFFIX

KEY = "k" * 32


def test_a_removal_cut_after_its_first_delete_leaves_no_manifest(s3env: Any,
                                                                 tmp_path: Path) -> None:
    tier = RemoteTier(f"s3://{s3env.bucket}/c", endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "j")
    files = []
    for name in ("a0", "e0", "z0"):  # objects that sort before and after the manifest
        src = tmp_path / name
        src.write_bytes(name.encode() * 5000)
        files.append((name, src))
    assert tier.publish(KEY, files, {"gpu": "sm_90"}).published
    entry = tier.lookup(KEY)
    assert entry is not None
    adir = f"{tier.prefix}{entry.attempt}"

    def listed() -> list[str]:
        got = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=adir)
        return sorted(o["Key"] for o in got.get("Contents", []))

    before = listed()
    assert any(k.endswith(MANIFEST_SUFFIX) for k in before), before
    deleted: list[str] = []
    delete = tier.s3.delete

    def cut_after_one(bucket: str, key: str, **kw: Any) -> Any:
        if deleted:
            raise RemoteError("the link dropped")
        deleted.append(key)
        return delete(bucket, key, **kw)

    tier.s3.delete = cut_after_one  # type: ignore[method-assign]
    tier.where.remove_attempt(adir)  # best effort: the cut is logged, not raised
    left = listed()
    assert len(deleted) == 1 and len(left) == len(before) - 1, (deleted, left)
    assert not any(k.endswith(MANIFEST_SUFFIX) for k in left), \
        f"a manifest is left whose objects are going: {left}"
