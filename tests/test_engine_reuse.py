"""An export that dies after its TensorRT build leaves engines the next export reuses.

A child process (a warm one, tests/warm.py: forked from a server that imported torch
once) compiles with the stubbed builder and is killed (``os._exit``)
while the program is being written; the staged engines and the build record
outlive it as orphans. The same export run again must take them over and write
the program without building: its builder raises if called.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import warm
import xxhash

import trtet_store
from trtet_store.export import engine_reuse
from trtet_store.export import tensorrt as trt
from trtet_store.io.orphans import list_orphans
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

CRASHING_EXPORT = """
import os, sys
import trtet_store
from trtet_store.io import writer
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

def die(*args, **kwargs):
    os._exit(3)  # killed while the program is written: the build is done

writer.write_files = die
builder = FakeBuilder(engine_sizes=(3 << 20, 2 << 20))
module, inputs = linear_relu()
if {other_weights}:
    with __import__("torch").no_grad():
        module[0].weight.add_(1)
with installed(builder):
    trtet_store.compile_and_save(module, inputs, {out!r})
"""


class MustNotBuild:
    def __call__(self, *args, **kwargs):
        raise AssertionError("the engines were built again")


def _crash(out: Path, *, other_weights: bool = False) -> None:
    code = CRASHING_EXPORT.format(out=os.fspath(out), other_weights=other_weights)
    done = warm.run(code, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]


def _staged_digests(staging: Path) -> list[str]:
    digests = []
    for o in list_orphans(staging):
        if o.metadata.get("kind") == engine_reuse.ENGINE_KIND:
            digests.append(xxhash.xxh3_128_hexdigest(o.path.read_bytes()))
    return sorted(digests)


def test_a_rerun_after_a_crash_reuses_the_staged_engines(here_fs, upstream_trt):
    out = here_fs / "model.pte"
    _crash(out)
    staging = here_fs / ".trtet-staging"
    kinds = sorted(o.metadata.get("kind") for o in list_orphans(staging))
    assert kinds == sorted([engine_reuse.ENGINE_KIND] * 2 + [engine_reuse.RECORD_KIND])
    staged = _staged_digests(staging)
    assert not out.exists()

    module, inputs = linear_relu()
    with installed(MustNotBuild()):
        report = trtet_store.compile_and_save(module, inputs, out)
    assert report.placements == ["insert", "move"]
    from test_inline_engines import delegates

    engines = [xxhash.xxh3_128_hexdigest(upstream_trt.deserialize_engine(blob)[0])
               for _, blob in delegates(out)]
    assert sorted(engines) == staged
    # Everything the dead export staged was used and released: nothing left behind.
    assert not staging.exists() or list_orphans(staging) == []


def test_another_build_does_not_reuse_them_and_keeps_them(here_fs):
    out = here_fs / "model.pte"
    _crash(out, other_weights=True)
    staging = here_fs / ".trtet-staging"
    before = sorted(o.path for o in list_orphans(staging))
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(1 * MiB,))
    with installed(builder):
        trtet_store.compile_and_save(module, inputs, out)
    assert len(builder.built) == 1  # built: the weights differ
    # The other build's blobs are kept for their own export, not collected.
    assert sorted(o.path for o in list_orphans(staging)) == before


def test_fingerprint_follows_weights_settings_and_input_shapes():
    module, inputs = linear_relu()
    exported = torch.export.export(module, inputs)
    fp = engine_reuse.build_fingerprint(exported, inputs, None, {})
    assert fp == engine_reuse.build_fingerprint(torch.export.export(module, inputs), inputs,
                                                None, {})
    assert fp != engine_reuse.build_fingerprint(exported, inputs, None, {"optimization_level": 5})
    bigger = (torch.randn(4, 16),)
    assert fp != engine_reuse.build_fingerprint(torch.export.export(module, bigger), bigger,
                                                None, {})
    with torch.no_grad():
        module[0].bias.add_(1)
    assert fp != engine_reuse.build_fingerprint(torch.export.export(module, inputs), inputs,
                                                None, {})


def test_a_changed_staged_engine_is_built_again(here_fs):
    out = here_fs / "model.pte"
    _crash(out)
    staging = here_fs / ".trtet-staging"
    victim = next(o for o in list_orphans(staging)
                  if o.metadata.get("kind") == engine_reuse.ENGINE_KIND)
    with open(victim.path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(3 * MiB, 2 * MiB))
    with installed(builder):
        trtet_store.compile_and_save(module, inputs, out)
    assert len(builder.built) == 2
    assert all(e.blob.closed for e in trt._engines.values())


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))
