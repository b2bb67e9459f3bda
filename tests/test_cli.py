"""The ``trtet-store`` command on small real programs: exit codes, JSON shapes, layouts, checks.

Programs are real ExecuTorch 1.5.1 programs: the benchmark's own (one delegate
per payload, TensorRT-format delegate blobs, payloads as file-backed named
data in the ``.pte`` and in ``engines.ptd``), written by trtet_store, and an
XNNPACK MLP that the runtime can load and run. Commands run in-process through
``cli.main`` (the ExecuTorch import is paid once), plus one check that the
installed console script starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from versions import needs_ptd_runtime

from trtet_store.export import _executorch_private as priv

pytest.importorskip("executorch.exir")

from trtet_store import bench, cli  # noqa: E402
from trtet_store.export.executorch import payload_extents, program_layouts  # noqa: E402
from trtet_store.io import BlobStore, write_files  # noqa: E402

PAYLOAD_SIZES = (300_001, 200_003, 100_005)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike) -> tuple[int, str, str]:
    """Run ``trtet-store ARGV`` in-process; return (exit code, stdout, stderr)."""
    code = cli.main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def save_ours(program, pte: Path) -> list:
    """Write ``program`` with trtet_store (the .pte and its .ptd files, one transaction).

    Returns the layouts written (computed before the write, from the same program).
    """
    layouts = program_layouts(program, pte)
    write_files(layouts)
    return layouts


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    if not priv.has_file_backed_data():
        pytest.skip(f"the benchmark's program is file-backed named data: executorch "
                    f"{priv.executorch_version()} has no FileBackedData (1.5+)")
    """The benchmark's program with three payloads, written by trtet_store, and its known layout."""
    d = tmp_path_factory.mktemp("written")
    store = BlobStore(d / "staging")
    blobs = [store.put(os.urandom(n)) for n in PAYLOAD_SIZES]
    program = bench.build_program(blobs, layout="split", segment_alignment=4096)
    out = d / "out"
    out.mkdir()
    layouts = save_ours(program, out / "model.pte")
    known = {}
    for path, pieces in layouts:
        size = sum(len(p) if isinstance(p, (bytes, bytearray)) else p.size for p in pieces)
        extents = [(off, n) for off, n, _piece in payload_extents(pieces)]
        known[Path(path).name] = {"size": size, "extents": extents}
    yield {"dir": out, "pte": out / "model.pte", "ptd": out / "engines.ptd", "known": known}
    store.close()


