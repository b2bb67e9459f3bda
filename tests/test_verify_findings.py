"""``verify`` and ``inspect`` catch what issue 22 (finding 8) saw them miss.

- a one-bit flip in a TensorRT engine's metadata JSON (``io_bindings`` ->
  ``io_bineings``, or any other field the runtime reads by name);
- a flipped engine byte: nothing in the file records an inline engine's
  digest (every byte we could put one in is read by the runtime), so verify
  shows every digest it computes, in text and JSON, for comparison with the
  build's, and ``--engine-digest`` checks them;
- ``--engine-digest not-a-digest`` is refused as a value;
- a ``.pte`` that needs a ``.ptd`` says which keys, which ``.ptd`` next to it
  holds them, and whether it is this program's data.

Programs are real: a stubbed TensorRT build through ``compile_and_save`` (the
build is the only stub, see ``trtet_store.testing.stub_tensorrt``), an XNNPACK
MLP with its weights in ``model.ptd``, and the MLP on portable kernels with
emitter-external constants.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from versions import needs_ptd_runtime

pytest.importorskip("executorch.exir")

import trtet_store  # noqa: E402
from trtet_store import cli  # noqa: E402
from trtet_store.export import tensorrt as trt  # noqa: E402
from trtet_store.export import trt_blob  # noqa: E402
from trtet_store.export.executorch import program_layouts  # noqa: E402
from trtet_store.inspector import inspect_file, verify  # noqa: E402
from trtet_store.inspector.trt_metadata import REQUIRED, check_metadata  # noqa: E402
from trtet_store.io import write_files  # noqa: E402
from trtet_store.io.units import MiB  # noqa: E402
from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu  # noqa: E402


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | os.PathLike) -> tuple[int, str, str]:
    code = cli.main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trt_program(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A TensorRT program (two 1 MiB engines, stubbed build) and the digests of its engines."""
    d = tmp_path_factory.mktemp("trt")
    builder = FakeBuilder(engine_sizes=(1 * MiB, 1 * MiB), seeds=(1, 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trt, "check_available", lambda: None)
        mp.setattr(trt, "build_engines", builder)
        module, inputs = linear_relu()
        trtet_store.compile_and_save(module, inputs, d / "m.pte")
    return {"pte": d / "m.pte", "digests": [digest for _, digest in builder.built]}


def _copy(src: Path, dst_dir: Path) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(src, dst_dir / src.name))


def _flip_bit(path: Path, at: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ (1 << bit)]))


def _metadata_span(pte: Path) -> tuple[int, int]:
    """File offset and size of the first delegate's TensorRT metadata."""
    d = inspect_file(pte).delegates[0]
    h = d["tensorrt"]["header"]
    return d["absolute_offset"] + h["metadata_offset"], h["metadata_size"]


# -- metadata ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", REQUIRED)
def test_a_one_bit_flip_in_a_metadata_field_name_fails_verify_and_inspect(
        trt_program, tmp_path, capsys, key):
    """``io_bindings`` -> ``io_bineings`` (the issue's flip), and the same for every field.

    Python's parser reads each field with a default, so the blob still parses
    (torch-tensorrt's ``deserialize_engine`` accepts it); the runtime looks
    each one up by name and silently gets nothing.
    """
    pte = _copy(trt_program["pte"], tmp_path)
    assert verify(pte).ok
    start, size = _metadata_span(pte)
    meta = pte.read_bytes()[start:start + size]
    name = f'"{key}"'.encode()
    # The flip for io_bindings ('d' 0x64 -> 'e' 0x65); a low bit of the
    # name's third letter for the others.
    at = meta.index(name) + (1 + key.index("d") if key == "io_bindings" else 3)
    _flip_bit(pte, start + at)
    flipped = pte.read_bytes()[start:start + size]
    assert json.loads(flipped) != json.loads(meta)  # still JSON: only the name changed
    if key == "io_bindings":
        assert b'"io_bineings"' in flipped

    result = verify(pte)
    assert not result.ok
    assert any(f"no {key!r} field" in p.message and p.severity == "error"
               for p in result.all_problems), result.all_problems
    ins = inspect_file(pte)
    assert any(f"no {key!r} field" in p.message for p in ins.errors), ins.problems
    code, out, _ = run_cli(capsys, "inspect", pte)
    assert code == 1 and f"no {key!r} field" in out
    code, out, _ = run_cli(capsys, "verify", pte)
    assert code == 1 and "FAILED" in out


