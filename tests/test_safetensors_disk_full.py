"""Issue 34 item 16 (safetensors): a disk filling mid-write is InsufficientSpaceError, not errno 28.

The preflight finds enough space; then another writer takes every free byte
(a file fallocated from the first progress call, after the temp file is
made). ``save_file`` and ``save_sharded`` must raise an error that names the
path, what the write needed and what is free, as the preflight's refusal
does, with nothing lost: the previous file byte-identical, no stray file.
"""

from __future__ import annotations

import errno

import pytest
import torch
from digests import file_digest
from test_bad_inputs import fill
from test_formats_safetensors import random_tensor

from trtet_store import InsufficientSpaceError
from trtet_store.formats import safetensors as sf

MiB = 1 << 20


@pytest.mark.parametrize("sharded", [False, True], ids=["save_file", "save_sharded"])
def test_a_disk_filled_after_the_preflight_names_path_needed_and_free(make_fs, sharded):
    mnt = make_fs("ext4", 64)
    old = {"w": random_tensor(torch.float32, (MiB // 4,), seed=1)}
    tensors = {f"w{i}": random_tensor(torch.float32, (4 * MiB // 4,), seed=i) for i in range(4)}
    path = mnt / "model.safetensors"
    if sharded:
        sf.save_sharded(old, mnt, max_shard_size=8 * MiB)
        path = mnt / "model.safetensors.index.json"
    else:
        sf.save_file(old, path)
    before = {p.name: file_digest(p) for p in mnt.iterdir() if p.is_file()}
    fillers = []

    def progress(done, total):
        if not fillers:  # the preflight passed and the temp file exists
            fillers.append(fill(mnt))

    with pytest.raises(InsufficientSpaceError) as info:
        if sharded:
            sf.save_sharded(tensors, mnt, max_shard_size=8 * MiB, progress=progress)
        else:
            sf.save_file(tensors, path, progress=progress)
    err = info.value
    assert fillers, "the disk was not filled: the state under test was not reached"
    assert err.errno == errno.ENOSPC
    assert err.needed >= 16 * MiB and err.available < err.needed
    assert err.path in str(err) and "available" in str(err) and "took it" in str(err)
    assert err.path.startswith(str(mnt))
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC
    fillers[0].unlink()
    # Nothing lost, nothing left.
    assert {p.name: file_digest(p) for p in mnt.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in mnt.iterdir()) == sorted([*before, "lost+found"])
