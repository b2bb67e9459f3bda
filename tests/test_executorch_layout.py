"""ExecuTorch programs as piece lists: byte identity with ExecuTorch, ownership, tags, runtime.

Programs are real executorch 1.5.1 programs (tests/programs.py). The runtime
is exercised in a subprocess: a bad ``.ptd`` can crash it (load_method of an
XNNPACK program without its weights segfaults in 1.5.1).
"""

from __future__ import annotations

import gc
import json
import os
import textwrap
import weakref
from pathlib import Path

import pytest
import warm
from versions import needs_file_backed_data, needs_ptd_runtime  # noqa: E402

pytest.importorskip("executorch.exir")

from lowered import portable_linear_program, xnnpack_linear_program  # noqa: E402
from programs import (  # noqa: E402
    MiB,
    NamedEntry,
    concat,
    executorch_outputs,
    named_data_program,
    standard_entries,
    write_payload_file,
)

from trtet_store.export import _executorch_private as priv  # noqa: E402
from trtet_store.export.executorch import (  # noqa: E402
    add_blob_as_named_data,
    payload_extents,
    program_layouts,
    ptd_file_name,
    ptd_layouts,
    pte_pieces,
)
from trtet_store.io.blobstore import Blob, BlobStore  # noqa: E402
from trtet_store.io.layout import ExternalFile  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def assert_identical(program, layouts, tmp_path: Path) -> None:
    """Every layout concatenates to what ExecuTorch's own save writes, and nothing is missing."""
    ref = executorch_outputs(program, tmp_path / "executorch")
    ours = {
        Path(p).name if Path(p).suffix == ".ptd" else "program.pte": concat(pieces)
        for p, pieces in layouts
    }
    assert sorted(ours) == sorted(ref)
    for name, data in ours.items():
        assert data == ref[name], f"{name} differs from ExecuTorch's output"


def collect_program_garbage() -> None:
    """Drop two process-wide caches that keep lowered programs alive, then collect.

    In executorch 1.5.1 / torch 2.13 both hold the ``LoweredBackendModule``
    (and through it the delegate's named data: ``FileBackedData`` objects and
    our blobs) after the program manager is gone, so a program's payload files
    otherwise live until interpreter exit: the unbounded
    ``lru_cache`` of ``executorch.exir.backend.utils.is_same_node`` (fx Nodes
    -> GraphModule -> LoweredBackendModule) and torch's fake-tensor dispatch
    cache (keys include the LoweredBackendModule).
    """
    from executorch.exir.backend.utils import is_same_node
    from torch._subclasses.fake_tensor import FakeTensorMode

    is_same_node.cache_clear()
    FakeTensorMode.cache_clear()
    gc.collect()


def write_concat(layouts, tmp_path: Path) -> None:
    for path, pieces in layouts:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(concat(pieces))


