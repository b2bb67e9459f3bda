"""Versioned writes (issue 22, finding 9): a reader gets one save's set, never a mix.

A transaction makes every file appear at once, but a reader opens them one by
one: concurrent readers got the ``.pte`` of one save and the ``.ptd`` of
another (221 of 54,000 loads). :func:`trtet_store.io.write_versioned` writes
each save into its own directory and switches a symlink to it by rename.
These tests run on the root disk (``here_fs``), with real processes:

- readers loading the set in a loop while a writer saves alternating
  versions never see a mix, and a pinned version is never removed under its
  reader;
- a writer killed inside the switch leaves the old set readable, and the next
  save (or :func:`recover_versions`) finishes it;
- a writer killed in the middle of moving a blob into a new version loses no
  byte: the next save recovers the half-written version before touching it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xxhash
from versions import needs_ptd_runtime

from trtet_store.io import (
    ConcurrentWriteError,
    current_version,
    pinned_version,
    recover_versions,
    write_versioned,
)
from trtet_store.io.versioned import VERSIONS_DIR

ROOT = Path(__file__).resolve().parent.parent
SIZE = 64 * 1024


def _set(seed: int) -> dict[str, bytes]:
    """A .pte and a .ptd whose bytes tell which save they belong to."""
    return {name: xxhash.xxh3_128(f"{name}{seed}".encode()).digest() * (SIZE // 16)
            for name in ("model.pte", "w.ptd")}


def _outputs(d: Path, files: dict[str, bytes]) -> list:
    return [(d / name, [data]) for name, data in files.items()]


def _digest(b: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(b)


def _listing(d: Path) -> dict[str, list[str]]:
    return {os.path.relpath(root, d): sorted(dirs + files) for root, dirs, files in os.walk(d)}


def test_each_save_is_a_version_and_old_ones_go_beyond_keep(here_fs):
    link = here_fs / "model"
    for n in (1, 2, 3, 4):
        done = write_versioned(_outputs(here_fs, _set(n)), keep=2)
        assert done.link == link and done.number == n
        assert current_version(link) == here_fs / VERSIONS_DIR / f"model-{n}" == done.version
        assert (link / "w.ptd").read_bytes() == _set(n)["w.ptd"]
        assert [r.path for r in done.reports] == [done.path("model.pte"), done.path("w.ptd")]
    assert done.removed == (here_fs / VERSIONS_DIR / "model-2",)
    # Nothing stray: the link, the versions kept, and the writers' lock file.
    assert _listing(here_fs) == {
        ".": [VERSIONS_DIR, "model"],
        VERSIONS_DIR: [".model.lock", "model-3", "model-4"],
        f"{VERSIONS_DIR}/model-3": ["model.pte", "w.ptd"],
        f"{VERSIONS_DIR}/model-4": ["model.pte", "w.ptd"],
    }
    assert os.readlink(link) == f"{VERSIONS_DIR}/model-4"  # relative: the tree can move


def test_refusals_change_nothing(here_fs):
    (here_fs / "model").write_bytes(b"user data")
    with pytest.raises(FileExistsError, match="not a version link"):
        write_versioned(_outputs(here_fs, _set(1)))
    os.symlink("elsewhere", here_fs / "other")
    with pytest.raises(FileExistsError, match="did not write"):
        write_versioned(_outputs(here_fs, _set(1)), link=here_fs / "other")
    (here_fs / "sub").mkdir()
    with pytest.raises(ValueError, match="one directory"):
        write_versioned([(here_fs / "a.pte", [b"a"]), (here_fs / "sub" / "b.ptd", [b"b"])])
    with pytest.raises(TypeError, match="extrnal"):
        write_versioned(_outputs(here_fs, _set(1)), link=here_fs / "m", extrnal=1)
    for keep in (0, True, 1.5):
        with pytest.raises(ValueError, match="keep"):
            write_versioned(_outputs(here_fs, _set(1)), link=here_fs / "m", keep=keep)
    assert (here_fs / "model").read_bytes() == b"user data"
    assert sorted(os.listdir(here_fs)) == ["model", "other", "sub"]


def test_a_second_writer_of_the_link_is_refused_or_waits(here_fs):
    write_versioned(_outputs(here_fs, _set(1)))
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({os.fspath(here_fs / VERSIONS_DIR / '.model.lock')!r}, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("held", flush=True)
            time.sleep(float(sys.argv[1]))
            """), "1.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConcurrentWriteError, match="timeout="):
            write_versioned(_outputs(here_fs, _set(2)))
        assert current_version(here_fs / "model").name == "model-1"
        done = write_versioned(_outputs(here_fs, _set(2)), timeout=30)
        assert done.number == 2
    finally:
        holder.kill()
        holder.wait()


