"""An attempt directory's name (``trtet_store.cache.tier.entry``: ``attempt_id``, used by
``RemoteTier.publish``) covers each file's xxh3-128 digest, not only its name and size, so
"two machines never write one attempt directory" holds for two caches of one origin (a copied
cache directory) holding DIFFERENT bytes of the same sizes: the unit test below changes one
digest and expects another name. The flow test races the two caches on one key (the loser's
progress callback lets the winner publish in full, as tests/test_remote_tier_one_origin.py
does for equal bytes): the winner's entry is its bytes, whole, in its own directory, and the
loser leaves nothing behind. (With the digest left out of the name, the upload's own
conditional writes still keep the winner whole in this race: the unit test is what catches
that bug.) Real SeaweedFS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_remote_tier_one_origin import _downloadable, _files, _tier

from trtet_store.cache.tier.entry import attempt_id
from trtet_store.remote.s3 import S3


def test_attempt_id_covers_each_files_digest() -> None:
    one = [{"name": "record", "size": 10, "digest": "0" * 32}]
    other = [{"name": "record", "size": 10, "digest": "1" * 32}]
    assert attempt_id("o", one) != attempt_id("o", other)
    assert attempt_id("o", one) != attempt_id("p", one)


def test_two_caches_of_one_origin_with_other_bytes_never_share_an_attempt(
        s3env: Any, tmp_path: Path) -> None:
    winner, loser = (_tier(s3env, "same", "w", concurrency=1),
                     _tier(s3env, "same", "l", concurrency=1))
    mine = _files(tmp_path / "w")
    theirs = _files(tmp_path / "l")
    for _, p in theirs:  # the same sizes, other bytes
        data = bytearray(p.read_bytes())
        data[0] ^= 0xFF
        p.write_bytes(bytes(data))
    won: list[Any] = []

    def rival_commits(*_: Any) -> None:
        if not won:
            won.append(winner.publish("k", mine, {"by": "winner"}))

    lost = loser.publish("k", theirs, {"by": "loser"}, progress=rival_commits)
    assert won and won[0].published, won
    assert not lost.published, lost
    entry = winner.lookup("k")
    assert entry is not None and entry.etag == won[0].entry.etag
    _downloadable(s3env, entry, mine, tmp_path / "check")  # the winner's bytes, whole
    objects = S3(client=s3env.client).list_keys(s3env.bucket, "cache/k/", delimiter="")
    assert all(k.startswith(f"cache/{entry.attempt}") for k in objects), objects
    assert S3(client=s3env.client).list_uploads(s3env.bucket, "cache/") == []
