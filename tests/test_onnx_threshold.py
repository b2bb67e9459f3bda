"""Issue 34 item 8: which tensors go external is onnx's own choice, at every boundary size.

onnx measures a tensor by ``sys.getsizeof(raw_data)``: its length plus the
bytes object's overhead (33 bytes on 64-bit CPython), so a 991-byte tensor
goes external at the default threshold of 1024. Every size around each
threshold, initializers and (with ``convert_attribute``) node attributes,
saved by ``onnx.save_model`` and by ours: the same tensors external.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtet_store.formats import onnx as fo


def _model(sizes: range) -> onnx.ModelProto:
    """A graph with an initializer and a Constant of each size (uint8, raw_data)."""
    inits, nodes = [], []
    for n in sizes:
        data = (np.arange(n) % 251).astype(np.uint8)
        inits.append(numpy_helper.from_array(data, name=f"init_{n}"))
        nodes.append(helper.make_node("Constant", [], [f"const_{n}"],
                                      value=numpy_helper.from_array(data, name=f"attr_{n}")))
    outputs = [helper.make_tensor_value_info(f"const_{n}", TensorProto.UINT8, [n])
               for n in sizes]
    graph = helper.make_graph(nodes, "boundary", [], outputs, initializer=inits)
    return helper.make_model(graph)


def _external(path) -> set[str]:
    """Names of the tensors ``path`` keeps in external data."""
    model = onnx.load(os.fspath(path), load_external_data=False)
    tensors = list(model.graph.initializer) + [
        a.t for node in model.graph.node for a in node.attribute if a.HasField("t")]
    return {t.name for t in tensors if t.data_location == TensorProto.EXTERNAL}


@pytest.mark.parametrize("threshold", [1024, 64, 4096])
@pytest.mark.parametrize("convert_attribute", [False, True])
def test_the_same_tensors_go_external_as_with_onnx(tmp_path, threshold, convert_attribute):
    sizes = range(max(0, threshold - 40), threshold + 3)
    theirs_dir, ours_dir = tmp_path / "onnx", tmp_path / "ours"
    theirs_dir.mkdir()
    ours_dir.mkdir()
    onnx.save_model(_model(sizes), os.fspath(theirs_dir / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.data",
                    size_threshold=threshold, convert_attribute=convert_attribute)
    fo.save_model(_model(sizes), ours_dir / "m.onnx", location="m.data",
                  size_threshold=threshold, convert_attribute=convert_attribute)
    theirs, ours = _external(theirs_dir / "m.onnx"), _external(ours_dir / "m.onnx")
    # The boundary is inside the sizes tried: some inline, some external.
    assert f"init_{threshold + 2}" in theirs and f"init_{sizes[0]}" not in theirs
    assert sorted(ours ^ theirs) == [], (
        f"external only in ours: {sorted(ours - theirs)}; only in onnx's: {sorted(theirs - ours)}")
    onnx.checker.check_model(os.fspath(ours_dir / "m.onnx"))
