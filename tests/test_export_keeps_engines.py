"""A failed compile_and_save never costs the engines it built (issue 22, findings 1, 2, 6, 7, 10).

The TensorRT build is stubbed at its seam (``FakeBuilder``); everything after
it is real. Each failure here happens after the build: the engines must stay
staged, byte-identical, and the next call of the same build must build
nothing and write a program holding exactly those engines. What can be
checked before the build is refused before it, with nothing built or created.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import warnings
from pathlib import Path

import pytest
import torch
import warm
import xxhash
from test_compile_and_save import delegate_blobs

import trtet_store
from trtet_store.export import engine_reuse, trt_blob
from trtet_store.export import tensorrt as trt
from trtet_store.io.lock import lock_file, unlock_file
from trtet_store.io.names import STAGING_DIR, lock_path_of
from trtet_store.io.orphans import list_orphans
from trtet_store.io.units import MiB
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

SIZES = (3 * MiB, 2 * MiB)


def engines_in(pte: Path) -> list[str]:
    """xxh3-128 of every engine inline in the program's delegates, sorted."""
    return sorted(xxhash.xxh3_128_hexdigest(trt_blob.decode(raw)[2])
                  for raw in delegate_blobs(pte))


def staged_engines(directory: Path) -> dict[Path, str]:
    """Orphaned engines in ``directory``: path -> xxh3-128 of the bytes on disk."""
    return {o.path: xxhash.xxh3_128_hexdigest(o.path.read_bytes())
            for o in list_orphans(directory)
            if o.metadata.get("kind") == engine_reuse.ENGINE_KIND}


class AfterBuild(FakeBuilder):
    """A FakeBuilder that, once its engines are staged, does ``then()`` (the failure's cause)."""

    def __init__(self, then, **kwargs) -> None:
        super().__init__(**kwargs)
        self.then = then

    def __call__(self, *args, **kwargs):
        built = super().__call__(*args, **kwargs)
        self.then()
        return built


def _rerun_builds_nothing(out: Path, digests: list[str], **kwargs) -> None:
    module, inputs = linear_relu()
    again = FakeBuilder(engine_sizes=SIZES)
    with installed(again):
        report = trtet_store.compile_and_save(module, inputs, out, **kwargs)
    assert again.built == []  # nothing built: the failed call's engines were reused
    assert engines_in(out) == digests
    assert sorted(k for k, _ in report.engines) == sorted(f"{d}_trt_engine" for d in digests)


def _hold(dest: Path) -> int:
    return lock_file(lock_path_of(dest), dest)


@pytest.mark.parametrize("trigger", ["directory", "busy"])
def test_a_write_failing_after_the_build_keeps_the_engines_for_the_next_call(here_fs, trigger):
    out = here_fs / "model.pte"
    held: list[int] = []

    def cause() -> None:  # after the pre-checks passed: the output went bad meanwhile
        if trigger == "directory":
            out.mkdir()
        else:
            held.append(_hold(out))

    module, inputs = linear_relu()
    builder = AfterBuild(cause, engine_sizes=SIZES)
    error = IsADirectoryError if trigger == "directory" else trtet_store.ConcurrentWriteError
    with installed(builder), pytest.raises(error):
        trtet_store.compile_and_save(module, inputs, out)
    digests = sorted(d for _, d in builder.built)
    staging = here_fs / STAGING_DIR
    # Kept as orphans with their build record, byte-identical.
    assert sorted(staged_engines(staging).values()) == digests
    assert [o.metadata["kind"] for o in list_orphans(staging)].count(
        engine_reuse.RECORD_KIND) == 1
    if trigger == "directory":
        out.rmdir()
    else:
        unlock_file(held[0], lock_path_of(out))
    _rerun_builds_nothing(out, digests)
    assert list_orphans(staging) == []


