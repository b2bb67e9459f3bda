"""A signing publish of the shared tier (``trtet_store.cache.tier.store.RemoteTier.publish``,
its ``_name_by_sha256``) of a file handed over with an xxh3-128 that is not its bytes' (the
file changed after the caller digested it): the upload's own pass reads other bytes, so the
sha256 it took is not of the bytes the pointer names. Refused (the source changed), no
pointer written, nothing signed.

On the real SeaweedFS fixture; no torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from keyed import with_keys

from trtet_store.cache.tier import RemoteTier

MiB = 1 << 20


@pytest.fixture
def env(s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with_keys(s3env, tmp_path, monkeypatch)
    return s3env


def test_a_file_changed_after_its_xxh3_was_handed_over_is_refused_by_a_signing_publish(
        env: Any, tmp_path: Path) -> None:
    src = tmp_path / "record"
    src.write_bytes(os.urandom(MiB + 3))
    handed = [("record", src, xxhash.xxh3_128_hexdigest(src.read_bytes()))]
    src.write_bytes(os.urandom(MiB + 3))  # changed since: the same size, other bytes
    tier = RemoteTier(f"s3://{env.bucket}/c", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=env.journal_dir / "a", signing_key=env.keys / "team.key")
    with pytest.raises(ValueError, match="the upload read bytes with xxh3-128 .* not the "
                       ".* it was published with"):
        tier.publish("k1", handed, {})
    assert tier.read_pointer("k1") is None
    keys = [o["Key"] for o in env.client.list_objects_v2(Bucket=env.bucket,
                                                         Prefix="c/").get("Contents", [])]
    assert "c/k1.json" not in keys, keys
