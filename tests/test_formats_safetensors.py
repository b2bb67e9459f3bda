"""trtet_store.formats.safetensors against safetensors 0.8.0 itself, on real filesystems.

- the oracle: the same bytes as ``safetensors.torch.save_file`` for random
  dicts (dtypes, shapes with zeros, names, metadata), and ``safe_open`` reads
  every tensor back; the aligned variant too;
- over its own source: ``load_file`` maps the file, the save replaces it;
- refusals before anything is created; sharded checkpoints in one transaction;
- failures (full disk, a fault at any call, SIGKILL) leave the previous
  checkpoint byte-identical and nothing stray;
- staged blobs cloned on XFS and inserted on ext4 (no byte of theirs written);
- peak RSS of a 2 GiB save, from blobs and from memory (in a child process).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from digests import file_digest
from faults import FaultInjector, count_calls
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save_file as reference_save

from trtet_store import BlobStore, InsufficientSpaceError, recover
from trtet_store.bench.measure import bytes_written
from trtet_store.formats import StagedTensor
from trtet_store.formats import safetensors as sf
from trtet_store.io import fs

MiB = 1 << 20

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn,
          torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
          torch.float4_e2m1fn_x2, torch.int16, torch.uint16, torch.float16, torch.bfloat16,
          torch.int32, torch.uint32, torch.float32, torch.complex64, torch.float64,
          torch.int64, torch.uint64]


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Any bit pattern of the dtype (NaNs included): safetensors stores bytes, not values."""
    n = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def split(path: Path) -> tuple[dict, bytes, int]:
    """The parsed header, the data bytes, and where the data starts."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:], 8 + n


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12).filter(
    lambda s: s != "__metadata__")
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
metadata = st.one_of(st.none(), st.dictionaries(names, names, max_size=3))


@st.composite
def tensor_dicts(draw):
    keys = draw(st.lists(names, min_size=0, max_size=6, unique=True))
    out = {}
    for i, k in enumerate(keys):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(shapes)
        if dtype == torch.float4_e2m1fn_x2 and not shape:
            shape = (1,)  # 0-d F4 has no safetensors shape; refused (test below)
        out[k] = random_tensor(dtype, shape, seed=i)
    return out


@settings(max_examples=60)
@given(tensors=tensor_dicts(), meta=metadata)
def test_same_bytes_as_safetensors_save_file(tmp_path_factory, tensors, meta):
    if not tensors and meta == {}:
        return  # safetensors 0.8.0 writes broken JSON here: test_no_tensors_empty_metadata
    d = tmp_path_factory.mktemp("oracle")
    reference_save(tensors, d / "ref.safetensors", metadata=meta)
    report = sf.save_file(tensors, d / "ours.safetensors", metadata=meta)
    ref, ours = (d / "ref.safetensors").read_bytes(), (d / "ours.safetensors").read_bytes()
    if meta is None or len(meta) < 2:
        assert ours == ref
    else:
        # safetensors' __metadata__ is a Rust HashMap: its key order varies between runs.
        h_ref, data_ref, start_ref = split(d / "ref.safetensors")
        h_ours, data_ours, start_ours = split(d / "ours.safetensors")
        assert (h_ours, data_ours, start_ours) == (h_ref, data_ref, start_ref)
        assert list(h_ours["__metadata__"]) == list(meta)  # ours keeps the caller's order
    assert report.size == len(ref)
    with safe_open(d / "ours.safetensors", "pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for k, t in tensors.items():
            back = f.get_tensor(k)
            assert back.dtype == t.dtype and back.shape == t.shape
            assert as_bytes(back) == as_bytes(t)
        assert f.metadata() == meta or (meta == {} and not f.metadata())


@settings(max_examples=25)
@given(tensors=tensor_dicts(), meta=metadata, big=st.lists(st.integers(1, 3), max_size=3))
def test_aligned_variant_reads_back_with_pages_aligned(tmp_path_factory, tensors, meta, big):
    tensors = {k: v for k, v in tensors.items() if v.dtype != torch.float4_e2m1fn_x2}
    for i, pages in enumerate(big):  # tensors of whole pages, which alignment puts first
        tensors[f"page{i}"] = random_tensor(torch.float32, (pages * 1024,), seed=100 + i)
    d = tmp_path_factory.mktemp("aligned")
    sf.save_file(tensors, d / "a.safetensors", metadata=meta, alignment=4096)
    header, data, start = split(d / "a.safetensors")
    assert start % 4096 == 0
    for k, t in tensors.items():
        s, e = header[k]["data_offsets"]
        if (e - s) % 4096 == 0:
            assert s % 4096 == 0, (k, s)
        assert data[s:e] == as_bytes(t)
    with safe_open(d / "a.safetensors", "pt") as f:
        for k, t in tensors.items():
            assert as_bytes(f.get_tensor(k)) == as_bytes(t)
    assert load_file(d / "a.safetensors").keys() == tensors.keys()


def test_no_tensors_empty_metadata_is_valid_json(tmp_path):
    # safetensors 0.8.0 writes '{},"__metadata__":{}}' here, which it cannot read back.
    reference_save({}, tmp_path / "ref.safetensors", metadata={})
    with pytest.raises(Exception, match="invalid JSON"):
        load_file(tmp_path / "ref.safetensors")
    sf.save_file({}, tmp_path / "ours.safetensors", metadata={})
    assert (tmp_path / "ours.safetensors").read_bytes()[8:].rstrip() == b'{"__metadata__":{}}'
    assert load_file(tmp_path / "ours.safetensors") == {}


def test_numpy_arrays_match_safetensors_numpy(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file as numpy_save

    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False]),
              "c": np.full((2, 2), 1 + 2j, dtype=np.complex64), "e": np.zeros((0, 3), np.int64),
              "s": np.array(7, dtype=np.uint16)}
    numpy_save(arrays, tmp_path / "ref.safetensors", metadata={"format": "np"})
    sf.save_file(arrays, tmp_path / "ours.safetensors", metadata={"format": "np"})
    ours, ref = (tmp_path / "ours.safetensors").read_bytes(), (tmp_path / "ref.safetensors")
    assert ours == ref.read_bytes()


def test_save_over_its_own_mapped_source(tmp_path):
    path = tmp_path / "model.safetensors"
    original = {f"w{i}": random_tensor(torch.float32, (256, 1024 + i), seed=i) for i in range(4)}
    reference_save(original, path)
    before = path.read_bytes()

    loaded = load_file(path)  # mmap-backed: the file's pages are the tensors' memory
    sf.save_file(loaded, path)
    assert path.read_bytes() == before
    assert all(as_bytes(loaded[k]) == as_bytes(original[k]) for k in original)

    loaded = load_file(path)
    loaded["w1"] = loaded["w1"] * 2  # one tensor replaced
    loaded["w2"][0, :8] = -1.0  # one written in place (its page copied on write)
    expected = {k: v.clone() for k, v in loaded.items()}
    sf.save_file(loaded, path)
    reference_save(expected, tmp_path / "ref.safetensors")
    assert path.read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    again = load_file(path)
    assert all(as_bytes(again[k]) == as_bytes(expected[k]) for k in expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "ref.safetensors"]


def test_refusals_create_nothing(tmp_path):
    base = torch.arange(16, dtype=torch.float32)
    cases = [
        ({"a": base, "b": base[4:8]}, ValueError, "share memory"),
        ({"a": base.reshape(4, 4).t()}, ValueError, "contiguous()"),
        ({"a": base.to_sparse()}, ValueError, "to_dense()"),
        ({"a": torch.empty(3, device="meta")}, ValueError, "meta"),
        ({"a": torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)},
         ValueError, "reshape it"),
        ({"a": torch.zeros(2, dtype=torch.complex128)}, ValueError, "cannot be stored"),
        ({"a": [1.0, 2.0]}, TypeError, "torch.Tensor"),
        ({"__metadata__": base}, ValueError, "rename"),
    ]
    for tensors, exc, words in cases:
        with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
            sf.save_file(tensors, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="str to str"):
        sf.save_file({"a": base}, tmp_path / "x.safetensors", metadata={"n": 1})
    with pytest.raises(TypeError, match="unexpected keyword"):
        sf.save_file({"a": base}, tmp_path / "x.safetensors", align=4096)
    with pytest.raises(ValueError, match="power of two"):
        sf.save_file({"a": base}, tmp_path / "x.safetensors", alignment=1000)
    assert list(tmp_path.iterdir()) == []
    # Views that do not overlap are separate tensors, as safetensors sees them.
    sf.save_file({"a": base[:8], "b": base[8:]}, tmp_path / "ok.safetensors")


def test_sharded_checkpoint_in_one_transaction(tmp_path):
    tensors = {f"layer.{i}.weight": random_tensor(torch.float16, (512, 512), seed=i)
               for i in range(5)}  # 512 KiB each
    reports = sf.save_sharded(tensors, tmp_path, max_shard_size=MiB + 1,
                              metadata={"format": "pt"})
    names = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert [r.path.name for r in reports] == names + ["model.safetensors.index.json"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 512 * 1024
    assert index["weight_map"] == {f"layer.{i}.weight": names[i // 2] for i in range(5)}
    for name in names:
        part = {n: tensors[n] for n, f in index["weight_map"].items() if f == name}
        reference_save(part, tmp_path / "ref.safetensors", metadata={"format": "pt"})
        assert (tmp_path / name).read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    (tmp_path / "ref.safetensors").unlink()

    # A fault at any call of a re-save leaves every old file as it was.
    old = {p.name: file_digest(p) for p in tmp_path.iterdir()}
    changed = {k: v + 1 for k, v in tensors.items()}

    def resave():
        return sf.save_sharded(changed, tmp_path, max_shard_size=MiB + 1)

    total = count_calls(resave)
    new = {p.name: file_digest(p) for p in tmp_path.iterdir()}
    assert new.keys() == old.keys() and all(new[n] != old[n] for n in names)
    sf.save_sharded(tensors, tmp_path, max_shard_size=MiB + 1, metadata={"format": "pt"})
    assert {p.name: file_digest(p) for p in tmp_path.iterdir()} == old
    for n in range(1, total + 1, max(1, total // 40)):
        with FaultInjector(fail_at=n, mode="eio") as inj, contextlib.suppress(OSError):
            resave()
        assert inj.fired
        if any(p.name.startswith(".") for p in tmp_path.iterdir()):
            recover(tmp_path)  # a journal left: finish or undo it, as the next write would
        now = {p.name: file_digest(p) for p in tmp_path.iterdir()}
        assert now in (old, new), f"call {n} ({inj.fired}): shards of two checkpoints mixed"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(old), f"call {n}"
        if now == new:
            sf.save_sharded(tensors, tmp_path, max_shard_size=MiB + 1,
                            metadata={"format": "pt"})


def test_full_disk_keeps_the_previous_checkpoint(make_fs):
    mnt = make_fs("ext4", 64)
    path = mnt / "model.safetensors"
    small = {"w": random_tensor(torch.float32, (4 * MiB // 4,), seed=1)}
    sf.save_file(small, path)
    old = file_digest(path)
    big = {f"w{i}": random_tensor(torch.float32, (8 * MiB // 4,), seed=i) for i in range(8)}
    with pytest.raises(InsufficientSpaceError) as err:
        sf.save_file(big, path)
    assert err.value.needed > err.value.available
    assert file_digest(path) == old
    assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "model.safetensors"]
    # ENOSPC in the middle of the write (the preflight passed): rolled back.
    mid = {f"w{i}": random_tensor(torch.float32, (4 * MiB // 4,), seed=i) for i in range(4)}
    for n in (3, 5):  # pwrite 1 is the journal, 2 the header, 3.. the tensors
        with FaultInjector(fail_at=n, mode="enospc", only=frozenset({"pwrite"})) as inj, \
                pytest.raises(OSError):
            sf.save_file(mid, path)
        assert inj.fired
        assert file_digest(path) == old
        assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "model.safetensors"]
    assert as_bytes(load_file(path)["w"]) == as_bytes(small["w"])


KILL_CHILD = """
import sys, torch
from trtet_store.formats import safetensors as sf
tensors = {{f"w{{i}}": torch.full((8 << 20 >> 2,), float(i)) for i in range(4)}}
print("ready", flush=True)
sf.save_file(tensors, {path!r})
print("done", flush=True)
"""


def test_kill_mid_save_keeps_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    old_tensors = {"w": random_tensor(torch.float32, (MiB,), seed=7)}
    sf.save_file(old_tensors, path)
    old = file_digest(path)
    new_tensors = {f"w{i}": torch.full((8 << 20 >> 2,), float(i)) for i in range(4)}
    sf.save_file(new_tensors, tmp_path / "new.safetensors")
    new = file_digest(tmp_path / "new.safetensors")
    (tmp_path / "new.safetensors").unlink()
    code = KILL_CHILD.format(path=os.fspath(path))
    seen = set()
    for delay in (0.0, 0.02, 0.08, 0.2, 0.5):
        if file_digest(path) != old:
            sf.save_file(old_tensors, path)
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        digest = file_digest(path)
        assert digest in (old, new), f"killed after {delay} s: a torn checkpoint"
        seen.add("old" if digest == old else "new")
        recover(tmp_path)  # finishes a write whose bytes were all in place, or undoes it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
        after = file_digest(path)
        assert after in (old, new) and (digest == old or after == new), f"after {delay} s"
        digest = after
        loaded = load_file(path)
        assert loaded.keys() == (old_tensors if digest == old else new_tensors).keys()
    assert "old" in seen, "no kill landed before publish: the test proved nothing"


def stage(store: BlobStore, size: int, seed: int, dtype: str = "F32") -> StagedTensor:
    """A blob of ``size`` bytes, distinct per seed and per 64 MiB (cheap to make)."""
    block = bytearray(random_tensor(torch.uint8, (MiB,), seed=seed).numpy().tobytes() * 64)
    with store.writer(metadata={"dtype": dtype, "shape": [size // 4]}) as w:
        for pos in range(0, size, 64 * MiB):
            block[:8] = pos.to_bytes(8, "little")
            w.write(memoryview(block)[:min(64 * MiB, size - pos)])
    return StagedTensor.of(w.blob)


@pytest.mark.parametrize("fstype,placement", [("xfs", "clone"), ("ext4", "insert")])
def test_staged_blobs_are_placed_not_written(make_fs, fstype, placement):
    size = 512 * MiB
    mnt = make_fs(fstype, 1400)
    fs.capabilities.clear()
    store = BlobStore(mnt / "staging")
    staged = {"a": stage(store, size, 1), "b": stage(store, size, 2)}
    digests = {k: v.blob.digest for k, v in staged.items()}
    small = {"bias": torch.arange(10, dtype=torch.float32)}
    out = mnt / "out"
    out.mkdir()
    before = bytes_written()
    if placement == "clone":
        # One file: both blobs cloned at page offsets, the sources kept.
        reports = [sf.save_file({**staged, **small}, out / "model.safetensors", alignment=4096)]
    else:
        # ext4 inserts one host per file: a shard per blob, both inserted (consumed).
        reports = sf.save_sharded({**staged, **small}, out, max_shard_size=size,
                                  alignment=4096, consume=True)
    written = bytes_written() - before
    placed = [p for r in reports for p in r.placements]
    assert [p.placement for p in placed] == [placement] * 2, [p.reason for p in placed]
    assert sum(p.bytes_written for p in placed) == 0
    assert written < 4 * MiB, written  # headers, journals; no payload byte
    files = sorted(out.glob("*.safetensors"))
    back = {}
    for f in files:
        with safe_open(f, "np") as h:
            back.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118 (no __iter__)
    assert sorted(back) == ["a", "b", "bias"]
    import xxhash
    for k in ("a", "b"):
        assert xxhash.xxh3_128_hexdigest(back[k].tobytes()) == digests[k]
    store.close()


MEMORY_CHILD = """
import sys, torch, os
sys.path.insert(0, {tests!r})
from test_formats_safetensors import stage
from trtet_store import BlobStore
from trtet_store.bench.measure import current_rss_bytes, peak_rss_bytes, reset_peak_rss
from trtet_store.formats import safetensors as sf
what, where = sys.argv[1], sys.argv[2]
n, each = 8, 256 << 20
if what == "blobs":
    store = BlobStore(os.path.join(where, "staging"))
    tensors = {{f"w{{i}}": stage(store, each, i) for i in range(n)}}
else:
    tensors = {{f"w{{i}}": torch.full((each // 4,), float(i)) for i in range(n)}}
base = current_rss_bytes()
assert reset_peak_rss()
sf.save_file(tensors, os.path.join(where, "model.safetensors"), placements="copy")
print(peak_rss_bytes() - base, os.path.getsize(os.path.join(where, "model.safetensors")))
"""


@pytest.mark.parametrize("what", ["blobs", "memory"])
def test_peak_rss_of_a_2_gib_save(here_fs, what):
    code = MEMORY_CHILD.format(tests=os.fspath(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code, what, os.fspath(here_fs)], check=True,
                         capture_output=True, text=True)
    growth, size = (int(x) for x in out.stdout.split())
    assert size > 2 << 30
    bound = 64 * MiB if what == "blobs" else 256 * MiB  # one tensor
    assert growth < bound, f"peak RSS grew {growth / MiB:.0f} MiB saving {what}"


def test_formats_load_nothing_heavy_and_no_export():
    code = ("import sys, trtet_store.formats.safetensors, trtet_store.formats.onnx\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'onnx', 'safetensors', 'executorch') "
            "or m.startswith('trtet_store.export')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == "[]", out