def test_a_failure_after_the_build_keeps_the_engines_in_the_callers_store(here_fs):
    out = here_fs / "model.pte"
    store = trtet_store.BlobStore(here_fs / "mine")
    module, inputs = linear_relu()
    builder = AfterBuild(out.mkdir, engine_sizes=SIZES)
    with installed(builder), pytest.raises(IsADirectoryError):
        trtet_store.compile_and_save(module, inputs, out, store=store)
    digests = sorted(d for _, d in builder.built)
    # Alive in the caller's store (not orphans: the store is alive), unchanged.
    kept = [b for b in store.blobs() if b.metadata.get("kind") == engine_reuse.ENGINE_KIND]
    assert sorted(xxhash.xxh3_128_hexdigest(Path(b.path).read_bytes()) for b in kept) == digests
    out.rmdir()
    _rerun_builds_nothing(out, digests, store=store)
    assert store.blobs() == []
    store.close()


@pytest.mark.parametrize("store_kind", ["directory", "BlobStore"])
def test_an_output_disk_too_small_keeps_the_engines_for_a_run_elsewhere(here_fs, make_fs,
                                                                         store_kind):
    """The write's preflight refuses (engines copied across filesystems); nothing is lost."""
    small = make_fs("tmpfs", 2)
    staging = here_fs / "staging"
    store = staging if store_kind == "directory" else trtet_store.BlobStore(staging)
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=SIZES)
    with installed(builder), pytest.raises(trtet_store.InsufficientSpaceError):
        trtet_store.compile_and_save(module, inputs, small / "m.pte", store=store)
    digests = sorted(d for _, d in builder.built)
    assert list(small.iterdir()) == []
    if store_kind == "directory":
        assert sorted(staged_engines(staging).values()) == digests
    else:
        assert sorted(xxhash.xxh3_128_hexdigest(Path(b.path).read_bytes())
                      for b in store.blobs()
                      if b.metadata.get("kind") == engine_reuse.ENGINE_KIND) == digests
    _rerun_builds_nothing(here_fs / "m.pte", digests, store=store)
    if store_kind == "BlobStore":
        store.close()


def test_a_failure_in_lowering_after_the_build_keeps_the_engines(here_fs, monkeypatch):
    """ExecuTorch raises after the build (here: in to_edge_transform_and_lower)."""
    from trtet_store.export import lowering

    real = lowering._lower
    calls = []

    def failing_lower(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("lowering failed after the build")
        return real(*args, **kwargs)

    monkeypatch.setattr(lowering, "_lower", failing_lower)
    out = here_fs / "model.pte"
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=SIZES)
    with installed(builder), pytest.raises(RuntimeError, match="after the build"):
        trtet_store.compile_and_save(module, inputs, out)
    digests = sorted(d for _, d in builder.built)
    assert sorted(staged_engines(here_fs / STAGING_DIR).values()) == digests
    _rerun_builds_nothing(out, digests)


# -- refused before the build ----------------------------------------------------------------

def _refused_before_the_build(directory: Path, error, match: str, out: Path | None = None,
                              **kwargs) -> None:
    before = sorted(p.name for p in directory.iterdir())
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=SIZES)
    with installed(builder), pytest.raises(error, match=match):
        trtet_store.compile_and_save(module, inputs, out or directory / "m.pte", **kwargs)
    assert builder.built == []
    assert sorted(p.name for p in directory.iterdir()) == before


def test_an_output_that_is_a_directory_is_refused_before_the_build(here_fs):
    (here_fs / "m.pte").mkdir()
    _refused_before_the_build(here_fs, IsADirectoryError, "over a directory")


def test_an_output_in_a_missing_directory_is_refused_before_the_build(here_fs):
    _refused_before_the_build(here_fs, FileNotFoundError, "does not exist",
                              out=here_fs / "missing" / "m.pte")


def test_an_output_in_an_immutable_directory_is_refused_before_the_build(here_fs):
    """Root may write anywhere, except where the inode says no (chattr +i)."""
    ro = here_fs / "ro"
    ro.mkdir()
    subprocess.run(["chattr", "+i", os.fspath(ro)], check=True)
    try:
        _refused_before_the_build(ro, PermissionError, "not writable", out=ro / "m.pte")
    finally:
        subprocess.run(["chattr", "-i", os.fspath(ro)], check=True)


