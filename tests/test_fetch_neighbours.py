"""fetch never breaks another program of its directory, and cleans up after itself (issue 34).

Real ExecuTorch programs (tests/programs.py, XNNPACK with weights in
``<tag>.ptd``), put on the real SeaweedFS server with manifests in publish's
format:

- item 2: ``a.pte``/``cpu.ptd`` and ``b.pte``/``cpu.ptd`` (other weights, same
  tag) fetched into one directory: ``b`` is refused before anything is written,
  naming ``a.pte``; ``a``'s files byte-identical; ``replace_needed=True``
  (``--replace-needed``) replaces;
- item 3: a newer version whose manifest names ``gpu.ptd`` instead of
  ``cpu.ptd``: ``cpu.ptd`` is removed once the new files are in place, unless
  another ``.pte`` there needs it, and never when the new version failed;
- item 14: a ``.pte`` whose manifest is gone, and which reads ``cpu.ptd``: a
  clear error naming ``cpu.ptd`` (nothing written, nothing staged), or
  ``program_only=True``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from digests import file_digest
from lowered import xnnpack_linear_program  # lowered once a run, a copy each
from programs import executorch_outputs
from test_fetch_support import MiB, put_program
from versions import needs_file_backed_data

import trtet_store
from trtet_store.cli import main
from trtet_store.inspector import verify
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import FetchVerificationError, MissingDataError
from trtet_store.remote.manifest import Manifest, manifest_key

# The programs here carry file-backed named data (.ptd files), which came in executorch 1.5.
pytestmark = needs_file_backed_data


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """name -> {file: bytes}: a (cpu.ptd), b (other weights, cpu.ptd), g (gpu.ptd)."""
    out = {}
    for name, tag, seed in (("a", "cpu", 0), ("b", "cpu", 1), ("g", "gpu", 2)):
        program = xnnpack_linear_program(external_tag=tag, seed=seed)
        files = executorch_outputs(program.manager, tmp_path_factory.mktemp(name))
        assert sorted(files) == sorted(["program.pte", f"{tag}.ptd"]), sorted(files)
        out[name] = files
    assert out["a"]["cpu.ptd"] != out["b"]["cpu.ptd"]
    # A TensorRT program (stubbed build) whose engine is named data in cpu.ptd.
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, linear_relu

    d = tmp_path_factory.mktemp("t")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trt, "check_available", lambda: None)
        mp.setattr(trt, "build_engines", FakeBuilder(engine_sizes=(MiB,)))
        module, inputs = linear_relu()
        trtet_store.compile_and_save(module, inputs, d / "program.pte",
                                     external_engine_data="cpu")
    out["t"] = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    assert sorted(out["t"]) == ["cpu.ptd", "program.pte"], sorted(out["t"])
    return out


def put(s3, prefix: str, pte_name: str, files: dict[str, bytes], *,
        manifest: bool = True) -> str:
    """Upload a built program as ``prefix/pte_name`` with its ``.ptd`` files."""
    objects = {pte_name: (files["program.pte"], [len(files["program.pte"])])}
    objects |= {n: (d, [len(d)]) for n, d in files.items() if n.endswith(".ptd")}
    put_program(s3.client, s3.bucket, prefix, objects, manifest=manifest)
    return f"s3://{s3.bucket}/{prefix}/{pte_name}"


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry (hidden ones too) with its digest: what 'untouched' is checked against."""
    return {p.name: (file_digest(p) if p.is_file() else "dir") for p in directory.iterdir()}


# --- item 2 ------------------------------------------------------------------------------


def test_fetching_a_second_program_into_the_directory_is_refused_naming_the_first(
        s3, here_fs, built):
    url_a = put(s3, "a", "a.pte", built["a"])
    url_b = put(s3, "b", "b.pte", built["b"])
    fetch(url_a, here_fs / "a.pte", client=s3.client)
    assert (here_fs / "cpu.ptd").read_bytes() == built["a"]["cpu.ptd"]
    before = snapshot(here_fs)
    assert sorted(before) == ["a.pte", "cpu.ptd"]
    with pytest.raises(trtet_store.NeededByAnotherError) as err:
        fetch(url_b, here_fs / "b.pte", client=s3.client)
    message = str(err.value)
    assert os.fspath(here_fs / "a.pte") in message and "cpu.ptd" in message
    assert err.value.needed_by == [os.fspath(here_fs / "a.pte")]
    # Nothing written: a's files byte-identical, no b.pte, no staging, journal or lock.
    assert snapshot(here_fs) == before
    assert verify(here_fs / "a.pte").ok
    # The explicit opt-in replaces it (a then loads b's weights, as asked).
    report = fetch(url_b, here_fs / "b.pte", client=s3.client, replace_needed=True)
    assert (here_fs / "cpu.ptd").read_bytes() == built["b"]["cpu.ptd"]
    assert (here_fs / "b.pte").read_bytes() == built["b"]["program.pte"]
    assert report.removed == []
    assert sorted(os.listdir(here_fs)) == ["a.pte", "b.pte", "cpu.ptd"]


