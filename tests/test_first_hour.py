"""Issue 56 ("the first hour"): what a newcomer without a GPU meets first, said in the messages.

Item 4: the error of a missing TensorRT names the stub builder (both forms, the
shell's and Python's, and the Python form is a real name); ``TRTET_STUB_TENSORRT=1``
installs the stub refitter too; ``compile-and-save --refittable`` builds refittable
engines, so a weights-only change is refit from the engine cache from a shell.
Item 7: the messages that misled, mended (each test shows the new text).
In-process through ``trtet_store.cli.main`` where a child is not the guarantee.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from versions import needs_file_backed_data

from trtet_store.cli import main
from trtet_store.cli.stub_builder import ENV

FACTORY = '''\
import torch


def make():
    torch.manual_seed({seed})
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return module, (torch.randn(2, 16),)
'''


def _engine_lines(out: str) -> list[str]:
    return [x.strip().split(": ", 1)[1] for x in out.splitlines()
            if x.strip().startswith("engine ")]


# -- item 4: no GPU, said up front ---------------------------------------------------------

def test_tensorrt_unavailable_names_the_stub_in_both_forms() -> None:
    import trtet_store.testing.stub_tensorrt as stub
    from trtet_store.export import tensorrt

    with pytest.raises(tensorrt.TensorRTUnavailableError) as info:
        tensorrt.check_available()  # this machine has no Torch-TensorRT, no GPU
    text = str(info.value)
    assert "TRTET_STUB_TENSORRT=1 for the trtet-store command" in text, text
    assert ("`with trtet_store.testing.stub_tensorrt.installed("
            "trtet_store.testing.stub_tensorrt.FakeBuilder()):`") in text, text
    # The names it gives are real: the variable the CLI reads, the context manager.
    assert ENV == "TRTET_STUB_TENSORRT" and callable(stub.installed) and stub.FakeBuilder()
    assert "\n" not in text  # still one line


def test_the_stub_variable_installs_the_stub_refitter_too(monkeypatch) -> None:
    from trtet_store.cli.stub_builder import stub_builder
    from trtet_store.export import tensorrt
    from trtet_store.testing.stub_tensorrt import FakeRefitter

    monkeypatch.setenv(ENV, "1")
    before = (tensorrt.refit_engine, tensorrt.check_refit)
    with stub_builder("tensorrt"):
        assert isinstance(tensorrt.refit_engine, FakeRefitter)
        assert tensorrt.check_refit == tensorrt.refit_engine.check
    assert (tensorrt.refit_engine, tensorrt.check_refit) == before


def test_refittable_from_the_shell_refits_a_weights_only_change(tmp_path, monkeypatch,
                                                                capsys) -> None:
    """Built refittable, then new weights: a refit, not a build (the stub's refitter)."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m0.py").write_text(FACTORY.format(seed=0))
    (tmp_path / "m1.py").write_text(FACTORY.format(seed=1))
    cache = ["--engine-cache=" + str(tmp_path / "cache"), "--no-progress"]
    assert main(["compile-and-save", "m0.py:make", "a.pte", "--refittable", *cache]) == 0
    [built] = _engine_lines(capsys.readouterr().out)
    assert built.startswith("miss, cached ("), built
    assert main(["compile-and-save", "m1.py:make", "b.pte", "--refittable", *cache]) == 0
    [event] = _engine_lines(capsys.readouterr().out)
    assert event.startswith("refit ("), event
    assert (tmp_path / "b.pte").stat().st_size > 0


def test_refittable_without_out_is_refused_before_the_build(tmp_path, monkeypatch,
                                                           capsys) -> None:
    monkeypatch.setenv(ENV, "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m0.py").write_text(FACTORY.format(seed=0))
    code = main(["compile-and-save", "m0.py:make", "--refittable",
                 "--publish", "s3://b/m.pte", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "--refittable needs OUT" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m0.py"]


# -- item 7: the messages that misled --------------------------------------------------------

def test_a_bare_tensor_for_inputs_is_a_type_error_saying_tuple(tmp_path) -> None:
    """Before: RuntimeError: Boolean value of Tensor with more than one value is ambiguous."""
    import trtet_store
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    module, (x,) = linear_relu()
    with installed(FakeBuilder()) as builder, pytest.raises(TypeError) as info:
        trtet_store.compile_and_save(module, x, tmp_path / "m.pte")
    assert str(info.value) == ("inputs must be a tuple of the positional example inputs, got "
                               "a Tensor: for one input give a tuple of one, (x,) not x")
    assert builder.built == [] and list(tmp_path.iterdir()) == []


BARE = '''\
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16)).eval(), torch.randn(2, 16)
'''


def test_a_factory_returning_a_bare_tensor_is_told_to_return_a_tuple(tmp_path, monkeypatch,
                                                                     capsys) -> None:
    """Before: the tensor was split into its rows by tuple(x), and the export failed later."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(BARE)
    assert main(["compile-and-save", "m.py:make", "a.pte", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert ("FACTORY()'s inputs must be a tuple of the positional example inputs, got a "
            "Tensor: for one input return a tuple of one, (module, (x,)) not (module, x)"
            ) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


def test_engine_cache_before_the_positionals_does_not_swallow_the_factory(
        tmp_path, monkeypatch, capsys) -> None:
    """Before: `m.py:make` became the cache's directory, and OUT alone was left."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(FACTORY.format(seed=0))
    code = main(["compile-and-save", "--engine-cache", "m.py:make", "a.pte", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [event] = _engine_lines(captured.out)
    assert event.startswith("miss, cached ("), event
    assert (tmp_path / "a.pte").is_file() and not (tmp_path / "m.py:make").exists()
    assert any((tmp_path / "xdg" / "trtet_store" / "engines").iterdir())  # the default cache
    # A directory is still a directory, and `=` always takes the value.
    from trtet_store.cli import _negative_values_joined

    assert _negative_values_joined(["compile-and-save", "--engine-cache", "c", "m.py:f", "o.pte"]
                                   )[1:3] == ["--engine-cache", "c"]
    assert _negative_values_joined(["--engine-cache=x.pte"]) == ["--engine-cache=x.pte"]
    assert _negative_values_joined(["--engine-cache", "out/x.pte"]) == ["--engine-cache=",
                                                                         "out/x.pte"]


def test_a_backend_typo_is_named_even_with_the_stub_variable_set(monkeypatch, capsys) -> None:
    """Before: TRTET_STUB_TENSORRT=1 stands in for the TensorRT build, and --backend xnnpak
    builds no engines: unset TRTET_STUB_TENSORRT."""
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(SystemExit) as info:
        main(["compile-and-save", "m.py:make", "a.pte", "--backend", "xnnpak"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err == ("trtet-store compile-and-save: argument --backend: 'xnnpak' is not a "
                   "backend: did you mean xnnpack? choose tensorrt (the default) or xnnpack\n")


def test_cli_errors_spell_flags_not_python_keywords(tmp_path, monkeypatch, capsys) -> None:
    """Before: "... (or use backend='xnnpack' to export for CPU)" from compile-and-save."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(FACTORY.format(seed=0))
    assert main(["compile-and-save", "m.py:make", "a.pte", "--no-progress"]) == 1
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("trtet-store compile-and-save: "))
    assert line.startswith("trtet-store compile-and-save: TensorRTUnavailableError: --backend "
                           "tensorrt needs "), line
    assert "(or use --backend xnnpack to export for CPU)" in line, line
    assert "backend=" not in line and "TRTET_STUB_TENSORRT=1" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


@pytest.mark.parametrize(("api", "cli"), [
    # remote/upload/send.py: a key that exists, without --replace
    ("s3://b/m.pte already exist; pass replace=True (--replace) to publish a new version",
     "s3://b/m.pte already exist; pass --replace to publish a new version"),
    # sets/publish.py: a set that exists
    ("the set s3://b/s exists; pass if_exists='replace' to publish a new version",
     "the set s3://b/s exists; pass --replace to publish a new version"),
    ("(publish again, with replace=True to replace it)",
     "(publish again, with --replace to replace it)"),
    ("engine_cache applies to backend='tensorrt' (it caches TensorRT builds)",
     "--engine-cache applies to --backend tensorrt (it caches TensorRT builds)"),
])
def test_report_error_translates_the_api_spelling(api, cli, capsys) -> None:
    from trtet_store.cli._common import report_error

    assert report_error(ValueError(api), "publish") == 1
    assert capsys.readouterr().err == f"trtet-store publish: ValueError: {cli}\n"


@pytest.mark.parametrize(("argv", "usage"), [
    (["inspect", "m.pte", "--nope"], "usage: trtet-store inspect "),
    (["cache", "list", "--nope"], "usage: trtet-store cache list "),
])
def test_an_unknown_flag_shows_its_commands_usage(argv, usage, capsys) -> None:
    """Before: "usage: trtet-store [-h] [--version] [-v] COMMAND ..." (the top level's)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(usage), err
    assert err.rstrip().endswith(f"error: unrecognized arguments: {argv[-1]}"), err


def test_versioned_prints_the_path_that_exists(tmp_path, monkeypatch, capsys) -> None:
    """Before: "wrote <dir>/a.pte", a path a versioned write never makes."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(FACTORY.format(seed=0))
    assert main(["compile-and-save", "m.py:make", str(tmp_path / "a.pte"), "--versioned",
                 "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"wrote {tmp_path}/a/a.pte ({tmp_path}/a -> .versions/a-1)", first
    assert (tmp_path / "a" / "a.pte").is_file() and not (tmp_path / "a.pte").exists()


# -- item 6 (part): commands that need no model import no torch, and stay quiet -------------

CHILD = """
import json, sys
from trtet_store.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchao")
               or m in ("executorch.exir", "executorch.exir.program"))
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """a.pte (its engines in eng.ptd) and an engine cache holding its engine, by the stub."""
    import os

    here = tmp_path_factory.mktemp("written")
    (here / "m.py").write_text(FACTORY.format(seed=0))
    saved, cwd = os.environ.get(ENV), os.getcwd()
    os.environ[ENV] = "1"
    os.chdir(here)
    try:
        assert main(["compile-and-save", "m.py:make", "a.pte", "--external-engine-data", "eng",
                     "--engine-cache=" + str(here / "cache"), "--no-progress"]) == 0
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop(ENV)
        else:
            os.environ[ENV] = saved
    return here


def _child(*argv: object, cwd: Path) -> tuple[dict, str, str]:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in (ENV, "TORCH_LOGS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", CHILD, *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    *rest, last = done.stderr.splitlines()
    return json.loads(last), done.stdout, "\n".join(rest)


#: Each command that needs no model, run one after another in one fresh interpreter: the
#: modules it added are told per command (a command that imports torch is named).
EVERY = """
import contextlib, io, json, sys
from trtet_store.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchao")
                   or m in ("executorch.exir", "executorch.exir.program"))
    done.append({"argv": " ".join(argv), "code": code, "heavy": heavy[:3],
                 "said": bool(out.getvalue().strip())})
print(json.dumps(done))
"""


@needs_file_backed_data  # `written` keeps its engines in eng.ptd (--external-engine-data)
def test_commands_that_need_no_model_import_no_torch(written, s3env, tmp_path, capsys) -> None:
    """--help, inspect, verify without --run, cache list/stats/prune and list/push/pull/prune
    --remote, publish of files, fetch, publish-set, fetch-set, recover: none imports torch or
    ExecuTorch's exporter (``executorch.exir``), in one interpreter, one after another.
    Before (inspect, verify): torch and all of executorch.exir imported, 4-6 s, to read
    headers; (cache pull) 10-14 s for 4 MiB."""
    import json
    import os
    import subprocess
    import sys

    assert main(["cache", "--dir", str(written / "cache"), "--json", "list"]) == 0
    [key] = [r["key"] for r in json.loads(capsys.readouterr().out) if r["kind"] == "build"]
    url, ep = f"s3://{s3env.bucket}", ["--endpoint-url", s3env.endpoint.url]
    local = ["cache", "--dir", str(written / "cache")]
    pulled = ["cache", "--dir", str(tmp_path / "pulled")]
    every = [
        ["--help"], ["inspect", "a.pte"], ["inspect", "--json", "a.pte"],
        ["verify", "a.pte", "--data", "eng.ptd"],
        [*local, "list"], [*local, "stats"], [*local, "prune", "--max-bytes", "1G"],
        [*local, "push", "--remote", f"{url}/tier", *ep, "--no-progress"],
        [*local, "list", "--remote", f"{url}/tier", *ep],
        [*pulled, "pull", "--remote", f"{url}/tier", *ep, "--no-progress", key],
        [*local, "prune", "--remote", f"{url}/tier", "--older-than", "30d", *ep],
        ["publish", "a.pte", "eng.ptd", f"{url}/m/a.pte", *ep, "--no-progress"],
        ["fetch", f"{url}/m/a.pte", str(tmp_path / "got.pte"), *ep, "--no-progress"],
        ["publish-set", f"{url}/set/", "--member", "a", "a.pte", "eng.ptd", *ep,
         "--no-progress"],
        ["fetch-set", f"{url}/set/", str(tmp_path / "set"), *ep, "--no-progress"],
        ["recover", str(written)],
    ]
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "TORCH_LOGS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", EVERY, json.dumps(every)], cwd=written,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(proc.stdout)
    assert [d["argv"] for d in done] == [" ".join(a) for a in every]
    assert [d for d in done if d["code"] != 0 or not d["said"] or d["heavy"]] == [], \
        (done, proc.stderr[-3000:])
    assert proc.stderr == "", proc.stderr  # and said nothing on stderr (no warnings)
    assert (tmp_path / "got.pte").is_file() and (tmp_path / "set").is_dir()


@needs_file_backed_data  # `written` (its engines in eng.ptd)
def test_third_party_warnings_only_with_v(written) -> None:
    """Before: "Failed to load .../torchao/_C_mxfp8...so" and torch's "W... _pytree.py:630]
    ... Enum subclass" on every command that imports torch (compile-and-save's factory does;
    without TensorRT and the stub it then fails, one line)."""
    got, out, err = _child("compile-and-save", "m.py:make", "x.pte", "--no-progress",
                           cwd=written)
    assert got["code"] == 1 and "torch" in got["heavy"], (got, err)
    assert err.startswith("trtet-store compile-and-save: TensorRTUnavailableError: ") and \
        len(err.splitlines()) == 1, err
    got, _out, err = _child("-v", "compile-and-save", "m.py:make", "x.pte", "--no-progress",
                            cwd=written)
    # (torchao's logger under -v's format, or torch's own handler: both from the venv's pins)
    assert got["code"] == 1 and ("WARNING torchao" in err or "_pytree.py" in err), err
    assert not (written / "x.pte").exists()


@needs_file_backed_data
def test_the_ptd_reader_without_torch_reads_what_executorchs_reads(written) -> None:
    """A .ptd's FlatTensor read in pure Python (inspect X.ptd, verify --data: no torch, no
    flatc) has ExecuTorch's reader's fields, on a real file; a cut flatbuffer is refused."""
    from executorch.exir.scalar_type import ScalarType
    from executorch.extension.flat_tensor.serialize.serialize import _deserialize_to_flat_tensor

    from trtet_store.export._executorch_private.flat_tensor import read_flat_tensor

    def fields(ft):
        return (ft.version, [(s.offset, s.size) for s in ft.segments],
                [(n.key, n.segment_index, n.tensor_layout and (
                    n.tensor_layout.scalar_type, list(n.tensor_layout.sizes),
                    list(n.tensor_layout.dim_order))) for n in ft.named_data])

    data = (written / "eng.ptd").read_bytes()
    fb_end = int.from_bytes(data[16:24], "little") + int.from_bytes(data[24:32], "little")
    ours = fields(read_flat_tensor(data[:fb_end], ScalarType))
    assert ours == fields(_deserialize_to_flat_tensor(data[:fb_end]))
    assert len(ours[1]) == 1 and ours[1][0][1] > 0 and ours[2][0][0]
    with pytest.raises(ValueError, match="outside the flatbuffer"):
        read_flat_tensor(data[:64])


def _large_flat_tensor() -> bytes:
    """A FlatTensor flatbuffer with 64-bit offsets and sizes and a tensor layout."""
    import flatbuffers  # ExecuTorch's dependency (its generated readers use it)

    b = flatbuffers.Builder(0)
    key = b.CreateString("weights/w")
    b.StartObject(2)
    b.PrependUint64Slot(0, 2**40 + 4096, 0)
    b.PrependUint64Slot(1, 2**33 + 5, 0)
    seg = b.EndObject()
    b.StartVector(4, 2, 4)
    b.PrependInt32(7)
    b.PrependInt32(3)
    sizes = b.EndVector()
    b.StartVector(1, 2, 1)
    b.PrependUint8(0)
    b.PrependUint8(1)
    dims = b.EndVector()
    b.StartObject(3)
    b.PrependInt8Slot(0, 6, 0)
    b.PrependUOffsetTRelativeSlot(1, sizes, 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    layout = b.EndObject()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, key, 0)
    b.PrependUint32Slot(1, 1, 0)
    b.PrependUOffsetTRelativeSlot(2, layout, 0)
    nd = b.EndObject()
    b.StartVector(4, 2, 4)
    b.PrependUOffsetTRelative(seg)
    b.PrependUOffsetTRelative(seg)
    segs = b.EndVector()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(nd)
    nds = b.EndVector()
    b.StartObject(3)
    b.PrependUint32Slot(0, 0, 0)
    b.PrependUOffsetTRelativeSlot(1, segs, 0)
    b.PrependUOffsetTRelativeSlot(2, nds, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"FT01")
    return bytes(b.Output())


def test_the_ptd_reader_reads_64_bit_segments_and_layouts() -> None:
    """Offsets and sizes past 4 GiB, a tensor layout, two segments: the same fields as
    ExecuTorch's reader (flatc) gives, from a flatbuffer built here."""
    from executorch.exir.scalar_type import ScalarType
    from executorch.extension.flat_tensor.serialize.serialize import _deserialize_to_flat_tensor

    from trtet_store.export._executorch_private.flat_tensor import read_flat_tensor

    data = _large_flat_tensor()
    theirs, ours = _deserialize_to_flat_tensor(data), read_flat_tensor(data, ScalarType)
    assert [(s.offset, s.size) for s in ours.segments] == \
        [(s.offset, s.size) for s in theirs.segments] == [(2**40 + 4096, 2**33 + 5)] * 2
    [nd], [want] = ours.named_data, theirs.named_data
    assert (nd.key, nd.segment_index) == (want.key, want.segment_index) == ("weights/w", 1)
    layout = nd.tensor_layout
    assert (layout.scalar_type, layout.sizes, layout.dim_order) == (
        want.tensor_layout.scalar_type, list(want.tensor_layout.sizes),
        list(want.tensor_layout.dim_order)) == (ScalarType.FLOAT, [3, 7], [1, 0])


AFTER = """
import sys
from trtet_store.cli import main
assert main(["inspect", "a.pte"]) == 0 and "torch" not in sys.modules
# The real executorch.exir afterwards: its __init__ runs, and finds the same reader.
reader = sys.modules["executorch.exir._serialize._flatbuffer_program"]
from executorch.exir import to_edge  # noqa: F401
from executorch.exir._serialize import _serialize_pte_binary  # noqa: F401
import executorch.exir._serialize._flatbuffer_program as again
assert again is reader, "two copies of the Program reader"
from trtet_store.inspector import verify
assert verify("a.pte").ok
print("ok")
"""


@needs_file_backed_data
def test_executorch_imports_for_real_after_a_torch_free_inspect(written) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", AFTER], cwd=written, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


# -- cache pull takes the key as `cache list --remote` shows it, or a unique prefix ----------

def test_cache_pull_takes_the_listed_key_or_a_unique_prefix(tmp_path, s3env, monkeypatch,
                                                            capsys) -> None:
    """Before: "trtet-store cache: ValueError: 'trt-0b164ac6-no-gpu' is in neither the engine
    cache ... nor the shared tier ... (list it with `trtet-store cache list --remote`)": the
    listing's own (shortened) key refused, and its hint pointing back to the listing."""
    import json

    monkeypatch.setenv(ENV, "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(FACTORY.format(seed=0))
    (tmp_path / "w.py").write_text(FACTORY.format(seed=0).replace("16, 16)", "16, 32)"))
    local = ["cache", "--dir", str(tmp_path / "cache")]
    for factory in ("m.py:make", "w.py:make"):
        assert main(["compile-and-save", factory, "a.pte", "--engine-cache=cache",
                     "--no-progress"]) == 0
    remote = ["--remote", f"s3://{s3env.bucket}/tier", "--endpoint-url", s3env.endpoint.url]
    assert main([*local, "push", *remote, "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*local, "--json", "list", *remote]) == 0
    keys = sorted(r["key"] for r in json.loads(capsys.readouterr().out))
    assert len(keys) == 2
    assert main([*local, "list", *remote]) == 0
    listed = [x.split()[0] for x in capsys.readouterr().out.splitlines()[1:-1]]
    short = next(x for x in listed if keys[0].startswith(x[:len("trt-") + 8]))
    assert short != keys[0] and len(short) < len(keys[0])

    def pull(into: str, key: str) -> tuple[int, str, str]:
        code = main(["cache", "--dir", str(tmp_path / into), "pull", *remote, "--no-progress",
                     key])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = pull("by-listing", short)  # as the listing shows it
    assert code == 0, err
    assert out.splitlines()[0] == f"{short}: 4.0 MiB downloaded", out
    prefix = keys[1][:len("trt-") + 6]  # 6 digits of the digest, as git takes them
    code, out, err = pull("by-prefix", prefix)
    assert code == 0 and out.splitlines()[0].endswith(": 4.0 MiB downloaded"), err
    code, out, err = pull("ambiguous", "trt-")
    assert code == 1 and out == ""
    assert err == (f"trtet-store cache: ValueError: 'trt-' names 2 entries of "
                   f"s3://{s3env.bucket}/tier: {', '.join(sorted(listed))}; give more of the "
                   "key\n"), err
    assert not (tmp_path / "ambiguous").exists()