def test_a_busy_output_is_refused_before_the_build_and_timeout_waits(here_fs):
    out = here_fs / "m.pte"
    fd = _hold(out)
    try:
        _refused_before_the_build(here_fs, trtet_store.ConcurrentWriteError,
                                  "pass timeout= to wait", out=out)
    finally:
        unlock_file(fd, lock_path_of(out))
    # timeout=: the call waits for the other write instead of refusing.
    fd = _hold(out)
    released = threading.Event()

    def release_soon() -> None:
        released.wait(0.3)
        unlock_file(fd, lock_path_of(out))

    thread = threading.Thread(target=release_soon)
    thread.start()
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=SIZES)
    try:
        with installed(builder):
            report = trtet_store.compile_and_save(module, inputs, out, timeout=60)
    finally:
        thread.join()
    assert engines_in(report.path) == sorted(d for _, d in builder.built)


def test_timeout_also_waits_for_a_write_that_starts_during_the_build(here_fs):
    out = here_fs / "m.pte"
    threads = []

    def busy_for_a_moment() -> None:  # another writer takes the file after the pre-check
        fd = _hold(out)
        thread = threading.Timer(0.3, unlock_file, (fd, lock_path_of(out)))
        thread.start()
        threads.append(thread)

    module, inputs = linear_relu()
    builder = AfterBuild(busy_for_a_moment, engine_sizes=SIZES)
    try:
        with installed(builder):
            report = trtet_store.compile_and_save(module, inputs, out, timeout=60)
    finally:
        for t in threads:
            t.join()
    assert engines_in(report.path) == sorted(d for _, d in builder.built)


@pytest.mark.parametrize("writer", ["save", "save_program"])
def test_save_and_save_program_wait_with_timeout(here_fs, writer):
    from programs import xnnpack_linear_program

    program = xnnpack_linear_program(external_tag=None).manager
    out = here_fs / "m.pte"
    write = getattr(trtet_store, writer)
    fd = _hold(out)
    with pytest.raises(trtet_store.ConcurrentWriteError, match="pass timeout= to wait"):
        write(program, out)
    timer = threading.Timer(0.3, unlock_file, (fd, lock_path_of(out)))
    timer.start()
    try:
        write(program, out, timeout=60)
    finally:
        timer.join()
    assert out.read_bytes() == bytes(program.buffer)


def test_a_busy_ptd_is_refused_before_the_build(here_fs):
    fd = _hold(here_fs / "eng.ptd")
    try:
        _refused_before_the_build(here_fs, trtet_store.ConcurrentWriteError, "eng.ptd",
                                  external_engine_data="eng")
    finally:
        unlock_file(fd, lock_path_of(here_fs / "eng.ptd"))


def test_constant_methods_executorch_cannot_emit_are_refused_before_the_build(here_fs):
    from executorch.exir.error import ExportError

    _refused_before_the_build(here_fs, ExportError, "set", constant_methods={"vocab": {1, 2}})
    _refused_before_the_build(here_fs, ExportError, "object",
                              constant_methods={"cfg": [1, object()]})


@pytest.mark.parametrize("how", ["segment_alignment", "backend_config"])
def test_a_segment_alignment_not_a_power_of_two_is_refused_before_the_build(here_fs, how):
    from executorch.exir import ExecutorchBackendConfig

    kwargs = ({"segment_alignment": 3000} if how == "segment_alignment"
              else {"backend_config": ExecutorchBackendConfig(segment_alignment=3000)})
    _refused_before_the_build(here_fs, ValueError, "power of two", **kwargs)


# -- partial builds: a kill between two builds -------------------------------------------------

