"""The refit seam (issue 46 item 3): which builds are refittable, and the stub refitter.

The real refit (``tensorrt.refit_engine``) needs TensorRT and a GPU and is
not run here; :class:`FakeRefitter` stands at its seam, its engine a
function of the structure engine and the new weights that a test computes.
"""

from __future__ import annotations

import pytest
import torch
import xxhash

from trtet_store.export import tensorrt
from trtet_store.io import BlobStore
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import (
    FakeBuilder,
    FakeRefitter,
    installed,
    linear_relu,
    stage_fake_engine,
    weights_digest,
)


@pytest.mark.parametrize(("settings", "expected"), [
    ({}, False),  # Torch-TensorRT's default: immutable_weights=True
    ({"immutable_weights": True}, False),
    ({"immutable_weights": False}, True),
    ({"immutable_weights": False, "refit_identical_engine_weights": False}, True),
    ({"immutable_weights": False, "refit_identical_engine_weights": True}, False),
])
def test_a_build_is_refittable_only_with_mutable_weights_and_not_identical_only(settings,
                                                                                expected):
    assert tensorrt.refittable(settings) is expected


def _digest(path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


def test_the_fake_refit_streams_what_a_test_computes_and_leaves_the_source(here_fs):
    module, inputs = linear_relu()
    store = BlobStore(here_fs / "store")
    try:
        source, source_digest = stage_fake_engine(store, 3 * MiB + 5, seed=7)
        before = source.path.read_bytes()
        with torch.no_grad():
            module[0].weight.mul_(-1)
        program = torch.export.export(module, inputs)
        refitter = FakeRefitter()
        with installed(FakeBuilder(), refitter=refitter), store.writer() as w:
            tensorrt.refit_engine(source.path, program, inputs, None,
                                  {"immutable_weights": False}, w)
        assert w.blob.path.read_bytes() == FakeRefitter.expected(before, program)
        assert refitter.refits == [(str(source.path), weights_digest(program))]
        assert _digest(source.path) == source_digest  # the structure entry is untouched
        # A refit of a refit with the same weights is the same engine; other weights differ.
        with installed(FakeBuilder(), refitter=FakeRefitter()), store.writer() as again:
            tensorrt.refit_engine(w.blob.path, program, inputs, None, {}, again)
        assert again.blob.path.read_bytes() == w.blob.path.read_bytes()
        other = torch.export.export(linear_relu()[0], inputs)
        assert FakeRefitter.expected(before, other) != FakeRefitter.expected(before, program)
    finally:
        store.close()


def test_a_failed_refit_raises_before_writing_and_the_seam_is_restored(here_fs):
    module, inputs = linear_relu()
    store = BlobStore(here_fs / "store")
    real = tensorrt.refit_engine
    try:
        source, _ = stage_fake_engine(store, MiB, seed=1)
        program = torch.export.export(module, inputs)
        written = []
        with pytest.raises(tensorrt.RefitError, match="weight unset"), \
                installed(FakeBuilder(), refitter=FakeRefitter(fail="weight unset")):
            tensorrt.refit_engine(source.path, program, inputs, None, {}, written)
        assert written == []
    finally:
        store.close()
    assert tensorrt.refit_engine is real
