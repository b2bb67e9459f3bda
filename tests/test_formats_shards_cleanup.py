"""A sharded re-save removes the old checkpoint's shards the new index does not name.

As ``huggingface_hub.save_torch_state_dict`` does, but never before the new
index is durable: a save that fails (full disk, a fault at any call) removes
nothing, and one that dies between its commit and its cleanup leaves only
unreferenced files, which the next save removes. Files that are not the old
checkpoint's (a user's own ``notes.safetensors``, another prefix's shards,
look-alike names) are never touched; neither does ``save_file`` remove anything.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from digests import file_digest
from faults import FaultInjector, SimulatedCrash, count_calls
from safetensors import safe_open
from safetensors.torch import save_file as reference_save

from trtet_store import InsufficientSpaceError, recover
from trtet_store.formats import safetensors as sf

KiB = 1 << 10
MiB = 1 << 20
INDEX = "model.safetensors.index.json"


def shard_names(n: int, prefix: str = "model") -> list[str]:
    return [f"{prefix}-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]


def state_dict(count: int, nbytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors of ``nbytes`` each, distinct per seed and per tensor."""
    return {f"layer.{i}.weight": torch.arange(nbytes // 4, dtype=torch.float32) + 1000 * seed + i
            for i in range(count)}


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def digests(directory: Path) -> dict[str, str]:
    return {p.name: file_digest(p) for p in directory.iterdir() if p.is_file()}


def load_checkpoint(directory: Path, prefix: str = "model") -> dict[str, bytes]:
    """Every tensor, read as a reader does it: through the index. A missing shard fails."""
    index = json.loads((directory / f"{prefix}.safetensors.index.json").read_text())
    out = {}
    for name, file in index["weight_map"].items():
        with safe_open(directory / file, framework="pt") as f:
            out[name] = f.get_tensor(name).numpy().tobytes()
    return out


def as_bytes(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in tensors.items()}


def plant_bystanders(directory: Path) -> list[str]:
    """Files no save of prefix ``model`` may remove: none is the old checkpoint's."""
    one = {"x": torch.ones(4)}
    names = ["notes.safetensors",                       # the user's own
             "other-00003-of-00003.safetensors",        # another prefix's shard
             "other.safetensors.index.json",
             "model-3-of-3.safetensors",                # not five digits
             "model-00003-of-00003.safetensors.bak",
             "xmodel-00003-of-00003.safetensors",
             "model-\u0660\u0660\u0660\u0660\u0663-of-\u0660\u0660\u0660\u0660\u0663"
             ".safetensors"]                            # Arabic-Indic digits (Python's \d)
    for name in names:
        reference_save(one, directory / name)
    (directory / "model-00009-of-00009.safetensors").mkdir()  # a directory, not a file
    return names + ["model-00009-of-00009.safetensors"]


# --- what is removed --------------------------------------------------------------------------


def test_fewer_shards_remove_the_old_set_and_nothing_else(here_fs, caplog):
    tensors = state_dict(6, 64 * KiB)
    sf.save_sharded(tensors, here_fs, max_shard_size=128 * KiB)
    assert listing(here_fs) == sorted(shard_names(3) + [INDEX])
    bystanders = plant_bystanders(here_fs)
    kept = {n: d for n, d in digests(here_fs).items() if n in bystanders}

    # The same checkpoint in bigger shards: 2 files, every old name is stale.
    with caplog.at_level(logging.INFO, logger="trtet_store.formats"):
        reports = sf.save_sharded(tensors, here_fs, max_shard_size=192 * KiB)
    assert [r.path.name for r in reports] == shard_names(2) + [INDEX]
    assert reports.removed == [here_fs / n for n in shard_names(3)]
    assert listing(here_fs) == sorted(shard_names(2) + [INDEX] + bystanders)
    assert {n: d for n, d in digests(here_fs).items() if n in bystanders} == kept
    assert load_checkpoint(here_fs) == as_bytes(tensors)
    said = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert len(said) == 3
    assert all("named by the previous index" in m for m in said), said

    # More shards again: the 2-shard names go.
    reports = sf.save_sharded(tensors, here_fs, max_shard_size=64 * KiB)
    assert reports.removed == [here_fs / n for n in shard_names(2)]
    assert listing(here_fs) == sorted(shard_names(6) + [INDEX] + bystanders)
    assert load_checkpoint(here_fs) == as_bytes(tensors)
    # The same layout once more: nothing is stale.
    assert sf.save_sharded(tensors, here_fs, max_shard_size=64 * KiB).removed == []
    assert listing(here_fs) == sorted(shard_names(6) + [INDEX] + bystanders)


def test_one_file_to_shards_and_back(here_fs):
    tensors = state_dict(4, 64 * KiB)
    sf.save_sharded(tensors, here_fs)
    assert listing(here_fs) == sorted(["model.safetensors", INDEX])
    reports = sf.save_sharded(tensors, here_fs, max_shard_size=128 * KiB)
    assert reports.removed == [here_fs / "model.safetensors"]  # the old index named it
    assert listing(here_fs) == sorted(shard_names(2) + [INDEX])
    reports = sf.save_sharded(tensors, here_fs)
    assert reports.removed == [here_fs / n for n in shard_names(2)]
    assert listing(here_fs) == sorted(["model.safetensors", INDEX])
    assert load_checkpoint(here_fs) == as_bytes(tensors)


@pytest.mark.parametrize("index", ["missing", "not json", "no weight_map"])
def test_numbered_shards_no_index_names_are_removed(here_fs, index):
    """What a save that committed and died before its cleanup left: no index names those."""
    tensors = state_dict(4, 64 * KiB)
    sf.save_sharded(tensors, here_fs, max_shard_size=128 * KiB)
    left = shard_names(9)[3:5]
    for name in left:
        reference_save({"x": torch.zeros(2)}, here_fs / name)
    if index == "missing":
        (here_fs / INDEX).unlink()
    else:
        (here_fs / INDEX).write_text("{" if index == "not json" else '{"metadata": {}}')
    bystanders = plant_bystanders(here_fs)
    reports = sf.save_sharded(tensors, here_fs, max_shard_size=256 * KiB)  # one file
    assert reports.removed == sorted(here_fs / n for n in shard_names(2) + left)
    assert listing(here_fs) == sorted(["model.safetensors", INDEX] + bystanders)
    assert load_checkpoint(here_fs) == as_bytes(tensors)


@pytest.mark.parametrize("how", ["save_file", "died before its cleanup"])
def test_a_single_file_is_removed_once_shards_replace_it(here_fs, monkeypatch, how):
    """A ``model.safetensors`` the new index does not name: transformers would load it
    before it looks for the index, so it goes (huggingface_hub's pattern does the same)."""
    old, new = state_dict(4, 64 * KiB, seed=1), state_dict(4, 64 * KiB, seed=2)
    if how == "save_file":  # one file, no index at all
        sf.save_file(old, here_fs / "model.safetensors")
    else:  # the index named it, and the sharded save that replaced it died after its commit
        sf.save_sharded(old, here_fs)
        with monkeypatch.context() as m:
            m.setattr(sf, "remove_stale_shards", lambda *a: [])
            sf.save_sharded(new, here_fs, max_shard_size=128 * KiB)
        assert listing(here_fs) == sorted(["model.safetensors", INDEX] + shard_names(2))
    bystanders = plant_bystanders(here_fs)
    reports = sf.save_sharded(new, here_fs, max_shard_size=128 * KiB)
    assert reports.removed == [here_fs / "model.safetensors"]
    assert listing(here_fs) == sorted(shard_names(2) + [INDEX] + bystanders)
    assert load_checkpoint(here_fs) == as_bytes(new)


def test_an_old_index_names_only_files_in_its_directory(here_fs):
    """Names from the old index are data: a path, a directory, a non-shard file are kept."""
    ckpt = here_fs / "ckpt"
    ckpt.mkdir()
    (ckpt / "sub").mkdir()
    (ckpt / "adir.safetensors").mkdir()
    hostile = {"a": "../outside.safetensors", "b": "sub/inner.safetensors",
               "c": "config.json", "d": INDEX, "e": "adir.safetensors", "f": "/etc/hostname"}
    for path in (here_fs / "outside.safetensors", ckpt / "sub" / "inner.safetensors",
                 ckpt / "config.json"):
        path.write_bytes(b"keep me")
    (ckpt / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": hostile}))
    before = {p: file_digest(p) for p in (here_fs / "outside.safetensors",
                                          ckpt / "sub" / "inner.safetensors",
                                          ckpt / "config.json", Path("/etc/hostname"))}
    tensors = state_dict(2, 64 * KiB)
    reports = sf.save_sharded(tensors, ckpt, max_shard_size=64 * KiB)
    assert reports.removed == []
    assert {p: file_digest(p) for p in before} == before
    assert listing(ckpt) == sorted(shard_names(2) + [INDEX, "adir.safetensors", "config.json",
                                                     "sub"])
    assert load_checkpoint(ckpt) == as_bytes(tensors)


def test_save_file_removes_nothing(here_fs):
    tensors = state_dict(6, 64 * KiB)
    sf.save_sharded(tensors, here_fs, max_shard_size=128 * KiB)
    plant_bystanders(here_fs)
    before = listing(here_fs)
    sf.save_file(tensors, here_fs / "model.safetensors")
    sf.save_file({"x": torch.ones(3)}, here_fs / shard_names(2)[0])
    assert listing(here_fs) == sorted(before + ["model.safetensors", shard_names(2)[0]])
    assert load_checkpoint(here_fs) == as_bytes(tensors)


# --- when it is removed: only after the commit ------------------------------------------------


def test_full_disk_removes_nothing(make_fs):
    mnt = make_fs("ext4", 64)
    old_tensors = state_dict(3, 4 * MiB, seed=1)
    sf.save_sharded(old_tensors, mnt, max_shard_size=4 * MiB)
    old = digests(mnt)
    assert sorted(old) == sorted(shard_names(3) + [INDEX])
    before = listing(mnt)

    def unchanged() -> None:
        assert listing(mnt) == before
        assert digests(mnt) == old
        assert load_checkpoint(mnt) == as_bytes(old_tensors)

    # Refused by the preflight: 2 x 28 MiB does not fit beside the old 12 MiB.
    with pytest.raises(InsufficientSpaceError):
        sf.save_sharded(state_dict(2, 28 * MiB, seed=2), mnt, max_shard_size=28 * MiB)
    unchanged()
    # ENOSPC in the middle of the writing (the preflight passed): rolled back.
    new_tensors = state_dict(2, 6 * MiB, seed=3)
    for n in (2, 3, 4):  # pwrite 1 is the journal; then headers and tensors
        with FaultInjector(fail_at=n, mode="enospc", only=frozenset({"pwrite"})) as inj, \
                pytest.raises(OSError):
            sf.save_sharded(new_tensors, mnt, max_shard_size=6 * MiB)
        assert inj.fired
        unchanged()
    # The same save with room: now the old set goes (the faults above had something to remove).
    assert sf.save_sharded(new_tensors, mnt, max_shard_size=6 * MiB).removed == \
        [mnt / n for n in shard_names(3)]
    assert listing(mnt) == sorted(shard_names(2) + [INDEX, "lost+found"])
    assert load_checkpoint(mnt) == as_bytes(new_tensors)


def killed_at(n: int, action) -> bool:
    """Run ``action`` in a forked child that SIGKILLs itself at engine call ``n``.

    A real kill: the kernel drops the child's descriptors and locks, nothing
    of Python's cleanup runs. True if it died so, False if it finished.
    """
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 3
        try:
            with FaultInjector(fail_at=n, mode="crash"):
                action()
            code = 0
        except SimulatedCrash:
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status) == signal.SIGKILL
    assert os.WEXITSTATUS(status) == 0, f"call {n}: the child failed otherwise"
    return False


@pytest.mark.parametrize("mode", ["eio", "kill"])
def test_fault_at_any_call_then_the_next_save_cleans_up(here_fs, mode):
    """An error or a kill at any call of a shrinking re-save: before the commit the old
    checkpoint stays whole; after it the new one is read through its index and the stale
    shards are still there (the save did not finish, so it did not clean up), and the next
    save removes them."""
    old_tensors = state_dict(6, 16 * KiB, seed=1)
    new_tensors = state_dict(6, 16 * KiB, seed=2)
    bystanders = plant_bystanders(here_fs)

    def start() -> dict[str, str]:
        for name in set(listing(here_fs)) - set(bystanders):
            (here_fs / name).unlink()
        sf.save_sharded(old_tensors, here_fs, max_shard_size=32 * KiB)
        assert listing(here_fs) == sorted(shard_names(3) + [INDEX] + bystanders)
        return digests(here_fs)

    def resave() -> sf.ShardedReports:
        return sf.save_sharded(new_tensors, here_fs, max_shard_size=64 * KiB)

    old = start()
    total = count_calls(resave)
    new = digests(here_fs)
    seen = set()
    for n in range(1, total + 1):
        old = start()
        where = f"call {n} (killed)"
        if mode == "kill":
            assert killed_at(n, resave), f"call {n}: the save finished"
        else:
            try:
                with FaultInjector(fail_at=n, mode=mode) as inj:
                    reports = resave()
            except OSError:
                assert inj.fired
                where = f"call {n} ({inj.fired})"
            else:  # an error the engine may ignore: closing a temp file after the write, or
                # the cleanup's directory fsync (its last three calls), logged
                assert inj.fired == "close" or n > total - 3, \
                    f"call {n} ({inj.fired}) failed and was ignored"
                assert reports.removed == [here_fs / k for k in shard_names(3)], f"call {n}"
                assert digests(here_fs) == new
                continue
        recover(here_fs)  # what the next write of these destinations does first
        if file_digest(here_fs / INDEX) == old[INDEX]:
            seen.add("before")
            assert digests(here_fs) == old, f"{where}: the old set changed"
            assert listing(here_fs) == sorted(shard_names(3) + [INDEX] + bystanders)
            assert load_checkpoint(here_fs) == as_bytes(old_tensors)
            continue
        seen.add("after")
        assert file_digest(here_fs / INDEX) == new[INDEX], where
        assert load_checkpoint(here_fs) == as_bytes(new_tensors)
        now = digests(here_fs)
        if n > total - 3:  # killed in the cleanup's directory fsync: the unlinks were done
            assert mode == "kill" and now == new, where
            continue
        assert {k: now.get(k) for k in shard_names(3)} == {k: old[k] for k in shard_names(3)}, \
            f"{where}: stale shards removed by a save that did not finish"
        reports = resave()
        assert reports.removed == [here_fs / k for k in shard_names(3)], where
        assert digests(here_fs) == new
        assert listing(here_fs) == sorted(shard_names(2) + [INDEX] + bystanders)
    assert seen == {"before", "after"}, seen


def test_another_save_between_commit_and_cleanup(here_fs, monkeypatch):
    """If the index is not ours any more at cleanup, nothing is removed: the other save's
    shards may carry the names ours found stale."""
    tensors = state_dict(6, 16 * KiB, seed=1)
    other = state_dict(6, 16 * KiB, seed=2)
    sf.save_sharded(tensors, here_fs, max_shard_size=32 * KiB)  # 3 shards
    real_write_files = sf.write_files
    interleaved: list = []

    def write_then_another_save(*args, **kwargs):
        reports = real_write_files(*args, **kwargs)
        if not interleaved:  # only after the first (ours): the other save runs unhindered
            interleaved.append(None)
            interleaved[0] = sf.save_sharded(other, here_fs, max_shard_size=32 * KiB)
        return reports

    monkeypatch.setattr(sf, "write_files", write_then_another_save)
    reports = sf.save_sharded(tensors, here_fs, max_shard_size=64 * KiB)  # 2 shards
    assert interleaved and interleaved[0].removed == [here_fs / n for n in shard_names(2)]
    assert reports.removed == []
    assert listing(here_fs) == sorted(shard_names(3) + [INDEX])
    assert load_checkpoint(here_fs) == as_bytes(other)


def test_a_stale_shard_that_cannot_be_removed_is_kept_and_said(make_fs, caplog):
    """The checkpoint is published by then: the save returns, logs the file, the next retries."""
    mnt = make_fs("ext4", 32)
    tensors = state_dict(6, 16 * KiB)
    sf.save_sharded(tensors, mnt, max_shard_size=32 * KiB)
    stuck = mnt / shard_names(3)[2]
    subprocess.run(["chattr", "+i", stuck], check=True)
    try:
        with caplog.at_level(logging.WARNING, logger="trtet_store.formats"):
            reports = sf.save_sharded(tensors, mnt, max_shard_size=64 * KiB)
        assert reports.removed == [mnt / n for n in shard_names(3)[:2]]
        assert any(stuck.name in r.getMessage() and "not removed" in r.getMessage()
                   for r in caplog.records)
        assert load_checkpoint(mnt) == as_bytes(tensors)
    finally:
        subprocess.run(["chattr", "-i", stuck], check=True)
    assert sf.save_sharded(tensors, mnt, max_shard_size=64 * KiB).removed == [stuck]
    assert listing(mnt) == sorted(shard_names(2) + [INDEX, "lost+found"])