KILLED_EXPORT = """
import sys, time
import torch
import trtet_store
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

class Announcing(FakeBuilder):
    def __call__(self, *args, **kwargs):
        if self.built:  # the second build: say so, and wait for the kill
            print("second build", flush=True)
            time.sleep(600)
        built = super().__call__(*args, **kwargs)
        return built

module, inputs = linear_relu()
other, _ = linear_relu()
with torch.no_grad():
    other[0].weight.add_(1)  # its own tensors: the program shares the module's
prefill = torch.export.export(module, inputs)
decode = torch.export.export(other, inputs)
with installed(Announcing(engine_sizes=({size},))):
    trtet_store.compile_and_save({{"prefill": prefill, "decode": decode}}, None, {out!r})
"""


def _killed_between_builds(out: Path, size: int = 2 * MiB) -> None:
    """Run a two-method export in a child and SIGKILL it as its second build starts."""
    # a warm child (tests/warm.py): its own process, SIGKILLed as a fresh one would be
    child = warm.popen(KILLED_EXPORT.format(out=os.fspath(out), size=size))
    try:
        line = child.stdout.readline()
        assert line == "second build\n", child.stderr.read()[-3000:]
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL


def _methods() -> dict:
    module, inputs = linear_relu()
    other, _ = linear_relu()
    with torch.no_grad():
        other[0].weight.add_(1)  # its own tensors: a program shares its module's
    return {"prefill": torch.export.export(module, inputs),
            "decode": torch.export.export(other, inputs)}


def test_a_rerun_after_a_kill_between_two_builds_builds_only_the_missing_one(here_fs, capsys):
    out = here_fs / "model.pte"
    _killed_between_builds(out)
    staging = here_fs / STAGING_DIR
    first = staged_engines(staging)
    assert len(first) == 1  # the first method's engine, with its record
    kinds = sorted(o.metadata["kind"] for o in list_orphans(staging))
    assert kinds == [engine_reuse.RECORD_KIND, engine_reuse.ENGINE_KIND]

    # Users see them where they look: recover lists them, the CLI says what to do.
    outcomes = trtet_store.recover(here_fs)
    assert sorted(o.journal for o in outcomes if o.action == "orphan") == sorted(
        o.path for o in list_orphans(staging))
    from trtet_store.cli import main

    assert main(["recover", os.fspath(here_fs)]) == 0
    printed = capsys.readouterr().out
    assert engine_reuse.ENGINE_KIND in printed and engine_reuse.RECORD_KIND in printed
    assert "run the same export again to reuse them" in printed
    # ... and another export beside them is warned (warnings.warn: no logging needed).
    module, inputs = linear_relu()
    with torch.no_grad():
        module[0].bias.add_(3)  # another build
    with installed(FakeBuilder(engine_sizes=(1 * MiB,))), pytest.warns(
            UserWarning, match=r"no export has taken.*1 staged engine\(s\), 1 record\(s\)"):
        trtet_store.compile_and_save(module, inputs, here_fs / "other.pte")

    builder = FakeBuilder(engine_sizes=(2 * MiB,), seeds=(7,))
    with installed(builder), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trtet_store.compile_and_save(_methods(), None, out)
    assert len(builder.built) == 1  # only the decode build; prefill's was reused
    assert engines_in(out) == sorted([*first.values(), builder.built[0][1]])
    assert list_orphans(staging) == []
    # Its own build's orphans are not "other builds": no warning about them.
    assert not [w for w in seen if "no export has taken" in str(w.message)]


# -- reuse keeps what it does not use ----------------------------------------------------------

