"""EngineCache.push (trtet_store/export/engine_cache.py) checks EVERY named key before
anything is sent, timing keys (``trt-t-``, pushed by timing_entries.push_entries) as well as
build keys: a push naming a good timing entry and one that is not a timing cache here
refuses with nothing sent to the bucket, whichever order the keys come in. Before: the keys
were checked one by one as they were pushed, so the first was published and the second
refused (a partial push, reported as an error).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from timing_machine import key as _key
from timing_machine import machine  # noqa: F401 - the autouse fixture
from timing_machine import meta as _meta
from timing_machine import tiered as _tiered

from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, write_timing_cache

pytestmark = pytest.mark.executorch(reason="the stub's timing cache (stub_tensorrt imports torch)")

BOGUS = "trt-t-" + "0" * 32 + "-sm_89"


def _objects(s3) -> list[str]:
    return sorted(o["Key"] for o in
                  s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", []))


@pytest.mark.parametrize("bogus", ["absent", "another kind"])
@pytest.mark.parametrize("order", ["good first", "bogus first"])
def test_engine_cache_push_checks_every_timing_key_before_sending_any(here_fs: Path, s3env,
                                                                     order, bogus) -> None:
    cache = _tiered(here_fs, "A", s3env, s3env.endpoint.url)
    if bogus == "another kind":  # a trt-t- key whose entry is not a timing cache
        (here_fs / "other").write_bytes(b"an engine, not a timing cache")
        assert cache.blobs.put(BOGUS, here_fs / "other",
                               {"kind": "trtet_store.tensorrt.engine"}).stored
    data = write_timing_cache(_key(), {"a" * 16: "0000000a", "b" * 16: "0000000b"})
    src = here_fs / "src"
    src.write_bytes(data)
    assert cache.blobs.put(_key(), src, _meta(data)).stored
    keys = [_key(), BOGUS] if order == "good first" else [BOGUS, _key()]
    with installed(FakeBuilder()), pytest.raises(
            ValueError, match=f"{BOGUS!r} is not a timing cache in the engine cache"):
        cache.push(keys)
    assert _objects(s3env) == [], "a key was sent before every named key was checked"
    assert cache.remote.lookup(_key()) is None
    # The control: the good key alone is pushed.
    with installed(FakeBuilder()):
        [pub] = cache.push([_key()])
    assert pub.published and cache.remote.lookup(_key()) is not None


@pytest.mark.parametrize("other", ["a missing build key", "a missing timing key"])
def test_engine_cache_pull_looks_every_key_up_before_downloading_any(here_fs: Path, s3env,
                                                                    other) -> None:
    """EngineCache.pull: "every key is looked up before anything is downloaded", timing keys
    too. Before: the timing keys were pulled first (downloaded and merged), then the build
    keys looked up, so pull([timing key, missing key]) took the timing entry in and raised."""
    a = _tiered(here_fs, "A", s3env, s3env.endpoint.url)
    data = write_timing_cache(_key(), {"a" * 16: "0000000a"})
    (here_fs / "src").write_bytes(data)
    assert a.blobs.put(_key(), here_fs / "src", _meta(data)).stored
    with installed(FakeBuilder()):
        [pub] = a.push([_key()])
    assert pub.published
    b = _tiered(here_fs, "B", s3env, s3env.endpoint.url)
    missing = "ab" * 16 if other == "a missing build key" else BOGUS
    with installed(FakeBuilder()), pytest.raises(ValueError, match=f"{missing!r} is (in neither|"
                                                                   "not in the shared tier)"):
        b.pull([_key(), missing])
    assert b.blobs.get(_key()) is None, \
        "the timing entry was downloaded before every key was looked up"
    # The control: the timing key alone is pulled. The facts its check found are handed to
    # the download, not asked of the tier again: one lookup for the check, two in the
    # tier's fetch (its pointer, then the pointer again before the entry is taken in).
    looked: list[str] = []
    real_lookup = b.remote.lookup

    def lookup(key, *args, **kwargs):
        looked.append(key)
        return real_lookup(key, *args, **kwargs)

    b.remote.lookup = lookup
    with installed(FakeBuilder()):
        [(key, got)] = b.pull([_key()])
    assert key == _key() and got > 0
    assert looked.count(_key()) <= 3, looked
    hit = b.blobs.get(_key())
    assert hit is not None
    hit.close()