def test_console_script_starts() -> None:
    exe = Path(sys.executable).with_name("trtet-store")
    if not exe.exists():
        pytest.skip("the console script is not installed in this environment")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("bench", "inspect", "verify", "compile-and-save", "recover"):
        assert command in proc.stdout
    proc = subprocess.run([exe, "bench", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--payload-size" in proc.stdout


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--payload-size", "lots"])
    assert exc.value.code == 2
    code, _out, err = run_cli(capsys, "bench", "--methods", "nonsense")
    assert code == 2 and "methods" in err


def test_bench_options_take_their_defaults_from_the_bench_config() -> None:
    from trtet_store.io.writer import DEFAULT_CHUNK_SIZE

    args = cli.build_parser().parse_args(["bench"])
    config = bench.BenchConfig.from_args(args)
    defaults = bench.BenchConfig()
    for name in ("payload_size", "payloads", "chunk_size", "filesystem", "fs_size", "repeat",
                 "methods", "layout", "segment_alignment", "verify_outputs"):
        assert getattr(config, name) == getattr(defaults, name), name
    assert config.effective_chunk_size == DEFAULT_CHUNK_SIZE
    bench_parser = next(
        a for a in cli.build_parser()._subparsers._group_actions if a.dest == "command"
    ).choices["bench"]
    assert f"default {bench.format_size(DEFAULT_CHUNK_SIZE)}" in " ".join(
        bench_parser.format_help().split()
    )


def test_reports_serialise_themselves_as_the_cli_prints_them() -> None:
    from trtet_store.export.compile import CompileReport
    from trtet_store.io.recovery import Outcome
    from trtet_store.io.writer import PlacementRecord, WriteReport

    record = PlacementRecord(0, "/s/blob", 4096, 6, "move", "same filesystem", 0)
    write = WriteReport(Path("/o/model.pte"), 4102, 4096, [record], 0.5)
    report = CompileReport(Path("/o/model.pte"), [Path("/o/engines.ptd")], [write],
                           [("k_trt_engine", 6)], None, 1.5)
    assert json.loads(json.dumps(report.to_json())) == {
        "path": "/o/model.pte",
        "data_paths": ["/o/engines.ptd"],
        "etrecord": None,
        "engines": [["k_trt_engine", 6]],
        "engine_cache": [],
        "seconds": 1.5,
        "writes": [{"path": "/o/model.pte", "size": 4102, "seconds": 0.5, "placements": [
            {"offset": 4096, "size": 6, "placement": "move", "reason": "same filesystem",
             "bytes_written": 0}]}],
    }
    outcome = Outcome(Path("/o/.model.pte.trtet-journal"), "rolled back", ["/o/model.pte"])
    assert outcome.to_json() == {"journal": "/o/.model.pte.trtet-journal",
                                 "action": "rolled back", "outputs": ["/o/model.pte"],
                                 "detail": ""}


def test_inspect_json_matches_known_layout(capsys, written) -> None:
    code, out, _err = run_cli(capsys, "inspect", written["pte"], "--json")
    assert code == 0
    pte = json.loads(out)
    known = written["known"]["model.pte"]
    assert pte["kind"] == "pte"
    assert pte["file_size"] == known["size"] == written["pte"].stat().st_size
    assert pte["problems"] == []
    h = pte["header"]
    assert h["file_identifier"] == "ET12" and h["magic"] == "eh00" and h["header_length"] == 32
    assert h["segment_base_offset"] % 4096 == 0
    assert h["segment_base_offset"] + h["segment_data_size"] == pte["file_size"]
    # Every payload trtet_store placed is a named-data segment at exactly that offset.
    named = {(d["absolute_offset"], d["size"]) for d in pte["named_data"]}
    assert named == set(known["extents"])
    assert sorted(d["key"] for d in pte["named_data"]) == [
        "engine0_trt_engine",
        "engine2_trt_engine",
    ]
    assert all(s["page_aligned"] for s in pte["segments"])
    # One delegate per payload, each a TensorRT-format blob naming its payload's key.
    assert len(pte["delegates"]) == len(PAYLOAD_SIZES)
    keys = []
    for d in pte["delegates"]:
        assert d["id"] == bench.BACKEND_ID and d["location"] == "SEGMENT"
        trt = d["tensorrt"]
        assert trt["header"]["magic"] == "TR01" and trt["header"]["engine_size"] == 0
        assert trt["header"]["engine_offset"] % 16 == 0
        keys.append(trt["metadata"]["engine_key"])
    assert keys == [f"engine{i}_trt_engine" for i in range(len(PAYLOAD_SIZES))]
    assert pte["plans"][0]["name"] == "forward" and pte["plans"][0]["delegates"] == 3

    code, out, _err = run_cli(capsys, "inspect", written["ptd"], "--json")
    assert code == 0
    ptd = json.loads(out)
    known = written["known"]["engines.ptd"]
    assert ptd["kind"] == "ptd" and ptd["file_size"] == known["size"]
    assert ptd["header"]["magic"] == "FH01" and ptd["header"]["file_identifier"] == "FT01"
    assert [(d["key"], d["absolute_offset"], d["size"]) for d in ptd["named_data"]] == [
        ("engine1_trt_engine", *known["extents"][0])
    ]
    assert known["extents"][0][1] == PAYLOAD_SIZES[1]


def test_inspect_text(capsys, written) -> None:
    code, out, _err = run_cli(capsys, "inspect", written["pte"])
    assert code == 0
    assert "TensorRT blob TR01" in out and "engine_key: engine0_trt_engine" in out
    assert "problems: none" in out


def test_inspect_refuses_what_is_not_a_program(capsys, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"hello, this is not a flatbuffer at all" * 4)
    code, out, _err = run_cli(capsys, "inspect", junk)
    assert code == 1 and "neither a .pte" in out
    code, _out, err = run_cli(capsys, "inspect", tmp_path / "missing.pte")
    assert code == 1 and "missing.pte" in err


def test_verify_ok_json_shape(capsys, written) -> None:
    code, out, _err = run_cli(capsys, "verify", written["pte"], "--data", written["ptd"], "--json")
    assert code == 0
    result = json.loads(out)
    assert result["ok"] is True
    assert [f["kind"] for f in result["files"]] == ["pte", "ptd"]
    assert all(f["problems"] == [] for f in result["files"])
    assert result["problems"] == [] and result["runtime"] is None


def test_verify_without_data_warns_about_external_keys(capsys, written) -> None:
    code, out, _err = run_cli(capsys, "verify", written["pte"])
    assert code == 0
    assert "engine1_trt_engine" in out and "pass --data" in out


def test_verify_data_missing_key_is_an_error(capsys, written, tmp_path: Path) -> None:
    """A .ptd that lacks the engine a delegate names fails the cross-check."""
    store = BlobStore(tmp_path / "staging")
    other = bench.build_program([store.put(b"x" * 5000)], layout="ptd")
    save_ours(other, tmp_path / "other.pte")  # its engines.ptd holds engine0 only
    code, out, _err = run_cli(capsys, "verify", written["pte"], "--data", tmp_path / "engines.ptd")
    store.close()
    assert code == 1
    assert "'engine1_trt_engine' is in neither the .pte nor engines.ptd" in out
    code, out, _err = run_cli(capsys, "verify", written["pte"], "--data", written["pte"])
    assert code == 1 and "is not a .ptd" in out


def corrupt(
    src: Path, dst: Path, *, at: int | None = None, data: bytes = b"", truncate_by: int = 0
) -> Path:
    shutil.copyfile(src, dst)
    if at is not None:
        with open(dst, "r+b") as f:
            f.seek(at)
            f.write(data)
    if truncate_by:
        os.truncate(dst, dst.stat().st_size - truncate_by)
    return dst


def test_verify_catches_truncated_files(capsys, written, tmp_path: Path) -> None:
    pte = corrupt(written["pte"], tmp_path / "model.pte", truncate_by=1000)
    code, out, _err = run_cli(capsys, "verify", pte, "--json")
    assert code == 1
    result = json.loads(out)
    assert result["ok"] is False
    messages = [p["message"] for p in result["files"][0]["problems"]]
    assert any("truncated by 1000 bytes" in m for m in messages), messages
    assert any("past the end of the file" in m for m in messages), messages

    ptd = corrupt(written["ptd"], tmp_path / "engines.ptd", truncate_by=1)
    code, out, _err = run_cli(capsys, "verify", ptd)
    assert code == 1 and "truncated" in out and "FAILED" in out

    # Truncated into the program itself (a save that died early).
    stub = corrupt(
        written["pte"], tmp_path / "stub.pte", truncate_by=written["pte"].stat().st_size - 60
    )
    code, out, _err = run_cli(capsys, "verify", stub)
    assert code == 1 and "head bytes" in out


@pytest.mark.parametrize(
    ("name", "offset", "data", "expect"),
    [
        ("identifier", 4, b"ET99", "IncompatibleVersion"),
        ("program_size", 16, (1 << 40).to_bytes(8, "little"), "program_size"),
        ("segment base", 24, (3).to_bytes(8, "little"), "inside the program"),
        ("header magic", 8, b"xx00", "no segment_base_offset"),
        ("root offset", 0, (10**8).to_bytes(4, "little"), "root table offset"),
    ],
)
def test_verify_catches_corrupted_pte_header(
    capsys, written, tmp_path: Path, name: str, offset: int, data: bytes, expect: str
) -> None:
    bad = corrupt(written["pte"], tmp_path / "model.pte", at=offset, data=data)
    code, out, _err = run_cli(capsys, "verify", bad, "--run")
    assert code == 1, out
    assert expect in out, out
    # Structural errors keep the file away from the runtime.
    assert "runtime load skipped" in out


@pytest.mark.parametrize(
    ("offset", "data", "expect"),
    [
        (8, b"FH99", "InvalidExternalData"),
        (4, b"XX01", "neither a .pte"),
        (32, (10).to_bytes(8, "little"), "inside the flatbuffer"),
        (40, (1 << 33).to_bytes(8, "little"), "truncated"),
    ],
)
def test_verify_catches_corrupted_ptd_header(
    capsys, written, tmp_path: Path, offset: int, data: bytes, expect: str
) -> None:
    bad = corrupt(written["ptd"], tmp_path / "engines.ptd", at=offset, data=data)
    code, out, _err = run_cli(capsys, "verify", bad)
    assert code == 1 and expect in out, out


def test_verify_catches_bad_tensorrt_blob(capsys, written, tmp_path: Path) -> None:
    ins = json.loads(run_cli(capsys, "inspect", written["pte"], "--json")[1])
    d = ins["delegates"][0]
    # Engine offset no longer 16-byte aligned.
    bad = corrupt(
        written["pte"],
        tmp_path / "model.pte",
        at=d["absolute_offset"] + 12,
        data=(33).to_bytes(4, "little"),
    )
    code, out, _err = run_cli(capsys, "verify", bad)
    assert code == 1 and "bad TensorRT blob header" in out


def test_verify_run_loads_program(capsys, written) -> None:
    code, out, _err = run_cli(
        capsys, "verify", written["pte"], "--data", written["ptd"], "--run", "--json"
    )
    assert code == 0, out
    result = json.loads(out)
    assert result["runtime"]["loaded"] is True
    # The benchmark backend exists only at export time: the method is skipped, not failed.
    assert result["runtime"]["methods"]["forward"].startswith("skipped")


@needs_ptd_runtime
def test_verify_run_loads_xnnpack_methods(capsys, tmp_path: Path) -> None:
    from lowered import xnnpack_linear_program  # lowered once a run, a copy each

    built = xnnpack_linear_program(external_tag="model")
    save_ours(built.manager, tmp_path / "mlp.pte")
    code, out, _err = run_cli(
        capsys, "verify", tmp_path / "mlp.pte", "--data", tmp_path / "model.ptd", "--run"
    )
    assert code == 0, out
    assert "method forward: executed on zeros (1 outputs)" in out


@needs_ptd_runtime
def test_verify_run_survives_a_runtime_crash(capsys, tmp_path: Path) -> None:
    """Without its .ptd an XNNPACK method cannot load (1.5.1 segfaults): reported, not fatal."""
    from lowered import xnnpack_linear_program  # lowered once a run, a copy each

    built = xnnpack_linear_program(external_tag="model")
    save_ours(built.manager, tmp_path / "mlp.pte")
    code, out, _err = run_cli(capsys, "verify", tmp_path / "mlp.pte", "--run", "--json")
    assert code == 1, out
    result = json.loads(out)
    assert result["ok"] is False
    assert result["runtime"]["loaded"] is True  # the program loads; its method does not
    state = result["runtime"]["methods"]["forward"]
    assert state.startswith("crashed (SIG") or state.startswith("RuntimeError"), state
    messages = " ".join(p["message"] for p in result["problems"])
    assert "while loading method 'forward'" in messages or "failed to load" in messages
    assert "pass --data FILE.ptd" in messages


def test_verify_external_constants(capsys, written, tmp_path: Path) -> None:
    """Emitter constants in a .ptd: a .pte without segment data, tensors found by name."""
    from lowered import portable_linear_program  # lowered once a run, a copy each

    built = portable_linear_program()
    save_ours(built.manager, tmp_path / "m.pte")
    ptd = tmp_path / "_default_external_constant.ptd"
    ins = json.loads(run_cli(capsys, "inspect", tmp_path / "m.pte", "--json")[1])
    assert ins["external_tensors"] == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
    assert ins["problems"] == []
    code, out, _err = run_cli(capsys, "verify", tmp_path / "m.pte", "--data", ptd, "--run")
    assert code == 0, out
    assert "method forward: executed on zeros (1 outputs)" in out
    code, out, _err = run_cli(capsys, "verify", tmp_path / "m.pte", "--data", written["ptd"])
    assert code == 1
    assert "external tensor 'l1.weight' is in neither" in out


def test_recover(capsys, tmp_path: Path) -> None:
    code, out, _err = run_cli(capsys, "recover", tmp_path)
    assert code == 0 and "nothing to recover" in out
    code, out, _err = run_cli(capsys, "recover", tmp_path, "--json")
    assert code == 0 and json.loads(out) == []
    code, _out, err = run_cli(capsys, "recover", tmp_path / "nope")
    assert code == 1 and "not a directory" in err


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from trtet_store.io import BlobStore, write_file

    store = BlobStore(sys.argv[1])
    blob = store.put(os.urandom(8 << 20))

    def progress(done, total):
        if done > 3 << 20:
            os.kill(os.getpid(), signal.SIGKILL)

    write_file(sys.argv[2], [b"head", blob], consume=True, chunk_size=1 << 20, progress=progress)
    """
)


def test_recover_finishes_an_interrupted_write(capsys, tmp_path: Path) -> None:
    """A writer SIGKILLed in the middle of a move leaves a journal; the command resolves it."""
    dest = tmp_path / "out" / "model.bin"
    dest.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, os.fspath(tmp_path / "out"), os.fspath(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    code, out, _err = run_cli(capsys, "recover", dest.parent, "--json")
    assert code == 0, out
    outcomes = json.loads(out)
    actions = {o["action"] for o in outcomes}
    assert actions & {"rolled forward", "rolled back"}, outcomes
    if "rolled forward" in actions:
        assert dest.stat().st_size == 4 + (8 << 20)
        assert dest.read_bytes()[:4] == b"head"
    else:
        assert not dest.exists()
    code, out, _err = run_cli(capsys, "recover", dest.parent)
    assert code == 0 and "nothing to recover" in out
    assert not [p for p in dest.parent.iterdir() if "trtet" in p.name and p.suffix != ".blob"]


FACTORY_MODULE = textwrap.dedent(
    """
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(16, 32)
            self.l2 = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.l2(torch.relu(self.l1(x)))

    def make():
        torch.manual_seed(0)
        return MLP().eval(), (torch.randn(2, 16),)

    def as_dict():
        module, inputs = make()
        return {"module": module, "inputs": inputs}

    def decode():
        torch.manual_seed(1)
        return MLP().eval(), (torch.randn(1, 16),)

    not_callable = 3
    """
)


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    path = tmp_path / "mymodel.py"
    path.write_text(FACTORY_MODULE)
    return path


def _compile_and_save_available() -> bool:
    from trtet_store.export import executorch as adapter

    return hasattr(adapter, "save_program")


@needs_ptd_runtime
def test_compile_and_save_xnnpack(capsys, factory_file: Path, tmp_path: Path) -> None:
    if not _compile_and_save_available():
        pytest.skip("trtet_store.export.executorch.save_program has not landed yet")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out, err = run_cli(
        capsys,
        "compile-and-save",
        f"{factory_file}:as_dict",
        out_dir / "mlp.pte",
        "--backend",
        "xnnpack",
        "--external-engine-data",
        "weights",
        "--json",
        "--no-progress",
    )
    assert code == 0, err
    report = json.loads(out)
    assert Path(report["path"]).name == "mlp.pte"
    assert [Path(p).name for p in report["data_paths"]] == ["weights.ptd"]
    code, out, _err = run_cli(
        capsys, "verify", out_dir / "mlp.pte", "--data", out_dir / "weights.ptd", "--run"
    )
    assert code == 0 and "method forward: executed on zeros (1 outputs)" in out


def test_compile_and_save_several_methods_with_a_backend_config(
        capsys, factory_file: Path, tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    out = tmp_path / "two.pte"
    code, _out, err = run_cli(
        capsys, "compile-and-save", "--method", f"prefill={factory_file}:make",
        "--method", f"decode={factory_file}:decode", out, "--backend", "xnnpack",
        "--backend-config", "segment_alignment=8192", "--no-progress")
    assert code == 0, err
    program = Runtime.get().load_program(os.fspath(out))
    assert program.method_names == {"prefill", "decode"}
    ins = json.loads(run_cli(capsys, "inspect", out, "--json")[1])
    assert ins["header"]["segment_base_offset"] % 8192 == 0
    code, _out, err = run_cli(capsys, "verify", out, "--run")
    assert code == 0 and "method decode: executed on zeros (1 outputs)" in _out


def test_compile_and_save_refuses_bad_method_options(capsys, factory_file: Path,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "m.pte"
    for argv, expect in [
        (["--method", f"a={factory_file}:make", f"{factory_file}:make", out], "either"),
        ([out], "either"),
        (["--method", f"{factory_file}:make", out], "NAME=MODULE.py:FACTORY"),
        (["--method", f"bad-name={factory_file}:make", out], "not a Python identifier"),
        ([f"{factory_file}:make", out, "--backend-config", "nope=1"], "KEY=VALUE"),
    ]:
        code, _out, err = run_cli(capsys, "compile-and-save", *argv, "--backend", "xnnpack",
                                  "--no-progress")
        assert code == 1 and expect in err, (argv, err)
        assert not out.exists() and not (tmp_path / ".trtet-staging").exists()


def test_compile_and_save_tensorrt_unavailable(capsys, factory_file: Path, tmp_path: Path) -> None:
    try:
        import torch_tensorrt  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("torch_tensorrt is installed here")
    code, _out, err = run_cli(
        capsys, "compile-and-save", f"{factory_file}:make", tmp_path / "m.pte", "--no-progress"
    )
    assert code == 1
    assert "TensorRT" in err
    assert not (tmp_path / "m.pte").exists()


def test_compile_and_save_bad_targets(capsys, factory_file: Path, tmp_path: Path) -> None:
    for target, expect in [
        ("no-colon-here", "MODULE.py:FACTORY"),
        (f"{tmp_path / 'missing.py'}:make", "no such file"),
        (f"{factory_file}:nothing", "no attribute"),
        (f"{factory_file}:not_callable", "not callable"),
    ]:
        code, _out, err = run_cli(capsys, "compile-and-save", target, tmp_path / "m.pte")
        assert code == 1, target
        assert expect in err, (target, err)