def test_reuse_keeps_engines_of_an_older_failed_run(here_fs):
    """Engines of the same build whose record is gone (an older run) are not taken, not deleted.

    They are announced: a partial build of this very export is no less abandoned.
    """
    out = here_fs / "model.pte"
    staging = here_fs / STAGING_DIR
    module, inputs = linear_relu()
    with installed(AfterBuild(out.mkdir, engine_sizes=SIZES)), \
            pytest.raises(IsADirectoryError):
        trtet_store.compile_and_save(module, inputs, out)
    out.rmdir()
    record = next(o for o in list_orphans(staging)
                  if o.metadata["kind"] == engine_reuse.RECORD_KIND)
    os.unlink(record.path)  # that run died before its record
    os.unlink(os.fspath(record.path) + ".meta")
    older = staged_engines(staging)
    # A second run builds again (seeds 2, 3: the same sizes, other bytes), then fails too.
    with installed(AfterBuild(out.mkdir, engine_sizes=SIZES, seeds=(2, 3))), \
            pytest.raises(IsADirectoryError):
        trtet_store.compile_and_save(module, inputs, out)
    out.rmdir()
    newer = {p: d for p, d in staged_engines(staging).items() if p not in older}
    assert len(newer) == 2
    builder = FakeBuilder(engine_sizes=SIZES)
    with installed(builder), pytest.warns(UserWarning, match=r"2 staged engine\(s\) no "
                                          r"record lists.*partial"):
        trtet_store.compile_and_save(module, inputs, out)
    assert builder.built == []
    assert engines_in(out) == sorted(newer.values())
    # The older run's engines are still there, orphans, byte-identical.
    assert staged_engines(staging) == older


# -- one engine per build, one file per engine -------------------------------------------------

def test_methods_of_one_build_share_its_engines(here_fs):
    module, inputs = linear_relu()
    methods = {"a": torch.export.export(module, inputs), "b": torch.export.export(module, inputs)}
    builder = FakeBuilder(engine_sizes=SIZES)
    with installed(builder):
        report = trtet_store.compile_and_save(methods, None, here_fs / "m.pte")
    assert len(builder.built) == 2  # one build of two engines, not two builds
    assert len(report.engines) == 2
    digests = [d for _, d in builder.built]
    assert engines_in(report.path) == sorted(digests * 2)  # each method's delegates
    # ... name one segment per engine: the file holds each engine once.
    assert report.path.stat().st_size < sum(SIZES) + MiB


def test_an_engine_identical_to_one_staged_is_released_at_once_and_listed_once(here_fs):
    methods = _methods()  # two builds (other weights), whose engines come out identical
    builder = FakeBuilder(engine_sizes=(2 * MiB, 2 * MiB), seeds=(5, 5))
    with installed(builder):
        report = trtet_store.compile_and_save(methods, None, here_fs / "m.pte")
    assert len(builder.built) == 4
    first, *copies = [e.blob for e, _ in builder.built]
    assert all(b is first for b in copies)  # every engine points at the first file
    assert len(report.engines) == 1  # the report lists the shared engine once
    assert set(engines_in(report.path)) == {builder.built[0][1]}


def test_identical_engines_of_two_live_exports_are_each_placed_from_their_own_store(here_fs):
    """Found when a test's engine (same seed, same bytes) was taken from another test's store."""
    from trtet_store.export.lowering import export

    module, inputs = linear_relu()
    stores = [trtet_store.BlobStore(here_fs / name) for name in ("a", "b")]
    builders = [FakeBuilder(engine_sizes=(1 * MiB,)) for _ in stores]
    edges = []
    for store, builder in zip(stores, builders, strict=True):
        with installed(builder):
            edges.append(export(module, inputs=inputs, store=store))
    assert builders[0].built[0][1] == builders[1].built[0][1]  # identical bytes
    for i in (1, 0):  # the later export first: it must not take the earlier one's engine
        program = edges[i].to_executorch()
        trtet_store.save_program(program, here_fs / f"{i}.pte", consume=True)
        assert builders[i].built[0][0].blob.consumed
        assert not builders[1 - i].built[0][0].blob.consumed or i == 0
        assert engines_in(here_fs / f"{i}.pte") == [builders[i].built[0][1]]
    for store in stores:
        store.close()


@pytest.fixture(autouse=True)
def _no_stray_engines():
    yield
    trt.unregister_engines(list(trt._engines.values()))
