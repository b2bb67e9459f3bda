"""trtet_store.save / save_program against ExecuTorch's own save, on real filesystems."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
import xxhash
from digests import file_digest
from programs import (
    NamedEntry,
    executorch_outputs,
    named_data_program,
    standard_entries,
    write_payload_file,
    xnnpack_linear_program,
)
from versions import needs_file_backed_data, needs_ptd_runtime

import trtet_store
from trtet_store.io.units import MiB


def ptd_entries(ptd: Path) -> dict[str, str]:
    """Digest of every named entry of a .ptd, read by ExecuTorch's own reader."""
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(ptd.read_bytes()))
    return {k: xxhash.xxh3_128_hexdigest(bytes(payload.buffers[e.buffer_index]))
            for k, e in payload.named_data.items()}


@needs_file_backed_data
def test_our_save_fits_where_executorchs_own_save_cannot(make_fs, caplog):
    """Sized for one copy of the payloads: ExecuTorch's copy fails, our move succeeds."""
    from executorch.exir._serialize._cord import FileBackedData

    mnt = make_fs("ext4", 300)
    payload_dir = mnt / "staging"
    payload_dir.mkdir()
    sizes = (100 * MiB, 90 * MiB)
    files = [write_payload_file(payload_dir / f"p{i}.bin", n, seed=i)
             for i, n in enumerate(sizes)]
    want = {f"engine{i}": file_digest(f) for i, f in enumerate(files)}
    entries = [NamedEntry(f"engine{i}", FileBackedData(os.fspath(f), cleanup=True), 16, "eng")
               for i, f in enumerate(files)]
    program = named_data_program(entries)
    assert trtet_store.io.fs.free_bytes(mnt) < sum(sizes) + 16 * MiB

    # ExecuTorch's own write of the .ptd: it copies, and the disk is too small.
    et_dir = mnt / "et"
    et_dir.mkdir()
    with pytest.raises(OSError) as info:
        program.write_tensor_data_to_file(os.fspath(et_dir))
    assert info.value.errno == 28  # ENOSPC, propagated by write_tensor_data_to_file
    left = et_dir / "eng.ptd"
    assert left.exists() and left.stat().st_size < sum(sizes)  # a torn file stays behind
    # ... and its save() of the .pte swallows errors: it only logs.
    os.unlink(left)

    out = mnt / "out"
    out.mkdir()
    reports = trtet_store.save_program(program, out / "model.pte", consume=True)
    ptd = reports[1]
    assert ptd.path == out / "eng.ptd"
    assert [p.placement for p in ptd.placements] == ["move", "move"]
    assert ptd_entries(out / "eng.ptd") == want
    assert not any(f.exists() for f in files)


@needs_file_backed_data
def test_executorch_save_swallows_errors_ours_raises(here_fs, caplog):
    """ExecuTorch truncates the destination and logs; ours raises and keeps it."""
    from executorch.exir._serialize._cord import FileBackedData

    payload = write_payload_file(here_fs / "p.bin", MiB, seed=5)
    program = named_data_program([NamedEntry("w", FileBackedData(os.fspath(payload)), 16)])
    dest = here_fs / "model.pte"
    program.save(os.fspath(dest))
    good = dest.read_bytes()
    os.unlink(payload)
    with caplog.at_level(logging.ERROR):
        program.save(os.fspath(dest))  # returns normally
    assert len(dest.read_bytes()) < len(good)  # the valid file was truncated
    dest.write_bytes(good)
    with pytest.raises(FileNotFoundError):
        trtet_store.save(program, dest)
    assert dest.read_bytes() == good
    assert sorted(p.name for p in here_fs.iterdir()) == ["model.pte"]


@needs_file_backed_data
def test_consume_false_leaves_every_source_identical_and_matches_executorch(here_fs):
    payloads = standard_entries(here_fs / "src", size=2 * MiB)
    program = named_data_program(payloads.entries)
    sources = {p.name: file_digest(p) for p in (here_fs / "src").iterdir()}
    (here_fs / "ours").mkdir()
    reports = trtet_store.save_program(program, here_fs / "ours" / "program.pte")
    assert {p.name: file_digest(p) for p in (here_fs / "src").iterdir()} == sources
    assert all(r.placement == "copy" for w in reports for r in w.placements)
    theirs = executorch_outputs(program, here_fs / "theirs")
    ours = {p.name: p.read_bytes() for p in sorted((here_fs / "ours").iterdir())}
    assert ours == theirs


@needs_file_backed_data
def test_resized_payload_raises_and_leaves_the_destination(here_fs):
    from executorch.exir._serialize._cord import FileBackedData

    payload = write_payload_file(here_fs / "p.bin", MiB, seed=6)
    program = named_data_program([NamedEntry("w", FileBackedData(os.fspath(payload)), 16)])
    dest = here_fs / "model.pte"
    dest.write_bytes(b"previous program")
    with open(payload, "ab") as f:
        f.write(b"grown")
    with pytest.raises(ValueError, match="changed|size"):
        trtet_store.save(program, dest, consume=True)
    assert dest.read_bytes() == b"previous program"
    assert sorted(p.name for p in here_fs.iterdir()) == ["model.pte", "p.bin"]


@pytest.mark.parametrize("tag", ["../x", "/abs", "a/b", ""])
def test_bad_tags_are_refused_with_nothing_written(here_fs, tag):
    with pytest.raises(ValueError):
        named = [NamedEntry("w", b"x" * 100, 16, tag)]
        program = named_data_program(named)
        trtet_store.save_program(program, here_fs / "m.pte")
    assert list(here_fs.iterdir()) == []


@needs_ptd_runtime
def test_runtime_runs_the_xnnpack_program_we_wrote(here_fs):
    from executorch.runtime import Runtime

    built = xnnpack_linear_program(external_tag="model")
    reports = trtet_store.save_program(built.manager, here_fs / "mlp.pte")
    assert [r.path.name for r in reports] == ["mlp.pte", "model.ptd"]
    loaded = Runtime.get().load_program(os.fspath(here_fs / "mlp.pte"),
                                        data_path=os.fspath(here_fs / "model.ptd"))
    (out,) = loaded.load_method("forward").execute(list(built.inputs))
    torch.testing.assert_close(out, built.module(*built.inputs), rtol=1e-4, atol=1e-5)