# -- readers and a writer --------------------------------------------------------------------

READER = textwrap.dedent("""
    import json, os, sys, time
    import xxhash
    from pathlib import Path
    from trtet_store.io import current_version, pinned_version

    link, stop, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    pairs, vanished, loads = {}, 0, 0
    def load(d):
        with open(d / "model.pte", "rb") as f:
            pte = xxhash.xxh3_64_hexdigest(f.read())
        time.sleep(0.0005)  # a reader's work between its two opens
        with open(d / "w.ptd", "rb") as f:
            ptd = xxhash.xxh3_64_hexdigest(f.read())
        return pte + "/" + ptd
    print("ready", flush=True)
    while not stop.exists() or loads < 50:
        try:
            if mode == "pinned":
                with pinned_version(link) as d:
                    pair = load(d)
            else:  # resolve once, then open every file under what it names
                pair = load(current_version(link))
        except FileNotFoundError:
            vanished += 1  # the version was removed before or while it was read
            continue
        loads += 1
        pairs[pair] = pairs.get(pair, 0) + 1
    print(json.dumps({"pairs": pairs, "vanished": vanished, "loads": loads}), flush=True)
""")


def _readers(link: Path, stop: Path, modes: list[str]) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": os.fspath(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", READER, os.fspath(link), os.fspath(stop),
                               mode], stdout=subprocess.PIPE, text=True, env=env)
             for mode in modes]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    return procs


def test_readers_never_see_a_mix_while_versions_alternate(here_fs):
    """Two readers (one pinned, one resolving once) against 300 alternating saves, keep=1."""
    sets = {seed: _set(seed) for seed in (0, 1)}
    known = {_digest(s["model.pte"]) + "/" + _digest(s["w.ptd"]) for s in sets.values()}
    link, stop = here_fs / "model", here_fs / "stop"
    write_versioned(_outputs(here_fs, sets[0]), keep=1)
    readers = _readers(link, stop, ["pinned", "resolved"])
    pinned_kept = 0
    try:
        for i in range(1, 301):
            done = write_versioned(_outputs(here_fs, sets[i % 2]), keep=1)
            pinned_kept += len(done.pinned)
    finally:
        stop.touch()
        results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1])
                   for p in readers]
    pinned, resolved = results
    for r in results:
        assert set(r["pairs"]) <= known, r  # every pair one save's .pte with its .ptd
        assert r["loads"] >= 50
    assert len(pinned["pairs"]) == 2 and len(resolved["pairs"]) == 2  # both sets were read
    # A pinned version is never removed under its reader; an unpinned one may be
    # (keep=1), which shows as a file not found, never as another save's file.
    assert pinned["vanished"] == 0, pinned
    assert pinned_kept > 0  # the writer did find versions held by the pinned reader
    print(f"\npinned: {pinned['loads']} loads; resolved once: {resolved['loads']} loads, "
          f"{resolved['vanished']} found their version removed; versions kept for a reader: "
          f"{pinned_kept}")
    done = write_versioned(_outputs(here_fs, sets[0]), keep=1)  # readers gone: all go
    assert sorted(os.listdir(here_fs / VERSIONS_DIR)) == [".model.lock", f"model-{done.number}"]


# -- crashes -------------------------------------------------------------------------------

CRASHER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from trtet_store.io import fs, write_versioned, BlobStore

    d, call, nth, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    seen = 0
    real = getattr(fs.calls, call)
    def counted(args):
        if mode != "switch":
            return True
        # Only the switch's calls: those on the temp link beside the link.
        return any(isinstance(a, str) and Path(a).parent == d and ".switch-" in a
                   for a in args)
    def dying(*args):
        global seen
        if counted(args):
            seen += 1
            if seen == nth:
                os._exit(9)  # a kill: nothing after it runs
        return real(*args)
    if mode == "switch":
        data = {"model.pte": b"new pte" * 1000, "w.ptd": b"new ptd" * 1000}
        setattr(fs.calls, call, dying)
        write_versioned([(d / n, [b]) for n, b in data.items()])
    else:  # "move": a staged blob moved into the new version's .ptd
        store = BlobStore(d / "staging")
        blob = store.put(os.urandom(4 << 20))
        import xxhash
        print(blob.path, xxhash.xxh3_128_hexdigest(blob.path.read_bytes()), flush=True)
        setattr(fs.calls, call, dying)
        write_versioned([(d / "model.pte", [b"header" * 100]), (d / "w.ptd", [b"x" * 4096, blob])],
                        consume=True, placements=["move"], chunk_size=1 << 20)
    sys.exit(3)  # never reached when the crash fires
