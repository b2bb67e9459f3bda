"""timing_cache.build_warm / _merge / entry_problem / timing_facts and cache.mergeable
copy_out / merge_in: the states their checks exist for, set up one at a time.

- build_warm: a cache that cannot make the private copy (its ``tmp/`` is not a directory)
  builds without; an entry whose bytes are no timing cache reaches the build emptied;
  a build that wrote nothing, or left its copy as it was, merges nothing (no put); a
  build that removed its copy, or wrote bytes the seam cannot read, is said, the entry
  left as it was;
- entry_problem: another kind, or no facts, refused;
- timing_facts / timing_key: every implementation flag is in the key, a set's order is
  not, the other settings are not;
- copy_out / merge_in (cache.mergeable): bytes that change between the pin and the read
  (a media error the seal's identity does not see) are never handed out or merged
  from, and the entry is dropped; a check that refuses stops the read; temp files go.

Real filesystem (``here_fs``), the stub TensorRT seam (``installed(FakeBuilder())``), no
torch export, no S3.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import xxhash

# _facts, _key, _check, _meta: timing_cache.timing_facts, timing_key, entry_problem and an
# entry's metadata, on the machine tests/timing_machine.py pins.
from timing_machine import check as _check
from timing_machine import entries as _entries
from timing_machine import facts as _facts
from timing_machine import key as _key
from timing_machine import machine  # noqa: F401 - the autouse fixture

import trtet_store
from trtet_store.cache import mergeable
from trtet_store.cache.mergeable import MergeRefused, copy_out, merge_in
from trtet_store.export import timing_cache
from trtet_store.export.timing_cache import TimingSaid, build_warm, entry_problem
from trtet_store.export.timing_tier import TierSaid
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    installed,
    parse_timing_cache,
    write_timing_cache,
)

MiB = 1 << 20


def _cache(here: Path) -> trtet_store.EngineCache:
    return trtet_store.EngineCache(here / "cache", max_bytes=1 << 30, min_free=0)


def _put(cache: trtet_store.EngineCache, here: Path, data: bytes, meta: dict | None = None
         ) -> None:
    src = here / "entry-src"
    src.write_bytes(data)
    meta = meta if meta is not None else {**timing_cache._metadata(_facts()),
                                          "entries": FakeBuilder.count_entries(data)}
    assert cache.blobs.put(_key(), src, meta).stored
    src.unlink()


def _digests(cache: trtet_store.EngineCache) -> dict[str, str]:
    out = {}
    for path in sorted(Path(cache.directory).rglob("*")):
        if path.is_file() and not path.is_symlink() and "tmp" not in path.parts:
            out[str(path.relative_to(cache.directory))] = \
                xxhash.xxh3_128_hexdigest(path.read_bytes())
    return out


def _tmp_files(cache: trtet_store.EngineCache) -> list[str]:
    tmp = Path(cache.directory) / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def _entry_bytes(cache: trtet_store.EngineCache) -> bytes | None:
    hit = cache.blobs.get(_key())
    if hit is None:
        return None
    with hit:
        return Path(hit.path).read_bytes()


class Build:
    """A build at the seam: records what its timing cache held, then does ``act`` to it."""

    def __init__(self, act: Any = None) -> None:
        self.act = act
        self.seen: list[bytes | None] = []

    def __call__(self, timing_cache_path: str | None = None) -> str:
        if timing_cache_path is None:
            self.seen.append(None)
        else:
            self.seen.append(Path(timing_cache_path).read_bytes())
            if self.act is not None:
                self.act(Path(timing_cache_path))
        return "built"


# -- build_warm ---------------------------------------------------------------------------


def test_build_warm_without_a_private_copy_builds_without_and_says_nothing(here_fs):
    cache = _cache(here_fs)
    _put(cache, here_fs, write_timing_cache(_key(), _entries(5, "a")))
    before = _digests(cache)
    tmp = Path(cache.directory) / "tmp"
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    tmp.write_bytes(b"")  # copy_out's temp() cannot make a file in it: an OSError
    build = Build()
    with installed(FakeBuilder()):
        built, said = build_warm(cache, build, {})
    assert (built, said) == ("built", None)
    assert build.seen == [None]  # no timing_cache_path at all
    tmp.unlink()
    tmp.mkdir()
    assert _digests(cache) == before


def test_build_warm_hands_an_unreadable_entry_to_the_build_emptied(here_fs):
    cache = _cache(here_fs)
    _put(cache, here_fs, b"not a timing cache at all\n", timing_cache._metadata(_facts()))
    build = Build()
    with installed(FakeBuilder()):
        built, said = build_warm(cache, build, {})
    assert built == "built"
    assert build.seen == [b""]  # never the bytes the seam cannot read
    assert said is not None and not said.warm and said.entries == 0
    assert said.reason is not None and said.reason.startswith("unreadable ("), said.reason
    assert said.line().startswith("timing cache: cold (unreadable (")
    assert said.merged is None  # the build wrote nothing: nothing merged
    assert _tmp_files(cache) == []


def test_build_warm_of_a_build_that_wrote_nothing_puts_nothing(here_fs):
    cache = _cache(here_fs)
    build = Build()
    with installed(FakeBuilder()):
        built, said = build_warm(cache, build, {})
    assert build.seen == [b""]
    assert said is not None and not said.warm and said.merged is None, said
    assert said.line() == "timing cache: cold"
    assert cache.blobs.get(_key()) is None  # no empty entry made
    assert _tmp_files(cache) == []


def test_build_warm_of_a_build_that_learned_nothing_merges_nothing(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(7, "b"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    build = Build()
    with installed(FakeBuilder()):
        _, said = build_warm(cache, build, {})
    assert build.seen == [data]
    assert said is not None and said.warm and said.entries == 7
    assert said.merged is None and said.after is None, said  # nothing learned: no put
    assert said.line() == "timing cache: warm, 7 entries"
    assert _digests(cache) == before


def test_build_warm_of_a_build_that_removed_its_copy_says_so_and_keeps_the_entry(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(7, "c"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    build = Build(lambda p: p.unlink())
    with installed(FakeBuilder()):
        _, said = build_warm(cache, build, {})
    assert said is not None and said.merged is False
    assert said.merge_reason.startswith("the build's timing cache is gone ("), said.merge_reason
    assert said.line().endswith(f"; not merged: {said.merge_reason}")
    assert _digests(cache) == before
    assert _tmp_files(cache) == []


def test_build_warm_of_a_build_that_wrote_unreadable_bytes_keeps_the_entry(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(7, "d"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    build = Build(lambda p: p.write_bytes(b"garbage, not a timing cache\n"))
    with installed(FakeBuilder()):
        _, said = build_warm(cache, build, {})
    assert said is not None and said.merged is False
    assert said.merge_reason == "ValueError: not a fake timing cache", said.merge_reason
    assert _digests(cache) == before
    assert _entry_bytes(cache) == data
    assert _tmp_files(cache) == []


def test_timing_said_line_says_the_tier_and_why_not(here_fs):
    tier = TierSaid(downloaded=12345, fetched_reason=None, published=False,
                    publish_reason="gave up after 4 tries")
    said = TimingSaid("trt-t-x", True, 1234, None, merged=False, merge_reason="no room",
                      tier=tier)
    assert said.line() == ("timing cache: warm, 1,234 entries, 12,345 bytes from the shared "
                           "cache; not merged: no room; not published: gave up after 4 tries")
    said = TimingSaid("trt-t-x", False, 0, "damaged", tier=TierSaid(fetched_reason="refused"))
    assert said.line() == "timing cache: cold (damaged) (refused)"


# -- entry_problem, timing_facts, timing_key ----------------------------------------------


def test_entry_problem_refuses_another_kind_and_an_entry_naming_no_facts():
    facts = _facts()
    assert entry_problem({"kind": "trtet_store.tensorrt.build", "timing": dict(facts)},
                         facts) == "it is not a timing cache (kind 'trtet_store.tensorrt.build')"
    assert entry_problem({"timing": dict(facts)}, facts) == \
        "it is not a timing cache (kind None)"
    for theirs in (None, [], "sm_89", 1):
        assert entry_problem({"kind": timing_cache.TIMING_KIND, "timing": theirs}, facts) == \
            "it names no device, TensorRT or flags"
    assert entry_problem({"kind": timing_cache.TIMING_KIND, "timing": dict(facts)}, facts) \
        is None


def test_timing_key_changes_with_every_implementation_flag_and_no_other_setting():
    assert set(timing_cache.IMPLEMENTATION_FLAGS) == {
        "enabled_precisions", "disable_tf32", "use_fp32_acc", "use_explicit_typing",
        "immutable_weights", "refit_identical_engine_weights", "strip_engine_weights",
        "sparse_weights", "version_compatible", "hardware_compatible", "engine_capability",
        "tiling_optimization_level", "l2_limit_for_tiling", "enable_weight_streaming",
        "truncate_double"}
    base = timing_cache.timing_key(timing_cache.timing_facts({}))
    keys = {base}
    for name in timing_cache.IMPLEMENTATION_FLAGS:
        facts = timing_cache.timing_facts({name: True})
        assert facts["flags"] == {name: True}
        keys.add(timing_cache.timing_key(facts))
    assert len(keys) == 1 + len(timing_cache.IMPLEMENTATION_FLAGS)  # each its own key
    for other in ("workspace_size", "optimization_level", "min_block_size", "debug"):
        facts = timing_cache.timing_facts({other: 7})
        assert facts["flags"] == {} and timing_cache.timing_key(facts) == base
    assert base.startswith("trt-t-") and base.endswith("-sm_89")


def test_timing_facts_of_a_set_are_the_same_whatever_its_order():
    # Small ints hash to themselves: {10, 9, 2} iterates 9, 10, 2; repr order is 10, 2, 9.
    a = timing_cache.timing_facts({"enabled_precisions": {10, 9, 2}})
    assert a["flags"]["enabled_precisions"] == [10, 2, 9]
    b = timing_cache.timing_facts({"enabled_precisions": frozenset([2, 10, 9])})
    assert timing_cache.timing_key(a) == timing_cache.timing_key(b)
    # dtypes and other objects by name; a list keeps its order (it is an order).
    c = timing_cache.timing_facts({"enabled_precisions": {"float16", "float32"},
                                   "engine_capability": object.__new__(type("EC", (), {
                                       "__str__": lambda self: "EngineCapability.STANDARD"}))})
    assert c["flags"] == {"enabled_precisions": ["float16", "float32"],
                          "engine_capability": "EngineCapability.STANDARD"}


def test_driver_is_read_from_the_kernel_module_line(tmp_path):
    # This machine has no NVIDIA driver: "none". With one, the version from its line:
    # the test plays it in a private mount namespace (a tmpfs over /proc/driver).
    import shutil
    import subprocess
    import sys

    if os.path.exists("/proc/driver/nvidia/version"):
        assert timing_cache._driver() not in ("none", "unknown")
    else:
        assert timing_cache._driver() == "none"
    if shutil.which("unshare") is None or not os.path.isdir("/proc/driver"):
        pytest.skip("no unshare or /proc/driver here")
    code = ("import sys; from trtet_store.export import timing_cache; "
            "print(timing_cache._driver())")
    line = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release "
            "Build  (dvs-builder@U16-I3-B03-4-3)  Tue Feb 25 04:08:23 UTC 2025\nGCC version:\n")
    script = (f"mount -t tmpfs none /proc/driver && mkdir /proc/driver/nvidia && "
              f"cat > /proc/driver/nvidia/version && {sys.executable} -c '{code}'")
    env = {**os.environ, "PYTHONPATH": str(Path(timing_cache.__file__).parents[2])}
    for text, want in ((line, "570.124.06"), ("no version here\n", "unknown")):
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                           input=text, capture_output=True, text=True, env=env, timeout=60)
        if r.returncode != 0 and "mount" in r.stderr:
            pytest.skip(f"cannot mount here: {r.stderr.strip()}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want


# -- cache.mergeable: copy_out / merge_in ------------------------------------------------


def _flip_in_place(cache: trtet_store.EngineCache) -> None:
    """Change one byte of the entry's blob, same size (what a media error does)."""
    hit = cache.blobs.get(_key())
    with hit:
        path = Path(hit.path)
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x01]))