def run_in_runtime(pte: Path, ptd: Path | None, inputs, method: str = "forward") -> dict:
    """Load and run ``pte`` in a child of its own (a warm one, tests/warm.py: a crash stays
    there); returns {"outputs": [...]} or {"error": str}."""
    code = textwrap.dedent(
        """
        import json, sys, torch
        from executorch.runtime import Runtime
        pte, ptd, method = sys.argv[1], sys.argv[2] or None, sys.argv[3]
        inputs = [torch.tensor(x) for x in json.loads(sys.argv[4])]
        program = Runtime.get().load_program(pte, data_path=ptd)
        try:
            m = program.load_method(method)
        except Exception as e:
            print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}))
            sys.exit(0)
        outs = m.execute(inputs)
        print("RESULT " + json.dumps({"outputs": [o.tolist() for o in outs]}))
        """
    )
    proc = warm.run(code, [pte, ptd or "", method, json.dumps([x.tolist() for x in inputs])],
                    timeout=300, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"runtime exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


# --- the private-attribute check ------------------------------------------------------


def test_private_api_check_passes_on_installed_executorch() -> None:
    built = xnnpack_linear_program(hidden=32)
    priv.check_private_api()
    priv.check_private_api(built.manager)


@needs_file_backed_data
def test_private_api_check_passes_on_a_file_backed_program(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path, 64 * 1024)
    priv.check_private_api(named_data_program(sp.entries))


def test_private_api_check_names_the_changed_attribute(monkeypatch) -> None:
    from executorch.exir._serialize import _program

    built = xnnpack_linear_program(hidden=32)
    del built.manager._pte_data
    with pytest.raises(priv.ExecutorchPrivateAPIError, match="_pte_data"):
        priv.check_private_api(built.manager)
    original = _program._extract_delegate_segments
    monkeypatch.setattr(_program, "_extract_delegate_segments", lambda program: None)
    with pytest.raises(priv.ExecutorchPrivateAPIError, match="_extract_delegate_segments"):
        priv.check_private_api()
    monkeypatch.setattr(_program, "_extract_delegate_segments", original)
    from executorch.exir._serialize import _flatbuffer_program

    monkeypatch.delattr(_flatbuffer_program, "_flatbuffer_to_program")
    with pytest.raises(priv.ExecutorchPrivateAPIError, match="_flatbuffer_to_program"):
        priv.check_private_api()


@needs_file_backed_data
def test_private_api_check_names_a_changed_file_backed_data(monkeypatch) -> None:
    from executorch.exir._serialize import _cord

    class Renamed(_cord.FileBackedData):
        def __init__(self, path, cleanup=False, sha256=None):
            super().__init__(path, cleanup, sha256)
            self._file = self.__dict__.pop("_path")

    monkeypatch.setattr(_cord, "FileBackedData", Renamed)
    with pytest.raises(priv.ExecutorchPrivateAPIError, match=r"FileBackedData\._path"):
        priv.check_private_api()


# --- byte identity -----------------------------------------------------------------------


@pytest.mark.parametrize("segment_alignment", [128, 4096])
def test_xnnpack_external_weights_identical(tmp_path: Path, segment_alignment: int) -> None:
    built = xnnpack_linear_program(
        in_features=256, hidden=1024, segment_alignment=segment_alignment
    )
    layouts = program_layouts(built.manager, tmp_path / "out" / "program.pte")
    assert [p.name for p, _ in layouts] == ["program.pte", "model.ptd"]
    # Only in-memory data here: all pieces are bytes.
    assert all(isinstance(x, bytes) for _, pieces in layouts for x in pieces)
    assert_identical(built.manager, layouts, tmp_path)


def test_xnnpack_weights_in_pte_identical(tmp_path: Path) -> None:
    built = xnnpack_linear_program(external_tag=None)
    layouts = program_layouts(built.manager, tmp_path / "program.pte")
    assert len(layouts) == 1
    assert_identical(built.manager, layouts, tmp_path)
    assert concat(pte_pieces(built.manager)) == concat(layouts[0][1])


def test_portable_external_constants_identical(tmp_path: Path) -> None:
    built = portable_linear_program()
    layouts = program_layouts(built.manager, tmp_path / "program.pte")
    assert len(layouts) == 2
    assert_identical(built.manager, layouts, tmp_path)


@pytest.mark.parametrize("segment_alignment", [128, 4096])
@needs_file_backed_data
def test_named_file_backed_data_identical(tmp_path: Path, segment_alignment: int) -> None:
    sp = standard_entries(tmp_path / "src", 3 * MiB + 5)
    program = named_data_program(sp.entries, segment_alignment=segment_alignment)
    layouts = program_layouts(program, tmp_path / "out" / "model.bin")  # any name works
    assert [p.name for p, _ in layouts] == ["model.bin", "weights_a.ptd", "w2.ptd"]
    ours = {("program.pte" if p.name == "model.bin" else p.name): pieces for p, pieces in layouts}
    ref = executorch_outputs(program, tmp_path / "executorch")
    assert sorted(ours) == sorted(ref)
    for name, pieces in ours.items():
        assert concat(pieces) == ref[name], name
        # without consume every ExecuTorch payload is a copy-only ExternalFile
        extents = payload_extents(pieces)
        assert extents and all(isinstance(p, ExternalFile) for _, _, p in extents)
        if segment_alignment == 4096:
            assert all(off % 4096 == 0 for off, _, _ in extents), (name, extents)
    # aliases share one segment: big0 appears once in the .pte, big2 once in w2.ptd
    assert len(payload_extents(ours["program.pte"])) == 1
    assert len(payload_extents(ours["w2.ptd"])) == 1
    assert len(payload_extents(ours["weights_a.ptd"])) == 2


@needs_file_backed_data
def test_no_payload_byte_is_read(tmp_path: Path, monkeypatch) -> None:
    from executorch.exir._serialize._cord import FileBackedData

    sp = standard_entries(tmp_path / "src", 256 * 1024)
    program = named_data_program(sp.entries)

    def boom(*_a, **_k):
        raise AssertionError("payload read")

    for name in ("to_bytes", "write_to_file", "prefix", "sha256"):
        monkeypatch.setattr(FileBackedData, name, boom)
    real_open = open

    def guarded_open(file, *a, **k):
        assert os.fspath(file) not in {sp.user._path, sp.moved._path, sp.cleanup._path}
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", guarded_open)
    layouts = program_layouts(program, tmp_path / "p.pte")
    assert len(layouts) == 3


def test_bytes_pieces_are_merged_but_large_ones_kept(tmp_path: Path) -> None:
    built = xnnpack_linear_program(in_features=256, hidden=1024)
    (_, pte), (_, ptd) = program_layouts(built.manager, tmp_path / "p.pte")
    for pieces in (pte, ptd):
        assert all(len(x) > 0 for x in pieces)
        for a, b in zip(pieces, pieces[1:], strict=False):
            assert not (
                isinstance(a, bytes) and isinstance(b, bytes) and len(a) < 65536 and len(b) < 65536
            )
    assert any(len(x) >= 1024 * 256 * 4 for x in ptd)  # the weights stay one piece


@needs_file_backed_data
def test_ptd_only_and_pte_only(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", 64 * 1024)
    program = named_data_program(sp.entries)
    only = ptd_layouts(program, tmp_path / "d")
    assert [p for p, _ in only] == [tmp_path / "d" / "weights_a.ptd", tmp_path / "d" / "w2.ptd"]
    ref = executorch_outputs(program, tmp_path / "ref")
    assert concat(pte_pieces(program)) == ref["program.pte"]
    pte_only = program_layouts(program, tmp_path / "x.pte", include_ptd=False)
    assert len(pte_only) == 1


# --- our blobs as named data ---------------------------------------------------------------


@needs_file_backed_data
def test_blob_as_named_data_is_a_blob_piece_without_executorch_cleanup(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    engine = store.put(os.urandom(300_000))
    other = store.put(os.urandom(5000))
    entries = [
        NamedEntry("engine", engine, 16),
        NamedEntry("engine_alias", engine, 4096),
        NamedEntry("engine_ext", engine, 16, "eng"),
        NamedEntry("other", other, 64, "eng"),
    ]
    program = named_data_program(entries, segment_alignment=4096)
    del entries
    for consume in (False, True):
        layouts = program_layouts(program, tmp_path / "o.pte", consume=consume)
        blobs = [p for _, pieces in layouts for _, _, p in payload_extents(pieces)]
        assert blobs == [engine, engine, other]
        assert all(type(b) is Blob for b in blobs)
    assert_identical(program, layouts, tmp_path)
    # ExecuTorch holds FileBackedData objects without a finalizer: it never deletes our file
    fbds = [x for x in priv.cord_pieces(priv.pte_cord(program)) if priv.is_file_backed(x)]
    assert len(fbds) == 1 and not priv.file_backed_owns_file(fbds[0])
    assert priv.attached_blob(fbds[0]) is engine
    assert priv._finalizers_removing(os.fspath(engine.path)) == []
    # The FileBackedData keeps the blob alive; dropping the program releases the file.
    path = engine.path
    ref = weakref.ref(engine)
    del engine, blobs, layouts, fbds, program
    collect_program_garbage()
    assert ref() is None
    assert not path.exists()


@needs_file_backed_data
def test_add_blob_reuses_one_file_backed_data_and_takes_sha256(tmp_path: Path) -> None:
    import hashlib

    from executorch.exir._serialize._named_data_store import NamedDataStore

    store = BlobStore(tmp_path)
    data = os.urandom(100_000)
    blob = store.put(data)
    nds = NamedDataStore()
    sha = hashlib.sha256(data).digest()
    f1 = add_blob_as_named_data(nds, "a", blob, alignment=16, sha256=sha)
    f2 = add_blob_as_named_data(nds, "b", blob, alignment=64, external_tag="t")
    assert f1 is f2 and f1._sha256 == sha
    out = nds.get_named_data_store_output()
    assert out.buffers == [f1]
    with pytest.raises(ValueError, match="refusing"):
        add_blob_as_named_data(nds, "c", blob, external_tag="../x")
    blob.close()
    with pytest.raises(ValueError, match="released"):
        add_blob_as_named_data(nds, "d", blob)


@needs_file_backed_data
def test_store_find_recognises_a_blob_referenced_by_path(tmp_path: Path) -> None:
    from executorch.exir._serialize._cord import FileBackedData

    store = BlobStore(tmp_path / "s")
    blob = store.put(os.urandom(70_000))
    program = named_data_program([NamedEntry("k", FileBackedData(os.fspath(blob.path)), 16)])
    ((_, pieces),) = program_layouts(program, tmp_path / "a.pte")
    assert isinstance(payload_extents(pieces)[0][2], ExternalFile)  # unknown without the store
    ((_, pieces),) = program_layouts(program, tmp_path / "a.pte", store=store)
    assert payload_extents(pieces)[0][2] is blob


# --- ownership when consuming ---------------------------------------------------------------


@needs_file_backed_data
def test_consume_adopts_only_what_the_program_owns(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", MiB)
    program = named_data_program(sp.entries, segment_alignment=4096)
    ref = executorch_outputs(program, tmp_path / "before")
    moved_old, cleanup_old, user_old = sp.moved._path, sp.cleanup._path, sp.user._path
    user_bytes = Path(user_old).read_bytes()

    layouts = program_layouts(program, tmp_path / "out" / "program.pte", consume=True)
    by_name = {p.name: pieces for p, pieces in layouts}
    kinds = {
        name: [type(p).__name__ for _, _, p in payload_extents(pieces)]
        for name, pieces in by_name.items()
    }
    assert kinds == {
        "program.pte": ["ExternalFile"],  # user file: copy only
        "weights_a.ptd": ["Blob", "ExternalFile"],  # move_from file adopted; user file
        "w2.ptd": ["Blob"],  # cleanup=True file adopted
    }
    # adopted by rename into a store in the file's own directory; the old names are gone
    assert not os.path.lexists(moved_old) and not os.path.lexists(cleanup_old)
    assert Path(user_old).read_bytes() == user_bytes
    for fbd in (sp.moved, sp.cleanup):
        blob = priv.attached_blob(fbd)
        assert isinstance(blob, Blob) and not blob.closed
        assert fbd._path == os.fspath(blob.path) and blob.path.parent == Path(moved_old).parent
        assert not priv.file_backed_owns_file(fbd)
    # no ExecuTorch finalizer is left that could delete a file we own (or a reused name)
    for path in (moved_old, cleanup_old, sp.moved._path, sp.cleanup._path):
        assert priv._finalizers_removing(path) == []
    # ExecuTorch's own save still writes the same bytes from the adopted files
    assert executorch_outputs(program, tmp_path / "after") == ref
    assert_identical(program, layouts, tmp_path / "again")
    # a second plan reuses the same blobs (no second adoption)
    again = program_layouts(program, tmp_path / "out" / "program.pte", consume=True)
    assert [type(p) for _, pieces in again for _, _, p in payload_extents(pieces)] == [
        ExternalFile,
        Blob,
        ExternalFile,
        Blob,
    ]
    # dropping the program (and the objects that reference the payloads) frees the files
    blob_paths = [priv.attached_blob(f).path for f in (sp.moved, sp.cleanup)]
    del program, layouts, by_name, again, sp, blob, fbd
    collect_program_garbage()
    assert not any(p.exists() for p in blob_paths)


@needs_file_backed_data
def test_consume_with_explicit_store(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", 200_000)
    program = named_data_program(sp.entries)
    store = BlobStore(tmp_path / "src" / "staging")
    program_layouts(program, tmp_path / "p.pte", consume=True, store=store)
    assert {b.path for b in store.blobs()} == {Path(sp.moved._path), Path(sp.cleanup._path)}


@needs_file_backed_data
def test_finalizer_of_an_owner_is_harmless_once_the_file_moved(tmp_path: Path) -> None:
    """What ExecuTorch's FileBackedData finalizer does when its file is gone or renamed."""
    from executorch.exir._serialize._cord import FileBackedData

    p = write_payload_file(tmp_path / "a", 100)
    owner = FileBackedData(os.fspath(p), cleanup=True)
    os.rename(p, tmp_path / "b")
    owner.close()  # os.remove on a missing path: OSError swallowed
    assert (tmp_path / "b").exists()
    q = write_payload_file(tmp_path / "c", 100)
    owner = FileBackedData(os.fspath(q), cleanup=True)
    q.unlink()
    del owner  # already deleted: nothing raised
    gc.collect()
    # but a new file reusing the name would be deleted: why we detach finalizers on adoption
    r = write_payload_file(tmp_path / "d", 100)
    owner = FileBackedData(os.fspath(r), cleanup=True)
    os.rename(r, tmp_path / "e")
    write_payload_file(r, 1)
    owner.close()
    assert not r.exists()


# --- refusals: nothing written, nothing adopted -------------------------------------------


@pytest.mark.parametrize(
    "tag", ["../x", "..", ".", "", "/abs/x", "a/b", "a\\b", "sub/../x", "nul\0x", ".ptd"]
)
def test_bad_tag_refused(tag: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        ptd_file_name(tag)


@pytest.mark.parametrize(
    "tag,name",
    [
        ("w", "w.ptd"),
        ("w.ptd", "w.ptd"),
        ("a.b", "a.b.ptd"),
        ("...", "....ptd"),
        ("model.PTD", "model.PTD.ptd"),
    ],
)
def test_good_tag_names(tag: str, name: str) -> None:
    assert ptd_file_name(tag) == name


@pytest.mark.parametrize("tag", ["../escaped", "/tmp/abs_tag", "a/b", ""])
@needs_file_backed_data
def test_bad_tag_in_program_refused_before_anything(tmp_path: Path, tag: str) -> None:
    sp = standard_entries(tmp_path / "src", 100_000)
    program = named_data_program([*sp.entries, NamedEntry("evil", b"e" * 40, 1, tag)])
    before = sorted(os.listdir(tmp_path / "src"))
    with pytest.raises(ValueError, match="refusing"):
        program_layouts(program, tmp_path / "out" / "p.pte", consume=True)
    assert sorted(os.listdir(tmp_path / "src")) == before  # nothing adopted
    assert priv.file_backed_owns_file(sp.moved)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.ptd").exists()


def test_tags_naming_one_file_refused(tmp_path: Path) -> None:
    program = named_data_program(
        [NamedEntry("a", b"a" * 10, 1, "w"), NamedEntry("b", b"b" * 10, 1, "w.ptd")]
    )
    with pytest.raises(ValueError, match="both name"):
        program_layouts(program, tmp_path / "p.pte")
    with pytest.raises(ValueError, match="two outputs"):
        program_layouts(
            named_data_program([NamedEntry("a", b"a" * 10, 1, "p")]), tmp_path / "p.ptd"
        )


@needs_file_backed_data
def test_missing_or_resized_payload_raises_before_anything(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", 100_000)
    program = named_data_program(sp.entries)
    with open(sp.user_path, "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="planned"):
        program_layouts(program, tmp_path / "p.pte", consume=True)
    assert priv.file_backed_owns_file(sp.cleanup)  # nothing adopted
    os.truncate(sp.user_path, 100_000)
    sp.cleanup.close()  # ExecuTorch's owner deletes its file
    with pytest.raises(FileNotFoundError, match="missing"):
        program_layouts(program, tmp_path / "p.pte")


def test_not_a_program() -> None:
    with pytest.raises(TypeError, match="ExecutorchProgramManager"):
        program_layouts(object(), "x.pte")


# --- the runtime --------------------------------------------------------------------------


@pytest.mark.parametrize("segment_alignment", [128, 4096])
@needs_ptd_runtime
def test_runtime_runs_xnnpack_program_written_from_pieces(
    tmp_path: Path, segment_alignment: int
) -> None:
    built = xnnpack_linear_program(in_features=64, hidden=512, segment_alignment=segment_alignment)
    layouts = program_layouts(built.manager, tmp_path / "out" / "model.pte")
    write_concat(layouts, tmp_path)
    result = run_in_runtime(
        tmp_path / "out" / "model.pte", tmp_path / "out" / "model.ptd", built.inputs
    )
    import torch

    expected = built.module(*built.inputs)
    assert "outputs" in result, result
    torch.testing.assert_close(torch.tensor(result["outputs"][0]), expected, rtol=1e-4, atol=1e-5)


@needs_ptd_runtime
def test_runtime_runs_xnnpack_program_written_by_write_files(tmp_path: Path) -> None:
    writer = pytest.importorskip("trtet_store.io.writer")
    built = xnnpack_linear_program(in_features=64, hidden=512)
    layouts = program_layouts(built.manager, tmp_path / "model.pte")
    writer.write_files(layouts)
    ref = executorch_outputs(built.manager, tmp_path / "ref")
    assert (tmp_path / "model.pte").read_bytes() == ref["program.pte"]
    assert (tmp_path / "model.ptd").read_bytes() == ref["model.ptd"]
    result = run_in_runtime(tmp_path / "model.pte", tmp_path / "model.ptd", built.inputs)
    import torch

    torch.testing.assert_close(
        torch.tensor(result["outputs"][0]), built.module(*built.inputs), rtol=1e-4, atol=1e-5
    )


@needs_file_backed_data
def test_runtime_loads_named_data_program_and_reports_unregistered_backend(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", 200_000)
    program = named_data_program(sp.entries)
    layouts = program_layouts(program, tmp_path / "out" / "p.pte")
    write_concat(layouts, tmp_path)
    import torch

    result = run_in_runtime(
        tmp_path / "out" / "p.pte", tmp_path / "out" / "w2.ptd", (torch.ones(3),)
    )
    # the program (header, segments, named data) loads; the method needs our test backend
    assert result == {"error": "RuntimeError: Failed to load method forward, error: 0x:20"}


# --- with the transactional writer, when it exists --------------------------------------------


@needs_file_backed_data
def test_write_files_consume_leaves_no_payload_file(tmp_path: Path) -> None:
    writer = pytest.importorskip("trtet_store.io.writer")
    sp = standard_entries(tmp_path / "src", MiB)
    program = named_data_program(sp.entries, segment_alignment=4096)
    ref = executorch_outputs(program, tmp_path / "ref")
    user_bytes = sp.user_path.read_bytes()
    layouts = program_layouts(program, tmp_path / "out" / "program.pte", consume=True)
    (tmp_path / "out").mkdir()
    writer.write_files(layouts, consume=True)
    for name, data in ref.items():
        assert (tmp_path / "out" / name).read_bytes() == data, name
    assert sp.user_path.read_bytes() == user_bytes  # the user's file is never consumed
    # the store's lock file stays while the (consumed) blobs' store lives
    left = sorted(p.name for p in (tmp_path / "src").iterdir() if not p.name.startswith(".store-"))
    assert left == ["user_payload.bin"], left


@pytest.mark.slow
def test_large_named_payloads_identical(tmp_path: Path) -> None:
    sp = standard_entries(tmp_path / "src", 300 * MiB)
    program = named_data_program(sp.entries, segment_alignment=4096)
    layouts = program_layouts(program, tmp_path / "out" / "program.pte")
    ref_dir = tmp_path / "executorch"
    ref_dir.mkdir()
    program.save(os.fspath(ref_dir / "program.pte"))
    program.write_tensor_data_to_file(os.fspath(ref_dir))
    for path, pieces in layouts:
        with open(ref_dir / path.name, "rb") as f:
            for piece in pieces:
                if isinstance(piece, bytes):
                    assert f.read(len(piece)) == piece
                else:
                    with open(piece.path, "rb") as src:
                        while chunk := src.read(16 * MiB):
                            assert f.read(len(chunk)) == chunk
            assert f.read(1) == b""


# --- save / write_tensor_data / save_program -------------------------------------------------


@needs_file_backed_data
def test_save_write_tensor_data_and_save_program(tmp_path: Path) -> None:
    from trtet_store.export.executorch import save, save_program, write_tensor_data

    sp = standard_entries(tmp_path / "src", 600_000)
    program = named_data_program(sp.entries, segment_alignment=4096)
    ref = executorch_outputs(program, tmp_path / "ref")
    sources = {p: p.read_bytes() for p in (tmp_path / "src").iterdir() if p.is_file()}

    out = tmp_path / "a"
    out.mkdir()
    report = save(program, out / "model.anything")
    assert report.path.name == "model.anything"
    assert (out / "model.anything").read_bytes() == ref["program.pte"]
    assert sorted(p.name for p in out.iterdir()) == ["model.anything"]
    reports = write_tensor_data(program, out)
    assert [r.path.name for r in reports] == ["weights_a.ptd", "w2.ptd"]

    out2 = tmp_path / "b"
    out2.mkdir()
    reports = save_program(program, out2 / "program.pte")
    assert [r.path.name for r in reports] == ["program.pte", "weights_a.ptd", "w2.ptd"]
    for name, data in ref.items():
        assert (out / ("model.anything" if name == "program.pte" else name)).read_bytes() == data
        assert (out2 / name).read_bytes() == data
    # consume=False leaves every source byte-identical, ExecuTorch-owned ones included
    assert {p: p.read_bytes() for p in sources} == sources
    assert write_tensor_data(xnnpack_linear_program(external_tag=None).manager, out) == []


@needs_file_backed_data
def test_save_missing_payload_raises_and_keeps_destination(tmp_path: Path) -> None:
    from trtet_store.export.executorch import save_program

    sp = standard_entries(tmp_path / "src", 300_000)
    program = named_data_program(sp.entries)
    out = tmp_path / "out"
    out.mkdir()
    save_program(program, out / "program.pte")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    sp.user_path.unlink()
    with pytest.raises(FileNotFoundError):
        save_program(program, out / "program.pte", consume=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError, match="refusing"):
        save_program(named_data_program([NamedEntry("e", b"e", 1, "../x")]), out / "p.pte")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@needs_file_backed_data
def test_consume_with_a_store_on_another_filesystem_copies_nothing_twice(
    tmp_path: Path, make_fs
) -> None:
    """adopt() across filesystems copies; the adapter then drops the copy and plans a copy."""
    other = make_fs("tmpfs", 16)
    sp = standard_entries(tmp_path / "src", 300_000)
    program = named_data_program(sp.entries)
    store = BlobStore(other / "store")
    layouts = program_layouts(program, tmp_path / "p.pte", consume=True, store=store)
    kinds = [type(p) for _, pieces in layouts for _, _, p in payload_extents(pieces)]
    assert kinds == [ExternalFile] * 4
    assert store.blobs() == [] and priv.file_backed_owns_file(sp.moved)
    assert os.path.exists(sp.moved._path) and os.path.exists(sp.cleanup._path)
    assert_identical(program, layouts, tmp_path / "cmp")