""")


def _crash(d: Path, call: str, nth: int, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.fspath(ROOT)}
    return subprocess.run([sys.executable, "-c", CRASHER, os.fspath(d), call, str(nth), mode],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("call", ["symlink", "rename"])
def test_a_kill_inside_the_switch_leaves_the_old_set_readable(here_fs, call):
    old = _set(7)
    write_versioned(_outputs(here_fs, old))
    done = _crash(here_fs, call, 1, "switch")
    assert done.returncode == 9, done.stderr
    link = here_fs / "model"
    # The old set, whole, through the link; the new one complete but not switched to.
    assert current_version(link).name == "model-1"
    with pinned_version(link) as v:
        assert {n: (v / n).read_bytes() for n in old} == old
    assert sorted(os.listdir(here_fs / VERSIONS_DIR / "model-2")) == ["model.pte", "w.ptd"]
    # The next save (here recover_versions, which it runs first) finishes the switch:
    # every file of model-2 was published, as a transaction past its commit point.
    actions = recover_versions(link)
    assert any("switched model to model-2" in a for a in actions), actions
    assert (link / "w.ptd").read_bytes() == b"new ptd" * 1000
    assert sorted(os.listdir(here_fs)) == [VERSIONS_DIR, "model"]  # no stray switch link
    assert recover_versions(link) == []
    assert write_versioned(_outputs(here_fs, old)).number == 3


@pytest.mark.parametrize("call, nth, outcome", [
    ("pwrite", 1, "removed"),  # writing its journal: nothing moved yet, the version goes
    ("pwrite", 3, "removed"),  # the first move step: rolled back, the bytes given back
    ("ftruncate", 3, "switched"),  # later in the move: finished, as recovery does
])
def test_a_kill_in_the_middle_of_a_move_into_a_new_version_loses_nothing(here_fs, call, nth,
                                                                         outcome):
    """The half-written version is recovered before anything else touches it."""
    old = _set(3)
    write_versioned(_outputs(here_fs, old))
    done = _crash(here_fs, call, nth, "move")
    assert done.returncode == 9, done.stderr
    path, digest = done.stdout.split()
    blob = Path(path)
    half = here_fs / VERSIONS_DIR / "model-2"
    assert any(n.startswith(".") for n in os.listdir(half))  # its journal, temp files
    assert current_version(here_fs / "model").name == "model-1"

    new = write_versioned(_outputs(here_fs, _set(4)))
    assert any(line.startswith(outcome) and "model-2" in line for line in new.recovered), \
        new.recovered
    assert current_version(here_fs / "model") == new.version
    # The blob's 4 MiB exist exactly once, byte-identical: back in its staged file
    # (rolled back, the dead version removed), or in model-2/w.ptd (finished and
    # switched to, then kept as the old version beside the new one).
    if outcome == "switched":
        assert new.number == 3
        assert sorted(os.listdir(half)) == ["model.pte", "w.ptd"]
        assert xxhash.xxh3_128_hexdigest((half / "w.ptd").read_bytes()[4096:]) == digest
        assert not blob.exists() or blob.stat().st_size == 0
    else:
        assert new.number == 2 and new.version == half  # the number freed is used again
        assert xxhash.xxh3_128_hexdigest(blob.read_bytes()) == digest
    assert sorted(os.listdir(here_fs / VERSIONS_DIR)) == sorted(
        [".model.lock", "model-1", "model-2"] + (["model-3"] if outcome == "switched" else []))
    for v in _versions(here_fs):
        assert not [n for n in os.listdir(v) if n.startswith(".")], v  # nothing stray
    with pinned_version(here_fs / "model") as v:
        assert (v / "w.ptd").read_bytes() == _set(4)["w.ptd"]


def _versions(d: Path) -> list[Path]:
    return [p for p in (d / VERSIONS_DIR).iterdir() if not p.name.startswith(".")]


def test_pruning_never_deletes_what_recovery_left(here_fs):
    """A version directory holding a dead writer's files is never removed by pruning."""
    write_versioned(_outputs(here_fs, _set(1)))
    stuck = here_fs / VERSIONS_DIR / "model-1" / ".model.pte.trtet-0123456789abcdef.tmp"
    stuck.write_bytes(b"bytes someone may need")
    for n in (2, 3, 4):
        write_versioned(_outputs(here_fs, _set(n)), keep=1)
    assert stuck.read_bytes() == b"bytes someone may need"
    assert sorted(os.listdir(here_fs / VERSIONS_DIR)) == [".model.lock", "model-1", "model-4"]


