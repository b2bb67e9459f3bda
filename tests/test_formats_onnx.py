"""trtet_store.formats.onnx against onnx and onnxruntime, with a real exported model.

- a model from ``torch.onnx.export`` (about 4 MiB of weights) saved through
  ours: ``onnx.load`` and ``check_model(path)`` pass, onnxruntime gives the
  original's outputs, the caller's model is unchanged;
- a re-save with one initializer changed replaces the data file (exactly the
  new size; onnx's own writer appends), reading the old one as ranges;
- a fault at any call leaves both old files byte-identical (or both new);
- staged blobs and external tensors cloned on XFS at page offsets;
- locations that would leave the directory are refused before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from digests import file_digest
from faults import FaultInjector, count_calls
from onnx import numpy_helper

from trtet_store import BlobStore, InsufficientSpaceError, recover
from trtet_store.bench.measure import bytes_written
from trtet_store.formats import onnx as fo
from trtet_store.io import fs

MiB = 1 << 20


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(512, 1024)
        self.b = torch.nn.Linear(1024, 512)
        self.c = torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The model as torch.onnx.export writes it (weights inline), and an input."""
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(3, 512)
    path = tmp_path_factory.mktemp("export") / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (x,), path, dynamo=False, input_names=["x"])
    return path, x.numpy()


def run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(os.fspath(path)).run(None, {"x": x})[0]


def weights(model: onnx.ModelProto, base: Path) -> dict[str, bytes]:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    onnx.load_external_data_for_model(model, os.fspath(base))
    return {t.name: numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


def test_exported_model_loads_checks_and_runs_the_same(exported, tmp_path):
    src, x = exported
    model = onnx.load(src)
    before = model.SerializeToString()
    reports = fo.save_model(model, tmp_path / "net.onnx", location="net.onnx.data")
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert [r.path.name for r in reports] == ["net.onnx", "net.onnx.data"]
    assert (tmp_path / "net.onnx").stat().st_size < 4096  # weights are all external
    onnx.checker.check_model(os.fspath(tmp_path / "net.onnx"))
    loaded = onnx.load(tmp_path / "net.onnx")
    assert weights(loaded, tmp_path) == weights(model, src.parent)
    np.testing.assert_array_equal(run(tmp_path / "net.onnx", x), run(src, x))
    # Same tensors external as onnx's own writer chooses, with the same threshold.
    onnx.save_model(onnx.load(src), tmp_path / "ref.onnx", save_as_external_data=True,
                    location="ref.data")
    ref = onnx.load(tmp_path / "ref.onnx", load_external_data=False)
    ours = onnx.load(tmp_path / "net.onnx", load_external_data=False)
    external = [t.name for t in ours.graph.initializer if t.data_location == 1]
    assert external == [t.name for t in ref.graph.initializer if t.data_location == 1]
    for t in ours.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if info:
            assert int(info["offset"]) % 64 == 0


def test_resave_with_one_initializer_changed_replaces_the_data_file(exported, tmp_path):
    src, x = exported
    path, data = tmp_path / "net.onnx", tmp_path / "net.data"
    fo.save_model(onnx.load(src), path, location="net.data")
    first = data.stat().st_size
    # Load without the data (what a tool editing a large model does), change one initializer.
    model = onnx.load(path, load_external_data=False)
    i = next(k for k, t in enumerate(model.graph.initializer) if t.name == "c.weight")
    smaller = np.zeros((10, 512), dtype=np.float32)
    smaller[:, :8] = 1.0
    model.graph.initializer[i].CopyFrom(numpy_helper.from_array(smaller, "c.weight"))
    fo.save_model(model, path, location="net.data")
    lengths = []
    for t in onnx.load(path, load_external_data=False).graph.initializer:
        info = {e.key: int(e.value) for e in t.external_data if e.key != "location"}
        if info:
            lengths.append((info["offset"], info["length"]))
    end = max(o + n for o, n in lengths)
    assert data.stat().st_size == end == first  # same tensor sizes: exactly the same size
    onnx.checker.check_model(os.fspath(path))
    got = weights(onnx.load(path, load_external_data=False), tmp_path)
    assert got["c.weight"] == smaller.tobytes()
    # b.weight as float16 (2 MiB -> 1 MiB): the data file shrinks to exactly the new layout.
    model = onnx.load(path, load_external_data=False)
    k = next(k for k, t in enumerate(model.graph.initializer) if t.name == "b.weight")
    model.graph.initializer[k].CopyFrom(
        numpy_helper.from_array(np.ones((1024, 512), np.float16), "b.weight"))
    fo.save_model(model, path, location="net.data")
    lengths = []
    for t in onnx.load(path, load_external_data=False).graph.initializer:
        info = {e.key: int(e.value) for e in t.external_data if e.key != "location"}
        if info:
            lengths.append((info["offset"], info["length"]))
    assert data.stat().st_size == max(o + n for o, n in lengths) < first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.data", "net.onnx"]


def test_onnx_own_resave_appends_where_ours_replaces(exported, tmp_path, monkeypatch):
    """The bug the adapter exists for (sparsezoo#320): onnx appends to an existing data file."""
    src, _ = exported
    # onnx checks whether 'location' exists relative to the working directory, not the model's.
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    onnx.save_model(onnx.load(src), tmp_path / "a.onnx", save_as_external_data=True,
                    location="elsewhere.data")
    once = (tmp_path / "elsewhere.data").stat().st_size
    m = onnx.load(tmp_path / "a.onnx")
    os.rename(tmp_path / "a.onnx", tmp_path / "b.onnx")
    onnx.save_model(m, tmp_path / "a.onnx", save_as_external_data=True, location="elsewhere.data")
    assert (tmp_path / "elsewhere.data").stat().st_size == 2 * once
    fo.save_model(onnx.load(tmp_path / "a.onnx"), tmp_path / "a.onnx", location="elsewhere.data")
    assert (tmp_path / "elsewhere.data").stat().st_size <= once + 64 * 8


def test_a_fault_at_any_call_keeps_both_old_files(exported, tmp_path):
    src, _ = exported
    path, data = tmp_path / "net.onnx", tmp_path / "net.data"
    fo.save_model(onnx.load(src), path, location="net.data")
    old = (file_digest(path), file_digest(data))
    model = onnx.load(path, load_external_data=False)
    # float16: the .onnx changes too (type, offsets), so old and new halves cannot pass as one.
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.full((1024, 512), 0.5, np.float16), model.graph.initializer[0].name))

    def resave():
        fo.save_model(model, path, location="net.data")

    total = count_calls(resave)
    new = (file_digest(path), file_digest(data))
    assert new[0] != old[0] and new[1] != old[1]
    fo.save_model(onnx.load(src), path, location="net.data")
    assert (file_digest(path), file_digest(data)) == old
    for n in range(1, total + 1):
        with FaultInjector(fail_at=n, mode="eio") as inj, contextlib.suppress(OSError):
            resave()
        assert inj.fired
        if any(p.name.startswith(".") for p in tmp_path.iterdir()):
            recover(tmp_path)
        now = (file_digest(path), file_digest(data))
        assert now in (old, new), f"call {n} ({inj.fired}): the .onnx and its data disagree"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["net.data", "net.onnx"]
        if now == new:
            fo.save_model(onnx.load(src), path, location="net.data")