def test_every_metadata_we_and_torch_tensorrt_write_passes_the_check():
    """No false alarm: the metadata of trt_blob (upstream's field order) for each layout."""
    bindings = (trt_blob.IOBinding("cache"), trt_blob.IOBinding("x", "float32", (2, 3)),
                trt_blob.IOBinding("next", is_input=False),
                trt_blob.IOBinding("cache_out", is_input=False))
    for meta in (
        trt_blob.BlobMetadata(io_bindings=bindings[1:3], target_platform="linux_x86_64"),
        trt_blob.BlobMetadata(io_bindings=bindings,
                              aliased_io=(("cache_out", "cache", "kv_cache_update"),)),
        trt_blob.BlobMetadata(io_bindings=bindings[1:3], engine_key="ab" * 16 + "_trt_engine"),
    ):
        blob = trt_blob.encode(meta, b"e" * 32)
        header = trt_blob.BlobHeader.from_bytes(blob)
        raw = blob[header.metadata_offset:header.metadata_offset + header.metadata_size]
        decoded, errors, warnings = check_metadata(raw, header.magic)
        assert (errors, warnings) == ([], []) and decoded == json.loads(raw)


@pytest.mark.parametrize("change, expected", [
    (lambda m: m.update(device_id=True), "'device_id' is True"),
    (lambda m: m.update(io_bindings=[m["io_bindings"][0]]), "names no output"),
    (lambda m: m.update(io_bindings=m["io_bindings"][::-1]), "input after an output"),
    (lambda m: m.update(aliased_io=[{"output": "y", "input": "x", "kind": "user"}]),
     "must be TR02"),
    (lambda m: m.update(aliased_io=[{"output": "x", "input": "y", "kind": "user"}]),
     "is not an output binding"),
])
def test_metadata_the_runtime_would_misread_is_an_error(change, expected):
    meta = json.loads(trt_blob.BlobMetadata(io_bindings=(
        trt_blob.IOBinding("x"), trt_blob.IOBinding("y", is_input=False))).to_json())
    change(meta)
    _, errors, _ = check_metadata(json.dumps(meta).encode(), b"TR01")
    assert any(expected in e for e in errors), errors
    # The order the C++ parser needs: a scalar before the arrays is not found.
    moved = {"device_id": 0, **{k: v for k, v in meta.items() if k != "device_id"}}
    _, errors, _ = check_metadata(json.dumps(moved).encode(), b"TR01")
    assert any("order" in e for e in errors), errors


# -- engine digests ------------------------------------------------------------------------


def test_verify_shows_every_engine_digest_it_computes(trt_program, tmp_path, capsys):
    """In text and JSON: a changed engine byte shows as a digest other than the build's."""
    pte = _copy(trt_program["pte"], tmp_path)
    built = trt_program["digests"]
    code, out, _ = run_cli(capsys, "verify", pte, "--json")
    assert code == 0
    engines = json.loads(out)["engines"]
    assert [e["xxh3_128"] for e in engines] == built
    assert [e["expected"] for e in engines] == [None, None]
    assert all(e["layout"] == "inline" and e["size"] == MiB for e in engines)
    code, out, _ = run_cli(capsys, "verify", pte)
    assert code == 0 and all(d in out for d in built)

    _flip_bit(pte, engines[1]["offset"] + 4321)
    code, out, _ = run_cli(capsys, "verify", pte, "--json")
    # Nothing in the file can tell (the runtime reads every byte we could record a
    # digest in): the shown digest is how a user finds it without the build's list.
    assert code == 0
    shown = [e["xxh3_128"] for e in json.loads(out)["engines"]]
    assert shown[0] == built[0] and shown[1] != built[1]
    code, out, _ = run_cli(capsys, "verify", pte, "--json",
                           *(a for d in built for a in ("--engine-digest", d)))
    result = json.loads(out)
    assert code == 1 and [e["expected"] for e in result["engines"]] == [True, False]
    assert any(shown[1] in p["message"] for p in result["problems"])


def test_engine_digest_must_be_a_digest(trt_program, capsys):
    pte = trt_program["pte"]
    for bad in ("not-a-digest", "ab" * 15, "zz" * 16, "ab" * 32):
        with pytest.raises(SystemExit) as exc:
            cli.main(["verify", os.fspath(pte), "--engine-digest", bad])
        assert exc.value.code == 2
        assert "not an xxh3-128 digest" in capsys.readouterr().err
        with pytest.raises(ValueError, match="not an xxh3-128 digest"):
            verify(pte, engine_digests=[bad])
    first, second = trt_program["digests"]
    # The forms CompileReport gives: the digest, upper case, or the named-data key;
    # and one string is one digest, not 32 one-letter ones.
    code, _out, _ = run_cli(capsys, "verify", pte, "--engine-digest", first.upper(),
                            "--engine-digest", f"{second}_trt_engine")
    assert code == 0
    assert not verify(pte, engine_digests=first).ok  # the second engine is not expected
    assert verify(pte, engine_digests=[first, f"{second}_trt_engine"]).ok