def test_readers_can_wait_out_a_removal(here_fs):
    """pinned_version resolves again when the version it found was removed meanwhile."""
    write_versioned(_outputs(here_fs, _set(1)), keep=1)
    link = here_fs / "model"
    with pinned_version(link) as first:
        done = write_versioned(_outputs(here_fs, _set(2)), keep=1)
        assert done.pinned == (first,) and first.exists()  # held: kept
    done = write_versioned(_outputs(here_fs, _set(3)), keep=1)
    assert not first.exists() and first in done.removed
    with pinned_version(link) as v:
        assert v == done.version


def test_a_killed_writer_does_not_block_the_next(here_fs):
    """A writer killed while it holds the link's lock does not block the next one."""
    write_versioned(_outputs(here_fs, _set(1)))
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, time
            fd = os.open({os.fspath(here_fs / VERSIONS_DIR / '.model.lock')!r}, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("held", flush=True)
            time.sleep(60)
            """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    time.sleep(0.01)
    assert write_versioned(_outputs(here_fs, _set(2))).number == 2


# -- through the export layer ----------------------------------------------------------------


@needs_ptd_runtime
def test_save_program_versioned_writes_sets_readers_load(here_fs):
    """An XNNPACK program with its weights in model.ptd, saved twice as versions."""
    from executorch.runtime import Runtime
    from programs import xnnpack_linear_program

    import trtet_store

    out = here_fs / "mlp.pte"
    for seed, number in ((0, 1), (1, 2)):
        built = xnnpack_linear_program(external_tag="model", seed=seed)
        reports = trtet_store.save_program(built.manager, out, versioned=True)
        version = here_fs / VERSIONS_DIR / f"mlp-{number}"
        assert [r.path for r in reports] == [version / "mlp.pte", version / "model.ptd"]
        assert current_version(here_fs / "mlp") == version
    assert not out.exists() and sorted(os.listdir(here_fs)) == [VERSIONS_DIR, "mlp"]
    with pinned_version(here_fs / "mlp") as v:
        program = Runtime.get().load_program(os.fspath(v / "mlp.pte"),
                                             data_path=os.fspath(v / "model.ptd"))
        (result,) = program.load_method("forward").execute(list(built.inputs))
    assert result.allclose(built.module(*built.inputs), atol=1e-5)
    for bad in (0, -1, "yes"):
        with pytest.raises(ValueError, match="versioned"):
            trtet_store.save_program(built.manager, out, versioned=bad)
    assert current_version(here_fs / "mlp").name == "mlp-2"


@pytest.fixture
def stub_tensorrt(monkeypatch):
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder

    monkeypatch.setattr(trt, "check_available", lambda: None)

    def install(**fields):
        builder = FakeBuilder(**fields)
        monkeypatch.setattr(trt, "build_engines", builder)
        return builder

    return install


def test_compile_and_save_versioned_and_its_link_checked_before_the_build(here_fs,
                                                                          stub_tensorrt):
    pytest.importorskip("executorch.exir")
    import trtet_store
    from trtet_store.inspector import verify
    from trtet_store.testing.stub_tensorrt import linear_relu

    builder = stub_tensorrt(engine_sizes=(1 << 20,))
    module, inputs = linear_relu()
    (here_fs / "m").mkdir()  # the link's name, taken
    with pytest.raises(FileExistsError, match="not a version link"):
        trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", versioned=True)
    assert builder.built == []  # refused before the build
    (here_fs / "m").rmdir()
    for number in (1, 2, 3):
        report = trtet_store.compile_and_save(module, inputs, here_fs / "m.pte", versioned=2)
        assert report.writes[0].path == here_fs / VERSIONS_DIR / f"m-{number}" / "m.pte"
    assert sorted(os.listdir(here_fs / VERSIONS_DIR)) == [".m.lock", "m-2", "m-3"]
    result = verify(here_fs / "m" / "m.pte", engine_digests=[d for _, d in builder.built])
    assert result.ok, result.all_problems


def test_cli_compile_and_save_versioned(here_fs, stub_tensorrt, capsys):
    pytest.importorskip("executorch.exir")
    from trtet_store import cli

    stub_tensorrt(engine_sizes=(1 << 20,))
    factory = here_fs / "factory.py"
    factory.write_text("from trtet_store.testing.stub_tensorrt import linear_relu\n"
                       "def make():\n    return linear_relu()\n")
    out = here_fs / "out"
    out.mkdir()
    for _ in range(3):
        code = cli.main(["compile-and-save", f"{factory}:make", os.fspath(out / "m.pte"),
                         "--keep-versions", "2", "--no-progress"])
        assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(out / VERSIONS_DIR)) == [".m.lock", "m-2", "m-3"]
    assert current_version(out / "m").name == "m-3"
    code = cli.main(["compile-and-save", f"{factory}:make", os.fspath(out / "m.pte"),
                     "--versioned", "--no-progress"])
    assert code == 0 and current_version(out / "m").name == "m-4"