def test_staged_and_external_tensors_are_cloned_at_page_offsets(exported, make_fs):
    src, x = exported
    mnt = make_fs("xfs", 400)
    fs.capabilities.clear()
    first = mnt / "first"
    first.mkdir()
    fo.save_model(onnx.load(src), first / "net.onnx", location="net.data", alignment=4096)
    model = onnx.load(first / "net.onnx", load_external_data=False)
    store = BlobStore(mnt / "staging")
    a = numpy_helper.to_array(onnx.load(src).graph.initializer[0])
    blob = store.put((a * 2).tobytes())
    out = mnt / "second"
    out.mkdir()
    before = bytes_written()
    reports = fo.save_model(model, out / "net.onnx", location="net.data", alignment=4096,
                            base_dir=first, tensors={model.graph.initializer[0].name: blob})
    written = bytes_written() - before
    placed = reports[1].placements
    big = [p for p in placed if p.size >= 4096 * 4]
    assert big and all(p.placement == "clone" for p in big), [p.reason for p in placed]
    assert written < MiB
    np.testing.assert_array_equal(
        numpy_helper.to_array(onnx.load(out / "net.onnx").graph.initializer[0]), a * 2)
    onnx.checker.check_model(os.fspath(out / "net.onnx"))
    store.close()


def test_bad_locations_and_arguments_write_nothing(exported, tmp_path):
    src, _ = exported
    model = onnx.load(src)
    (tmp_path / "d").mkdir()
    os.symlink("/tmp", tmp_path / "d" / "escape")
    for location in ("/tmp/x.data", "../x.data", "a/../../x.data", "", "escape/x.data",
                     "net.onnx"):
        with pytest.raises(ValueError, match="location"):
            fo.save_model(model, tmp_path / "d" / "net.onnx", location=location)
    with pytest.raises(TypeError, match="location"):
        fo.save_model(model, tmp_path / "d" / "net.onnx")
    with pytest.raises(TypeError, match="unexpected keyword"):
        fo.save_model(model, tmp_path / "d" / "net.onnx", location="x", save_as_external_data=True)
    with pytest.raises(ValueError, match="no initializer"):
        fo.save_model(model, tmp_path / "d" / "net.onnx", location="x",
                      tensors={"nope": BlobStore(tmp_path / "s").put(b"1234")})
    bad = onnx.load(src, load_external_data=False)
    onnx.external_data_helper.set_external_data(bad.graph.initializer[0], "../../etc/passwd")
    with pytest.raises(ValueError, match="inside"):
        fo.save_model(bad, tmp_path / "d" / "net.onnx", location="x")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["escape"]


