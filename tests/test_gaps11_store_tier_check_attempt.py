"""The shared tier's publish (``trtet_store.cache.tier.store``: ``RemoteTier.publish``,
``_check_attempt``) commits a completed attempt directory it finds (a run killed between its
manifest and its pointer) only when every object is still the version the manifest names:
size and xxh3 by the manifest, and the object's ETag now (HEAD) the manifest's. A bucket
writer's same-size rewrite of one object leaves the manifest's size and digest as they were;
only its ETag tells. The attempt is then sent again, and the entry serves our bytes.

Real SeaweedFS; the killed run is ``publish_sources`` straight into the attempt directory.
"""

from __future__ import annotations

import hashlib
from typing import Any

from test_remote_tier import _attempt_of, _files, _publish_raw, _sha, _tier


def test_a_completed_attempt_with_an_object_rewritten_in_place_is_sent_again(s3env: Any,
                                                                              tmp_path) -> None:
    env = s3env
    tier = _tier(env)
    files = _files(tmp_path / "src", b"K")
    adir = f"cache/k/{_attempt_of(tier, files)}/"
    _publish_raw(env, files, adir, tmp_path / "j0")
    size = files[1][1].stat().st_size
    other = (hashlib.sha256(b"other").digest() * (size // 32 + 1))[:size]
    env.client.put_object(Bucket=env.bucket, Key=f"{adir}e0", Body=other)  # same size
    pub = tier.publish("k", files, {"m": 1})
    assert pub.published, pub
    assert pub.sent == sum(p.stat().st_size for _, p in files), pub  # sent again, not committed
    got = tier.download(tier.lookup("k"), tmp_path / "dl")
    assert {n: _sha(p) for n, p in got.paths.items()} == {n: _sha(p) for n, p in files}
