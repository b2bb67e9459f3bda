"""timing_entries.export_entry (``cache export-timing``) and timing_tier._local, one state
each: a key prefix naming two timing entries is refused; a prefix that also names an
entry of another kind names the timing one; an entry over MAX_TIMING_BYTES is refused
from its size, never read; this machine's entry is the one whose every fact matches;
a local entry whose bytes change after the pin is never pushed to the tier.

Real filesystems (``here_fs``), the stub seam; S3 (SeaweedFS) for the push.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
from timing_machine import SM89, machine  # noqa: F401 - the autouse fixture

import trtet_store
from trtet_store.export import timing_cache, timing_entries, timing_tier
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, write_timing_cache

MiB = 1 << 20


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _entry(here: Path, n: int, tag: str, *, flags: dict | None = None,
           facts: dict | None = None, cache: Any = None) -> tuple[str, bytes]:
    facts = {**(facts or SM89), "flags": flags or {}}
    key = timing_cache.timing_key(facts)
    tactics = {xxhash.xxh3_64_hexdigest(f"{tag}{i}".encode()): f"{i:08x}" for i in range(n)}
    data = write_timing_cache(key, tactics)
    src = here / f"src-{key}"
    src.write_bytes(data)
    meta = {**timing_cache._metadata(facts), "entries": n}
    assert (cache or _cache(here)).blobs.put(key, src, meta).stored
    src.unlink()
    return key, data


def test_export_entry_refuses_a_prefix_naming_two_timing_entries(here_fs):
    k1, _ = _entry(here_fs, 3, "a")
    k2, _ = _entry(here_fs, 3, "b", flags={"disable_tf32": True})
    out = here_fs / "out.timing"
    with pytest.raises(ValueError) as got:
        timing_entries.export_entry(_cache(here_fs), out, "trt-t-")
    text = str(got.value)
    assert text.startswith("'trt-t-' names 2 timing caches of the engine cache ")
    assert text.endswith("; give more of the key") and k1 in text and k2 in text
    assert not out.exists()
    # Enough of it to name one: that one.
    n = next(i for i in range(7, 40) if k1[:i] != k2[:i])
    done = timing_entries.export_entry(_cache(here_fs), out, k1[:n])
    assert done.key == k1


def test_export_entry_prefix_names_only_timing_entries(here_fs):
    key, data = _entry(here_fs, 4, "c")
    (here_fs / "engine").write_bytes(b"\0" * 512)
    build = "trt-" + "0" * 32 + "-sm_89"
    assert _cache(here_fs).blobs.put(build, here_fs / "engine",
                                     {"kind": "trtet_store.tensorrt.build"}).stored
    out = here_fs / "out.timing"
    done = timing_entries.export_entry(_cache(here_fs), out, "trt-")
    assert done.key == key and out.read_bytes() == data


def test_export_entry_refuses_an_entry_over_the_limit_from_its_size(here_fs, monkeypatch):
    key, data = _entry(here_fs, 50, "d")
    monkeypatch.setattr(timing_cache, "MAX_TIMING_BYTES", len(data) - 1)
    read = []
    real = timing_entries.read_fd_capped
    monkeypatch.setattr(timing_entries, "read_fd_capped",
                        lambda *a: read.append(a) or real(*a))
    out = here_fs / "out.timing"
    with pytest.raises(ValueError) as got:
        timing_entries.export_entry(_cache(here_fs), out, key)
    assert str(got.value) == (f"the timing cache {key!r} holds {len(data)} bytes, over the "
                              f"{len(data) - 1} allowed: nothing written")
    assert read == [] and not out.exists()
    assert [e.key for e in _cache(here_fs).entries()] == [key]  # refused, not dropped


def test_export_entry_default_is_the_entry_whose_every_fact_is_this_machines(here_fs):
    # The same GPU under another driver, CUDA or TensorRT build: not this machine's.
    for n, other in enumerate(({"driver": "535.54.03"}, {"cuda": "12.4"},
                               {"tensorrt": ["tensorrt-cu12 10.14.1.47"]})):
        _entry(here_fs, 2, f"o{n}", facts={**SM89, **other})
    key, data = _entry(here_fs, 5, "mine")
    out = here_fs / "out.timing"
    done = timing_entries.export_entry(_cache(here_fs), out)
    assert done.key == key and out.read_bytes() == data
    assert done.facts == {**SM89, "flags": {}} and done.entries == 5


def test_timing_tier_local_entry_changed_after_the_pin_is_never_pushed(here_fs, s3env,
                                                                       monkeypatch):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=0,
                                    remote=f"s3://{s3env.bucket}/tier",
                                    endpoint_url=s3env.endpoint.url)
    key, data = _entry(here_fs, 20, "e", cache=cache)
    real = timing_tier.read_fd_capped

    def damaged_then_read(fd, limit, path, what):  # a media error after the pin
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            f.seek(len(data) - 3)
            f.write(b"X")
        return real(fd, limit, path, what)

    monkeypatch.setattr(timing_tier, "read_fd_capped", damaged_then_read)
    said = timing_tier.TierSaid()
    facts = {**SM89, "flags": {}}
    with installed(FakeBuilder()):
        timing_tier.push(cache, key, lambda m: timing_cache.entry_problem(m, facts),
                         FakeBuilder.combine, timing_cache._combined,
                         lambda out: {**timing_cache._metadata(facts),
                                      "entries": FakeBuilder.count_entries(out)},
                         limit=MiB, said=said)
        assert said.published is None and said.sent == 0, said
        assert cache.remote.lookup(key) is None  # nothing of the damaged bytes sent
        with pytest.raises(ValueError, match="is not a timing cache in the engine cache"):
            timing_entries.push_entries(cache, [key])
    assert cache.remote.lookup(key) is None


def test_export_entry_of_exactly_max_timing_bytes_is_written(here_fs, monkeypatch):
    key, data = _entry(here_fs, 50, "f")
    monkeypatch.setattr(timing_cache, "MAX_TIMING_BYTES", len(data))
    out = here_fs / "out.timing"
    done = timing_entries.export_entry(_cache(here_fs), out, key)
    assert done.size == len(data) and out.read_bytes() == data


def test_export_entry_into_a_directory_of_another_user_is_refused(here_fs):
    key, data = _entry(here_fs, 6, "g")
    theirs = here_fs / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)  # nobody's directory: they could swap what we write
    before = sorted(os.listdir(theirs))
    with pytest.raises(Exception) as got:
        timing_entries.export_entry(_cache(here_fs), theirs / "out.timing", key)
    assert "directory to export into" in str(got.value), got.value
    assert sorted(os.listdir(theirs)) == before == []
    st = os.stat(theirs)
    assert (st.st_uid, st.st_mode & 0o7777) == (65534, 0o755)