ONNX_MEMORY_CHILD = """
import os, sys, numpy as np, onnx
from onnx import helper, numpy_helper
from trtet_store import BlobStore
from trtet_store.bench.measure import (current_rss_bytes, peak_rss_bytes, reset_peak_rss,
                                      return_freed_buffers)
from trtet_store.formats import onnx as fo
# A fixed mmap threshold: glibc's moving one keeps freed 16 MiB blocks resident,
# and the next copies reuse them unseen by the RSS peak.
assert return_freed_buffers()
where, staged = sys.argv[1], sys.argv[2] == "store"
n = 2048  # 8 initializers of 16 MiB
inits = [numpy_helper.from_array(np.full((n, n), i + 0.5, np.float32), f"w{i}") for i in range(8)]
nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i-1}", f"w{i}"], [f"h{i}"])
         for i in range(8)]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, n])],
                          [helper.make_tensor_value_info("h7", 1, [1, n])], inits)
model = helper.make_model(graph)
del inits
store = BlobStore(os.path.join(where, ".staging")) if staged else None
base = current_rss_bytes()
assert reset_peak_rss()
fo.save_model(model, os.path.join(where, "m.onnx"), location="m.data", alignment=4096, store=store)
print(peak_rss_bytes() - base, os.path.getsize(os.path.join(where, "m.data")))
print(sorted(os.listdir(os.path.join(where, ".staging"))) if staged else [])
"""


def test_a_store_bounds_memory_to_one_tensor(make_fs):
    mnt = make_fs("xfs", 600)
    fs.capabilities.clear()
    grown = {}
    for mode in ("store", "memory"):
        where = mnt / mode
        where.mkdir()
        out = subprocess.run([sys.executable, "-c", ONNX_MEMORY_CHILD, os.fspath(where), mode],
                             check=True, capture_output=True, text=True).stdout
        out = out.split("\n")
        growth, size = (int(v) for v in out[0].split())
        assert size == 8 * 16 * MiB
        grown[mode] = growth
        if mode == "store":
            assert "blob" not in out[1], out[1]  # the staged copies were released
            onnx.checker.check_model(os.fspath(where / "m.onnx"))
            back = onnx.load(where / "m.onnx")
            assert numpy_helper.to_array(back.graph.initializer[7])[0, 0] == 7.5
    # Without a store every copy stays until the write returns; with one, one at a time.
    # (RSS counts pages, and the interpreter's own may shrink by a few KiB meanwhile:
    # 134,172,672 bytes were seen against 128 MiB of copies.)
    assert grown["memory"] >= 7 * 16 * MiB, grown
    assert grown["store"] < 3 * 16 * MiB, grown


def test_an_onnx_ir_model_is_saved_the_same(exported, tmp_path):
    import onnx_ir as ir

    src, x = exported
    model = ir.from_proto(onnx.load(src))
    fo.save_model(model, tmp_path / "net.onnx", location="net.data")
    onnx.checker.check_model(os.fspath(tmp_path / "net.onnx"))
    np.testing.assert_array_equal(run(tmp_path / "net.onnx", x), run(src, x))
    with pytest.raises(TypeError, match="ModelProto or an onnx_ir.Model"):
        fo.save_model(object(), tmp_path / "x.onnx", location="x.data")


def test_full_disk_keeps_both_old_files(exported, make_fs):
    src, x = exported
    mnt = make_fs("ext4", 64)
    fo.save_model(onnx.load(src), mnt / "net.onnx", location="net.data")
    old = (file_digest(mnt / "net.onnx"), file_digest(mnt / "net.data"))
    big = onnx.load(src)
    for k in range(12):  # 12 x 4 MiB more than the disk has left
        big.graph.initializer.append(numpy_helper.from_array(
            np.full((1 << 20,), k, np.float32), f"extra{k}"))
    with pytest.raises(InsufficientSpaceError):
        fo.save_model(big, mnt / "net.onnx", location="net.data")
    assert (file_digest(mnt / "net.onnx"), file_digest(mnt / "net.data")) == old
    assert sorted(p.name for p in mnt.iterdir()) == ["lost+found", "net.data", "net.onnx"]
    np.testing.assert_array_equal(run(mnt / "net.onnx", x), run(src, x))