def test_copy_out_drops_an_entry_whose_bytes_changed_after_the_pin(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "e"))
    _put(cache, here_fs, data)
    flipped = []

    def check(meta: dict) -> str | None:  # between the pin and the read: the bytes change
        _flip_in_place(cache)
        flipped.append(True)
        return _check(meta)

    with copy_out(cache.blobs, _key(), check, limit=MiB) as copied:
        assert flipped == [True]
        assert not copied.warm and copied.digest is None
        assert copied.reason.startswith("the entry was damaged (its bytes ("), copied.reason
        assert copied.reason.endswith("); dropped")
        assert copied.path.read_bytes() == b""
    # Dropped by copy_out itself (its record gone), not left for the next get to find.
    assert not cache.blobs.files.record(_key()).exists()
    assert cache.blobs.get(_key()) is None
    assert _tmp_files(cache) == []


def test_merge_in_does_not_merge_from_an_entry_whose_bytes_changed_after_the_pin(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "f"))
    _put(cache, here_fs, data)
    learned = here_fs / "learned"
    mine = write_timing_cache(_key(), _entries(3, "g"))
    learned.write_bytes(mine)
    seen = []

    def check(meta: dict) -> str | None:
        _flip_in_place(cache)
        return _check(meta)

    def combined(current: bytes | None, new: bytes) -> tuple[bytes, dict]:
        seen.append(current)
        return timing_cache._combined(current, new)

    with installed(FakeBuilder()):
        done = merge_in(cache.blobs, _key(), learned, combined, check,
                        timing_cache._metadata(_facts()), limit=MiB)
    assert seen == [None]  # never merged from the damaged bytes
    assert done.merged and done.replaced.startswith("the entry was damaged ("), done
    assert parse_timing_cache(_entry_bytes(cache))[1] == _entries(3, "g")
    assert _tmp_files(cache) == []