# -- a .pte that needs a .ptd --------------------------------------------------------------


def _save(manager, pte: Path) -> None:
    pte.parent.mkdir(parents=True, exist_ok=True)
    write_files(program_layouts(manager, pte))


@pytest.fixture(scope="module")
def xnnpack_sets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two saves of the XNNPACK MLP (other weights), each mlp.pte + model.ptd."""
    from programs import xnnpack_linear_program

    sets = {}
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"xnnpack{seed}")
        _save(xnnpack_linear_program(external_tag="model", seed=seed).manager, d / "mlp.pte")
        sets[seed] = d
    return sets


@needs_ptd_runtime
def test_a_pte_that_needs_a_ptd_says_which_and_where(xnnpack_sets, tmp_path, capsys):
    src = xnnpack_sets[0]
    pte, ptd = _copy(src / "mlp.pte", tmp_path / "set"), _copy(src / "model.ptd", tmp_path / "set")
    result = verify(pte)
    assert result.ok, result.all_problems
    ext = result.external_data
    assert ext is not None and ext["complete"] and len(ext["needed"]) == 4
    assert {e["found_in"] for e in ext["needed"]} == {ptd}
    assert [(f["path"], f["how"], f["holds"]) for f in ext["files"]] == [(ptd, "next to it", 4)]
    assert [i.path for i in result.files] == [pte, ptd]
    code, out, _ = run_cli(capsys, "verify", pte)
    assert code == 0 and "needs 4 key(s) from .ptd files" in out and "in model.ptd" in out
    code, out, _ = run_cli(capsys, "verify", pte, "--json")
    assert json.loads(out)["external_data"]["complete"] is True

    # Alone: still a word about it (a warning: the data may live elsewhere).
    ptd.unlink()
    result = verify(pte)
    assert result.external_data is not None and not result.external_data["complete"]
    assert any("none is next to it" in p.message and p.severity == "warning"
               for p in result.problems)
    code, out, _ = run_cli(capsys, "verify", pte)
    assert "no .ptd next to it" in out and "incomplete" in out


@needs_ptd_runtime
def test_a_ptd_of_another_save_next_to_the_pte_fails(xnnpack_sets, tmp_path, capsys):
    """The mixed set of finding 9: the .pte of one save beside the .ptd of another."""
    pte = _copy(xnnpack_sets[0] / "mlp.pte", tmp_path)
    other = _copy(xnnpack_sets[1] / "model.ptd", tmp_path)
    result = verify(pte)
    assert not result.ok
    assert any("not this program's data" in p.message for p in result.problems)
    assert not result.external_data["complete"]
    code, out, _ = run_cli(capsys, "verify", pte, "--data", other)
    assert code == 1 and "is in neither the .pte nor model.ptd" in out


@needs_ptd_runtime
def test_a_changed_weight_in_the_ptd_fails(xnnpack_sets, tmp_path):
    """XNNPACK names each weight by its SHA-256: a flipped byte in model.ptd is found."""
    pte = _copy(xnnpack_sets[0] / "mlp.pte", tmp_path)
    ptd = _copy(xnnpack_sets[0] / "model.ptd", tmp_path)
    entry = inspect_file(ptd).named_data[0]
    _flip_bit(ptd, entry["absolute_offset"] + entry["size"] // 2)
    result = verify(pte)
    assert not result.ok
    assert any("SHA-256" in p.message and "not the ones" in p.message for p in result.problems)
    # Every digest computed is shown: the changed weight's is not its key.
    shown = {e["key"]: e["sha256"] for e in result.external_data["needed"]}
    assert len(shown) == 4 and shown[entry["key"]] != entry["key"]
    assert all(k == v for k, v in shown.items() if k != entry["key"])


@needs_ptd_runtime
def test_external_tensors_of_another_shape_fail(tmp_path):
    """Emitter-external constants: same names, other shapes: not this program's data."""
    from programs import portable_linear_program

    _save(portable_linear_program(hidden=256).manager, tmp_path / "a" / "m.pte")
    _save(portable_linear_program(hidden=128).manager, tmp_path / "b" / "m.pte")
    pte = tmp_path / "a" / "m.pte"
    result = verify(pte)
    assert result.ok and result.external_data["complete"], result.all_problems
    assert {e["what"] for e in result.external_data["needed"]} == {"external tensor"}
    shutil.copy(tmp_path / "b" / "_default_external_constant.ptd",
                tmp_path / "a" / "_default_external_constant.ptd")
    result = verify(pte)
    assert not result.ok
    assert any("'l1.weight' is FLOAT[128, 64]" in p.message
               and "not this program's data" in p.message for p in result.problems), \
        result.problems
