"""``EngineCache.pull([...])`` checks every build key's shared entry before any download
(trtet_store/export/engine_cache.py, ``pull``; what ``trtet-store cache pull`` runs).

A key whose entry this machine does not take (built for another GPU, or with other versions)
is refused with "cannot be used here" before the first byte of any entry is fetched: a list
with a good key first and a refused one last downloads nothing and caches nothing. Checked
per download instead, the good key's engine would be downloaded and cached first, and the
call would fail half done.

The state is set up for real: two entries published to the shared tier on SeaweedFS, one
made for this machine and one claiming another GPU (or other versions); the bytes each call
receives are counted by the counting proxy in front of the server.
"""

from __future__ import annotations

import pytest
from test_tier_entry_claims import EDITS, _this_machine, entry_files

import trtet_store
from trtet_store.io.units import MiB

PREFIX = "team"
BAD = "trt-00000000000000000000000000000012-no-gpu"
SIZE = 3 * MiB


@pytest.fixture
def pushed(here_fs, s3env):
    """A real entry (compile_and_save with the stub builder, one 3 MiB engine) its build
    published to the shared tier; returns its key."""
    from trtet_store.export.engine_cache import RECORD_KIND
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    local = trtet_store.EngineCache(here_fs / "a", max_bytes=1 << 30, min_free=0,
                                    remote=f"s3://{s3env.bucket}/{PREFIX}",
                                    endpoint_url=s3env.endpoint.url)
    module, inputs = linear_relu()
    with installed(FakeBuilder(engine_sizes=(SIZE,), seeds=(41,))):
        trtet_store.compile_and_save(module, inputs, here_fs / "a.pte", engine_cache=local)
    key = next(e.key for e in local.entries() if e.metadata.get("kind") == RECORD_KIND)
    assert key in [e.key for e in local.remote_entries()]  # the build published it
    return key


def _publish_refused(s3, here_fs, edit) -> None:
    """BAD: an entry this machine does not take (another GPU, or other versions)."""
    from trtet_store.cache.tier import RemoteTier

    capability, _ = _this_machine()
    files, metadata = entry_files(here_fs / "bad", capability=capability, size=SIZE)
    EDITS[edit][0](metadata)
    tier = RemoteTier(f"s3://{s3.bucket}/{PREFIX}", endpoint_url=s3.endpoint.url)
    assert tier.publish(BAD, files, metadata).published


@pytest.mark.parametrize("edit", ["gpu", "versions"])
def test_pull_refuses_a_later_key_before_any_download(edit, here_fs, s3env, proxy,
                                                      pushed) -> None:
    key = pushed
    _publish_refused(s3env, here_fs, edit)
    cache = trtet_store.EngineCache(here_fs / "reader", max_bytes=1 << 30, min_free=0,
                                    remote=f"s3://{s3env.bucket}/{PREFIX}",
                                    endpoint_url=proxy.endpoint_url)
    proxy.reset()
    with pytest.raises(ValueError, match=f"the shared entry '{BAD}' cannot be used here"):
        cache.pull([key, BAD])
    # Nothing downloaded: the pointers only, never the good entry's 3 MiB engine.
    assert proxy.downstream < 256 * 1024, f"{proxy.downstream} bytes received before refusing"
    assert cache.lookup(key) is None
    assert cache.entries() == []
    downloads = cache.directory / "downloads"
    assert not downloads.exists() or not any(downloads.rglob("*.*")), \
        sorted(downloads.rglob("*"))
    # The control: the good key alone is pulled (its engine downloaded once, cached).
    proxy.reset()
    [(got_key, got)] = cache.pull([key])
    assert got_key == key and got >= SIZE and proxy.downstream >= SIZE
    hit = cache.lookup(key)
    assert hit is not None
    hit.close()
