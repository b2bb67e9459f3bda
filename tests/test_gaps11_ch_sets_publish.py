"""publish_set (sets/publish.py): promises of the digest pass and the commit no other test sets up.

- ``_read``: each local file piece is planned again with the chunk digests taken in the
  digest pass, so a file rewritten between that pass and its upload (same size, its mtime
  put back) is refused by the upload (``SourceChangedError``): never published under a blob
  name that is not its digest, and no set manifest committed.

Real SeaweedFS; the rewrite happens at the seam between the two steps (``_send_blobs``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write, xxh

import trtet_store.sets.publish as publish_mod
from trtet_store.io import SourceChangedError
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import publish_set


def _keys(s3: Any) -> list[str]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket)
    return sorted(o["Key"] for o in got.get("Contents", []))


@pytest.mark.parametrize("size", [70_000, 6 * 1024 * 1024 + 5])
def test_publish_set_refuses_a_file_rewritten_after_its_digest_pass(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    pte = write(tmp_path / "src" / "model.pte", size, 1)
    digest = xxh(pte)
    st = os.stat(pte)
    real = publish_mod._send_blobs

    def rewrite_then_send(*args: Any, **kwargs: Any) -> Any:
        # Same size, other bytes in the last chunk, the mtime put back: a rewrite the
        # digest pass cannot have seen.
        with open(pte, "r+b") as f:
            f.seek(size - 3)
            f.write(b"XYZ")
        os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_mod, "_send_blobs", rewrite_then_send)
    url = f"s3://{s3env.bucket}/rel/"
    with pytest.raises(SourceChangedError):
        publish_set({"m": [pte]}, url, endpoint_url=s3env.endpoint.url,
                    config=PublishConfig(journal_dir=s3env.journal_dir))
    keys = _keys(s3env)
    assert "rel/trtet-set.json" not in keys, keys
    assert f"rel/blobs/{digest}" not in keys, \
        f"the rewritten bytes were published under the digest of the old ones: {keys}"
