"""``trtet-store compile-and-save`` on a small disk, and its command line (issue 22, 6 and 10).

The TensorRT build is stubbed at its seam; the filesystems are real loop
mounts, sized from what they report free after mkfs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtet_store.cli import main
from trtet_store.export import tensorrt as trt
from trtet_store.io.names import STAGING_DIR
from trtet_store.io.orphans import list_orphans
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed

FACTORY = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), \\
        (torch.randn(2, 16),)
"""


@pytest.fixture
def factory(tmp_path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(FACTORY)
    return path


def _free(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("order", ["out-last", "out-before-method"])
def test_a_factory_with_method_gets_the_intended_message(factory, tmp_path, capsys, order):
    out = os.fspath(tmp_path / "m.pte")
    target = f"{factory}:make"
    argv = (["compile-and-save", target, "--method", f"a={target}", out] if order == "out-last"
            else ["compile-and-save", target, out, "--method", f"a={target}"])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "give either MODULE.py:FACTORY or --method NAME=MODULE.py:FACTORY" in err
    assert "unrecognized arguments" not in err
    assert not (tmp_path / "m.pte").exists()


def test_methods_of_one_build_stage_their_engine_once_on_a_disk_too_small_for_two(
        make_fs, factory, capsys):
    fs = make_fs("ext4", 256)
    # One fits with the write's headroom (a chunk, 64 MiB, in case a placement
    # falls back to a move); two do not fit at all.
    engine = (_free(fs) - 80 * MiB) // MiB * MiB
    assert 2 * engine > _free(fs)
    builder = FakeBuilder(engine_sizes=(engine,))
    target = f"{factory}:make"
    with installed(builder):
        status = main(["compile-and-save", "--no-progress", "--method", f"prefill={target}",
                       "--method", f"decode={target}", os.fspath(fs / "m.pte")])
    assert status == 0, capsys.readouterr().err
    assert len(builder.built) == 1  # one build for both methods
    assert (fs / "m.pte").stat().st_size < engine + MiB  # the engine is in it once
    assert list_orphans(fs / STAGING_DIR) == []


def test_a_full_disk_names_the_file_the_sizes_and_what_to_do(make_fs, factory, capsys):
    fs = make_fs("ext4", 64)
    free = _free(fs)
    builder = FakeBuilder(engine_sizes=(free + 8 * MiB,))
    with installed(builder):
        status = main(["compile-and-save", "--no-progress", f"{factory}:make",
                       os.fspath(fs / "m.pte")])
    assert status == 1
    err = capsys.readouterr().err
    assert "[Errno 28]" not in err
    assert f"not enough free space to stage a TensorRT engine in {fs / STAGING_DIR}" in err
    assert "MiB is available" in err and "needs more than" in err
    assert "stage on a larger filesystem" in err
    assert not (fs / "m.pte").exists()


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))
