"""Two caches with one origin race on one key in the shared tier (issue 45 item 3).

An attempt directory is named by its origin and its files' digests, so two
caches that share an origin (a cache directory copied with its
``remote-origin``, or two tiers left at the host-name default) and hold the
same bytes publish into the same directory. The one whose pointer loses must
not remove that directory: the winner's pointer names it. The race is set up
deterministically: the loser looked the key up (no pointer yet) and is
uploading when, from its progress callback, the winner publishes in full.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from trtet_store.cache.tier import RemoteEntry, RemoteTier, store
from trtet_store.cache.tier.entry import attempt_id
from trtet_store.remote.manifest import Manifest
from trtet_store.remote.s3 import S3

MiB = 1 << 20


def _tier(env: Any, origin: str, journal: str, **kw: Any) -> RemoteTier:
    return RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url,
                      origin=origin, journal_dir=env.journal_dir / journal, **kw)


def _files(directory: Path, sizes: tuple[int, ...] = (9 * MiB + 7, 1000)
           ) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, size in enumerate(sizes):
        name = "record" if i == 0 else f"e{i - 1}"
        data = (hashlib.sha256(b"same" + bytes([i])).digest() * (size // 32 + 1))[:size]
        (directory / name).write_bytes(data)
        out.append((name, directory / name))
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _downloadable(env: Any, entry: RemoteEntry, files: list[tuple[str, Path]],
                  tmp: Path) -> None:
    """Every object the entry's manifest names is there in that version, and reads back whole."""
    s3 = S3(client=env.client)
    got = s3.get(env.bucket, f"cache/{entry.attempt}record.trtet.json")
    assert got is not None, f"the winner's manifest in cache/{entry.attempt} is gone"
    for o in Manifest.from_json(got[0]).objects:
        head = s3.head(env.bucket, o.key)
        assert head is not None and head.etag == o.etag, (o.key, head)
    done = _tier(env, "reader", "reader").download(entry, tmp)
    assert {n: _sha(p) for n, p in done.paths.items()} == {n: _sha(p) for n, p in files}


def _race(s3env: Any, tmp_path: Path, monkeypatch: Any, when: str) -> None:
    # Two caches, one origin, their own journals: one attempt directory for both.
    winner, loser = (_tier(s3env, "same", "w", concurrency=1),
                     _tier(s3env, "same", "l", concurrency=1))
    files = _files(tmp_path / "src")
    won: list[Any] = []
    started: list[bool] = []

    def rival_commits(*_: Any) -> None:
        if not started:
            started.append(True)
            won.append(winner.publish("k", files, {"by": "winner"}))

    if when == "before the loser's pointer":
        # The loser's upload is complete; its pointer PUT is next: the winner
        # publishes (finding the directory complete, it commits it) first.
        real_put = store.put

        def put_after_the_rival(s3: Any, bucket: str, key: str, *a: Any, **kw: Any) -> Any:
            if key.endswith("k.json"):
                rival_commits()
            return real_put(s3, bucket, key, *a, **kw)

        monkeypatch.setattr(store, "put", put_after_the_rival)
        lost = loser.publish("k", files, {"by": "loser"})
        assert "published it first" in lost.reason, lost
    else:
        # The loser looked the key up (no pointer) and is uploading: the winner
        # publishes the same bytes, pointer and all, now.
        lost = loser.publish("k", files, {"by": "loser"}, progress=rival_commits)
    assert won and won[0].published, won
    assert not lost.published, lost
    entry = winner.lookup("k")
    assert entry is not None and entry.etag == won[0].entry.etag
    assert entry.attempt == won[0].entry.attempt == \
        f"k/{attempt_id('same', won[0].entry.files)}/"  # the case: one directory for both
    _downloadable(s3env, entry, files, tmp_path / "check")
    assert S3(client=s3env.client).list_uploads(s3env.bucket, "cache/") == []


def test_the_loser_of_the_pointer_race_keeps_the_attempt_the_winner_names(
        s3env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    _race(s3env, tmp_path, monkeypatch, "before the loser's pointer")


def test_a_rival_of_one_origin_committing_mid_upload_stays_downloadable(
        s3env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    _race(s3env, tmp_path, monkeypatch, "mid-upload")