def test_copy_out_never_reads_an_entry_its_check_refuses(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "h"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    with copy_out(cache.blobs, _key(), lambda m: "made for another GPU", limit=MiB) as copied:
        assert not copied.warm and copied.digest is None
        assert copied.reason == "made for another GPU"
        assert copied.path.read_bytes() == b""
        assert copied.metadata["kind"] == timing_cache.TIMING_KIND
        path = copied.path
    assert not path.exists()
    assert _digests(cache) == before
    assert _tmp_files(cache) == []


def test_copy_out_closes_its_temp_file_when_the_check_raises(here_fs):
    cache = _cache(here_fs)
    _put(cache, here_fs, write_timing_cache(_key(), _entries(2, "i")))

    def check(meta: dict) -> str | None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        copy_out(cache.blobs, _key(), check, limit=MiB)
    assert _tmp_files(cache) == []


def test_merge_in_with_a_combine_that_refuses_leaves_the_entry_and_no_temp(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "j"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    learned = here_fs / "learned"
    learned.write_bytes(write_timing_cache("trt-t-another", _entries(3, "k")))

    def combined(current: bytes | None, new: bytes) -> tuple[bytes, dict]:
        raise MergeRefused("headers differ")

    done = mergeable.merge_in(cache.blobs, _key(), learned, combined, _check,
                              timing_cache._metadata(_facts()), limit=MiB)
    assert not done.merged
    assert done.reason == "the merge was refused, the entry is left as it was: headers differ"
    assert _digests(cache) == before
    assert _tmp_files(cache) == []


def test_merge_in_said_not_merged_when_the_cache_skips_the_put(here_fs):
    cache = trtet_store.EngineCache(here_fs / "cache", max_bytes=1 << 30, min_free=1 << 60)
    learned = here_fs / "learned"
    learned.write_bytes(write_timing_cache(_key(), _entries(3, "l")))
    with installed(FakeBuilder()):
        done = merge_in(cache.blobs, _key(), learned, timing_cache._combined, _check,
                        timing_cache._metadata(_facts()), limit=MiB)
    assert not done.merged and done.put is not None and not done.put.stored
    assert done.reason == f"the merged entry was not cached: {done.put.reason}"
    assert cache.blobs.get(_key()) is None
    assert _tmp_files(cache) == []


def test_merge_in_refuses_a_learned_file_over_the_limit_before_any_claim(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "m"))
    _put(cache, here_fs, data)
    before = _digests(cache)
    learned = here_fs / "learned"
    learned.write_bytes(write_timing_cache(_key(), _entries(50, "n")))
    with pytest.raises(OSError, match="over") as got:
        merge_in(cache.blobs, _key(), learned, timing_cache._combined, _check,
                 timing_cache._metadata(_facts()), limit=len(data))
    assert "learned cache file" in str(got.value)
    assert _digests(cache) == before


def test_copy_out_and_merge_in_take_an_entry_of_exactly_the_limit(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(9, "o"))
    _put(cache, here_fs, data)
    with copy_out(cache.blobs, _key(), _check, limit=len(data)) as copied:
        assert copied.warm and copied.reason is None
        assert copied.path.read_bytes() == data
    learned = here_fs / "learned"
    learned.write_bytes(write_timing_cache(_key(), _entries(1, "p")))
    seen = []

    def combined(current: bytes | None, new: bytes) -> tuple[bytes, dict]:
        seen.append(current)
        return timing_cache._combined(current, new)

    with installed(FakeBuilder()):
        done = merge_in(cache.blobs, _key(), learned, combined, _check,
                        timing_cache._metadata(_facts()), limit=len(data))
    assert seen == [data] and done.merged and done.replaced is None, done
    assert parse_timing_cache(_entry_bytes(cache))[1] == {**_entries(9, "o"),
                                                          **_entries(1, "p")}


def test_build_warm_of_a_build_that_learned_merges_it_and_counts_the_entries(here_fs):
    cache = _cache(here_fs)
    data = write_timing_cache(_key(), _entries(7, "q"))
    _put(cache, here_fs, data)
    more = {**_entries(7, "q"), **_entries(2, "r")}
    build = Build(lambda p: p.write_bytes(write_timing_cache(_key(), more)))
    with installed(FakeBuilder()):
        _, said = build_warm(cache, build, {})
    assert said is not None and said.warm and said.entries == 7
    assert said.merged is True and said.merge_reason is None and said.after == 9, said
    assert parse_timing_cache(_entry_bytes(cache))[1] == more
    hit = cache.blobs.get(_key())
    with hit:
        assert dict(hit.metadata)["entries"] == 9
    assert _tmp_files(cache) == []