def test_the_cli_refuses_in_one_line_and_replaces_with_replace_needed(
        s3env, here_fs, built, capsys):
    url_a = put(s3env, "a", "a.pte", built["a"])
    url_b = put(s3env, "b", "b.pte", built["b"])
    common = ["--endpoint-url", s3env.endpoint.url, "--no-progress"]
    assert main(["fetch", url_a, os.fspath(here_fs / "a.pte"), *common]) == 0
    before = snapshot(here_fs)
    capsys.readouterr()
    assert main(["fetch", url_b, os.fspath(here_fs / "b.pte"), *common]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a.pte" in err and "cpu.ptd" in err, err
    assert snapshot(here_fs) == before
    assert main(["fetch", url_b, os.fspath(here_fs / "b.pte"), *common,
                 "--replace-needed"]) == 0
    assert (here_fs / "cpu.ptd").read_bytes() == built["b"]["cpu.ptd"]


# --- item 3 ------------------------------------------------------------------------------


def test_a_newer_version_without_a_ptd_removes_it_after_the_new_files_are_in(
        s3, here_fs, built):
    url = put(s3, "m", "model.pte", built["a"])
    fetch(url, here_fs / "model.pte", client=s3.client)
    assert sorted(os.listdir(here_fs)) == ["cpu.ptd", "model.pte"]
    put(s3, "m", "model.pte", built["g"])  # the new manifest names gpu.ptd, not cpu.ptd
    report = fetch(url, here_fs / "model.pte", client=s3.client)
    assert (here_fs / "model.pte").read_bytes() == built["g"]["program.pte"]
    assert (here_fs / "gpu.ptd").read_bytes() == built["g"]["gpu.ptd"]
    assert report.removed == [os.fspath(here_fs / "cpu.ptd")]
    assert sorted(os.listdir(here_fs)) == ["gpu.ptd", "model.pte"]
    assert verify(here_fs / "model.pte").ok


def test_a_ptd_another_program_needs_is_kept_when_the_new_version_drops_it(
        s3, here_fs, built):
    url = put(s3, "m", "model.pte", built["a"])
    fetch(url, here_fs / "model.pte", client=s3.client)
    # Another program of the directory reads cpu.ptd too.
    (here_fs / "other.pte").write_bytes(built["a"]["program.pte"])
    put(s3, "m", "model.pte", built["g"])
    report = fetch(url, here_fs / "model.pte", client=s3.client)
    assert report.removed == []
    assert (here_fs / "cpu.ptd").read_bytes() == built["a"]["cpu.ptd"]
    assert sorted(os.listdir(here_fs)) == ["cpu.ptd", "gpu.ptd", "model.pte", "other.pte"]
    assert verify(here_fs / "other.pte").ok


def test_a_new_version_that_fails_removes_nothing(s3, here_fs, built):
    url = put(s3, "m", "model.pte", built["a"])
    fetch(url, here_fs / "model.pte", client=s3.client)
    before = snapshot(here_fs)
    put(s3, "m", "model.pte", built["g"])
    # The new manifest's chunk digest of the .pte is wrong: its bytes fail their check
    # while they download, after the fetch began and before anything is written.
    key = manifest_key("m/model.pte")
    m = Manifest.from_json(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    pte = m.objects[0]
    piece = replace(pte.pieces[0], chunks=(pte.pieces[0].chunks[0] ^ 1,
                                           *pte.pieces[0].chunks[1:]))
    bad = replace(m, objects=(replace(pte, pieces=(piece, *pte.pieces[1:])), *m.objects[1:]))
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bad.to_json())
    with pytest.raises(FetchVerificationError, match="chunk digests"):
        fetch(url, here_fs / "model.pte", client=s3.client, attempts=1)
    after = {k: v for k, v in snapshot(here_fs).items() if k != ".trtet-staging"}
    assert after == before  # cpu.ptd too: the old version is whole


# --- item 14 -----------------------------------------------------------------------------


@pytest.mark.parametrize("program", ["a", "t"], ids=["xnnpack-weights", "tensorrt-engine"])
def test_a_program_whose_manifest_is_gone_and_needs_a_ptd_is_refused_naming_it(
        s3, here_fs, built, program):
    url = put(s3, "n", "model.pte", built[program], manifest=False)
    with pytest.raises(MissingDataError) as err:
        fetch(url, here_fs / "model.pte", client=s3.client)
    assert "cpu.ptd" in str(err.value) and "program_only=True" in str(err.value)
    assert err.value.ptd_files == ["cpu.ptd"]
    assert err.value.keys  # the XNNPACK weight keys, or the engine key, it reads
    assert os.listdir(here_fs) == []  # nothing written, nothing staged
    report = fetch(url, here_fs / "model.pte", client=s3.client, program_only=True)
    assert (here_fs / "model.pte").read_bytes() == built[program]["program.pte"]
    assert sorted(os.listdir(here_fs)) == ["model.pte"]
    assert report.verified


def test_a_plain_object_that_is_not_a_program_is_fetched_as_before(s3, here_fs, built):
    s3.client.put_object(Bucket=s3.bucket, Key="p/cpu.ptd", Body=built["a"]["cpu.ptd"],
                         ChecksumAlgorithm="CRC64NVME")
    fetch(f"s3://{s3.bucket}/p/cpu.ptd", here_fs / "cpu.ptd", client=s3.client)
    assert (here_fs / "cpu.ptd").read_bytes() == built["a"]["cpu.ptd"]
    # A program that holds its weights itself needs nothing: fetched alone.
    program = xnnpack_linear_program(external_tag=None, seed=3)
    files = executorch_outputs(program.manager, here_fs / "inline")
    s3.client.put_object(Bucket=s3.bucket, Key="p/inline.pte", Body=files["program.pte"],
                         ChecksumAlgorithm="CRC64NVME")
    fetch(f"s3://{s3.bucket}/p/inline.pte", here_fs / "inline.pte", client=s3.client)
    assert (here_fs / "inline.pte").read_bytes() == files["program.pte"]
