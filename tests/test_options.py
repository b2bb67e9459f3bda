"""Options as one object, and one progress shape (issue 35, item 5).

Every writer takes ``options=WriteOptions(...)`` and the old keywords alike,
with the same result; a keyword given beside ``options=`` with another value
is refused before anything is written. ``publish`` takes
``config=PublishConfig(...)`` and ``if_exists`` beside the old keywords and
``replace``. A progress callback gets one ``Progress`` (``.done``,
``.total``), or ``(done, total)`` when it takes two positional arguments.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from versions import needs_file_backed_data

import trtet_store
from trtet_store.formats import onnx as fo
from trtet_store.formats import safetensors as fs_st
from trtet_store.io import (
    BlobStore,
    ExternalFile,
    Progress,
    WriteOptions,
    write_file,
    write_files,
)
from trtet_store.io.units import MiB
from trtet_store.remote import KeyExistsError, PublishConfig
from trtet_store.remote.upload.send import publish_sources
from trtet_store.remote.upload.source import ObjectSource

SRC = 4 * MiB


def _source(directory: Path) -> Path:
    src = directory / "src.bin"
    if not src.exists():
        src.write_bytes(os.urandom(SRC))
    return src


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _records(reports: Any) -> list[tuple[str, int, int]]:
    reports = reports if isinstance(reports, list) else [reports]
    return [(r.placement, r.size, r.bytes_written) for rep in reports for r in rep.placements]


# --- io: write_file, write_files ------------------------------------------------------


@pytest.mark.parametrize("entry", ["write_file", "write_files"])
def test_io_writers_give_the_same_write_with_keywords_and_with_options(make_fs, entry):
    mnt = make_fs("ext4", 64)
    src = _source(mnt)
    runs = {}
    for how in ("keywords", "options"):
        out = mnt / how
        out.mkdir()
        log: list[tuple[int, int]] = []
        opts = dict(consume=False, chunk_size=1 * MiB, placements="copy", timeout=0.5,
                    progress=lambda u, log=log: log.append((u.done, u.total)))
        kw = opts if how == "keywords" else {"options": WriteOptions(**opts)}
        pieces = [b"head" * 8, ExternalFile.range(src, 0, SRC)]
        if entry == "write_file":
            rep = write_file(out / "f.bin", pieces, **kw)
        else:
            rep = write_files([(out / "f.bin", pieces), (out / "g.bin", [b"g"])], **kw)
        runs[how] = (_tree(out), _records(rep), log)
    assert runs["keywords"] == runs["options"]
    # chunk_size reached the copy: 1 MiB windows, not the default 64 MiB in one.
    done = [0] + [d for d, _ in runs["options"][2]]
    assert [b - a for a, b in zip(done, done[1:], strict=False)].count(MiB) == SRC // MiB


def test_consume_travels_in_options_as_in_keywords(make_fs):
    mnt = make_fs("ext4", 160)  # a move keeps 64 MiB of slack free
    data = os.urandom(2 * MiB)
    placed = {}
    with BlobStore(mnt / "staging") as store:
        for how in ("keywords", "options"):
            with store.writer() as w:
                w.write(data)
            kw: dict[str, Any] = ({"consume": True} if how == "keywords"
                                  else {"options": WriteOptions(consume=True)})
            rep = write_file(mnt / f"{how}.bin", [w.blob], **kw)
            placed[how] = [r.placement for r in rep.placements]
            assert (mnt / f"{how}.bin").read_bytes() == data
    assert placed["keywords"] == placed["options"] != ["copy"]


# --- export and formats -------------------------------------------------------------


@pytest.fixture(scope="module")
def program():
    from programs import xnnpack_linear_program

    return xnnpack_linear_program(in_features=256, hidden=256).manager


def _run(entry: str, out: Path, program: Any, **kw: Any) -> Any:
    """One write through ``entry`` into ``out``."""
    t = {"w": np.arange(4096, dtype=np.float32), "b": np.ones(300, dtype=np.float16)}
    if entry == "save":
        return trtet_store.save(program, out / "m.pte", **kw)
    if entry == "save_program":
        return trtet_store.save_program(program, out / "m.pte", **kw)
    if entry == "write_tensor_data":
        return trtet_store.write_tensor_data(program, out, **kw)
    if entry == "save_file":
        return fs_st.save_file(t, out / "m.safetensors", **kw)
    if entry == "save_sharded":
        return fs_st.save_sharded(t, out, max_shard_size=8192, **kw)
    if entry == "save_model":
        from onnx import helper, numpy_helper

        init = numpy_helper.from_array(np.full((64, 64), 0.5, np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", 1, [1, 64])],
            [helper.make_tensor_value_info("y", 1, [1, 64])], [init])
        return fo.save_model(helper.make_model(graph), out / "m.onnx", location="m.data", **kw)
    raise AssertionError(entry)


PROGRAM_ENTRIES = ["save", "save_program", "write_tensor_data"]
FORMAT_ENTRIES = ["save_file", "save_sharded", "save_model"]


@pytest.mark.parametrize("entry", PROGRAM_ENTRIES + FORMAT_ENTRIES)
def test_each_entry_point_gives_the_same_result_with_keywords_and_with_options(
        here_fs, request, entry):
    prog = request.getfixturevalue("program") if entry in PROGRAM_ENTRIES else None
    runs = {}
    for how in ("keywords", "options"):
        out = here_fs / how
        out.mkdir()
        log: list[tuple[int, int]] = []
        opts = dict(consume=False, placements=["copy"], timeout=0.25,
                    progress=lambda u, log=log: log.append((u.done, u.total)))
        kw = opts if how == "keywords" else {"options": WriteOptions(**opts)}
        reps = _run(entry, out, prog, **kw)
        runs[how] = (_tree(out), _records(list(reps) if isinstance(reps, list) else reps), log)
    assert runs["keywords"] == runs["options"]
    assert runs["options"][2], "the progress callback was never called"
    assert runs["options"][2][-1][0] == runs["options"][2][-1][1]


@pytest.mark.parametrize("entry", ["write_file", "write_files"] + PROGRAM_ENTRIES
                         + FORMAT_ENTRIES)
def test_an_option_given_both_ways_with_two_values_is_refused_before_anything(
        here_fs, request, entry):
    prog = request.getfixturevalue("program") if entry in PROGRAM_ENTRIES else None
    out = here_fs / "out"
    out.mkdir()
    # The same value both ways is no conflict (checked on a fresh directory below).
    clash = {"timeout": 1.0, "options": WriteOptions(timeout=2.0)}
    with pytest.raises(TypeError, match=r"timeout given both as keyword \(timeout=1.0\) "
                                        r"and in options \(timeout=2.0\)"):
        if entry == "write_file":
            write_file(out / "f", [b"x"], **clash)
        elif entry == "write_files":
            write_files([(out / "f", [b"x"])], **clash)
        else:
            _run(entry, out, prog, **clash)
    assert list(out.iterdir()) == []
    same = here_fs / "same"
    same.mkdir()
    agree = {"timeout": 2.0, "options": WriteOptions(timeout=2.0)}
    if entry == "write_file":
        write_file(same / "f", [b"x"], **agree)
    elif entry == "write_files":
        write_files([(same / "f", [b"x"])], **agree)
    else:
        _run(entry, same, prog, **agree)
    assert list(same.iterdir())


@pytest.mark.parametrize("entry", ["write_file", "write_files"] + PROGRAM_ENTRIES
                         + FORMAT_ENTRIES)
def test_an_unknown_keyword_is_still_refused_before_anything(here_fs, request, entry):
    prog = request.getfixturevalue("program") if entry in PROGRAM_ENTRIES else None
    out = here_fs / "out"
    out.mkdir()
    with pytest.raises(TypeError, match="chunksize"):
        if entry == "write_file":
            write_file(out / "f", [b"x"], options=WriteOptions(), chunksize=MiB)
        elif entry == "write_files":
            write_files([(out / "f", [b"x"])], options=WriteOptions(), chunksize=MiB)
        else:
            _run(entry, out, prog, options=WriteOptions(), chunksize=MiB)
    assert list(out.iterdir()) == []


def test_options_must_be_a_write_options(here_fs):
    with pytest.raises(TypeError, match="options must be a trtet_store.io.options.WriteOptions, "
                                        "got dict"):
        write_file(here_fs / "f", [b"x"], options={"consume": True})
    with pytest.raises(TypeError, match="consume must be a bool"):
        WriteOptions(consume="yes")
    assert list(here_fs.iterdir()) == []


# --- one progress shape ------------------------------------------------------------


class _Updates:
    """A callable object taking one update (the new shape)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, update: Progress) -> None:
        self.seen.append(update)


def test_each_progress_shape_gets_the_same_sequence_on_a_real_write(make_fs):
    mnt = make_fs("ext4", 64)
    src = _source(mnt)
    old: list[tuple[int, int]] = []
    old_partial: list[tuple[int, int]] = []

    def two_args(done, total):
        old.append((done, total))

    def logged(log, done, total):
        log.append((done, total))

    new_lambda: list[Any] = []
    new_default: list[Any] = []
    new_varargs: list[Any] = []
    new_object = _Updates()
    callbacks = {"old": two_args, "old partial": functools.partial(logged, old_partial),
                 "new lambda": lambda update: new_lambda.append(update),
                 # a closure's default argument does not make it the old form
                 "new default": lambda update, log=new_default: log.append(update),
                 "new varargs": lambda *a: new_varargs.append(*a),
                 "new object": new_object}
    for name, cb in callbacks.items():
        write_file(mnt / name.replace(" ", "_"), [ExternalFile.range(src, 0, SRC)],
                   options=WriteOptions(chunk_size=MiB, placements="copy", progress=cb))
    expected = [(k * MiB, SRC) for k in range(1, 5)]
    assert old == old_partial == expected
    for seen in (new_lambda, new_default, new_varargs, new_object.seen):
        assert all(type(u) is Progress for u in seen)
        assert [(u.done, u.total) for u in seen] == expected


# --- remote: PublishConfig, if_exists ---------------------------------------------------


def _index_keys(s3env) -> list[str]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix=".trtet-store/")
    return [o["Key"] for o in listed.get("Contents", [])]


def _nothing_open(s3env, prefix: str) -> None:
    uploads = s3env.client.list_multipart_uploads(Bucket=s3env.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []


def test_publish_config_and_keywords_give_the_same_publish(s3env, tmp_path):
    pte = tmp_path / "a.pte"
    data = os.urandom(11 * MiB + 7)
    pte.write_bytes(data)
    keywords = dict(part_size=5 * MiB, concurrency=2, journal_dir=s3env.journal_dir, index=False)
    reports = {}
    for how in ("keywords", "config"):
        kw = keywords if how == "keywords" else {"config": PublishConfig(**keywords)}
        reports[how] = trtet_store.publish(pte, f"s3://{s3env.bucket}/{how}/m.pte",
                                           endpoint_url=s3env.endpoint.url, **kw)
        got = s3env.client.get_object(Bucket=s3env.bucket, Key=f"{how}/m.pte")["Body"].read()
        assert got == data
    # part_size reached the upload (3 parts of 5 MiB, not 2 of the default 8 MiB).
    assert [o.parts for o in reports["keywords"].objects] == [3]
    assert [o.parts for o in reports["config"].objects] == [3]
    assert reports["keywords"].bytes_sent == reports["config"].bytes_sent == len(data)
    assert _index_keys(s3env) == []  # index=False reached the publish both ways
    # publish_sources takes the same object.
    rep = publish_sources([ObjectSource.of_file(pte, "m.pte")],
                          f"s3://{s3env.bucket}/sources/m.pte", endpoint_url=s3env.endpoint.url,
                          config=PublishConfig(**keywords))
    assert [o.parts for o in rep.objects] == [3] and _index_keys(s3env) == []


def test_if_exists_and_replace_through_real_publishes(s3env, tmp_path):
    url = f"s3://{s3env.bucket}/p/m.pte"
    key = "p/m.pte"
    first, second, third = (os.urandom(MiB + k) for k in range(3))
    pte = tmp_path / "m.pte"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    ep = s3env.endpoint.url

    def body() -> bytes:
        return s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read()

    pte.write_bytes(first)
    trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, if_exists="error")
    pte.write_bytes(second)
    with pytest.raises(KeyExistsError):
        trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, if_exists="error")
    assert body() == first
    # Refusals of the arguments: nothing sent, the object as it was, no upload open.
    with pytest.raises(TypeError, match="replace=True and if_exists='error' disagree"):
        trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, replace=True,
                            if_exists="error")
    with pytest.raises(ValueError, match=r"if_exists must be one of 'error', 'replace', "
                                         r"got 'overwrite'"):
        trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, if_exists="overwrite")
    with pytest.raises(TypeError, match="part_size given both as keyword"):
        trtet_store.publish(pte, url, endpoint_url=ep, config=PublishConfig(part_size=5 * MiB),
                            part_size=6 * MiB)
    with pytest.raises(TypeError, match="unexpected keyword argument 'if_exist'"):
        trtet_store.publish(pte, url, endpoint_url=ep, if_exist="replace")
    assert body() == first
    _nothing_open(s3env, "p/")
    # if_exists="replace" replaces; replace=True still does, and agrees with it.
    trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, if_exists="replace")
    assert body() == second
    pte.write_bytes(third)
    rep = publish_sources([ObjectSource.of_file(pte, "m.pte")], url, endpoint_url=ep,
                          config=cfg, replace=True, if_exists="replace")
    assert body() == third and rep.bytes_sent > 0
    pte.write_bytes(first)
    trtet_store.publish(pte, url, endpoint_url=ep, config=cfg, replace=True)
    assert body() == first
    _nothing_open(s3env, "p/")


# --- bench: (phase, done, total) becomes one object too ------------------------------


@needs_file_backed_data
def test_bench_progress_of_each_shape_gets_the_same_updates(tmp_path):
    from trtet_store import bench

    config = bench.BenchConfig(payload_size=4 * MiB, payloads=2, filesystem="here", repeat=1,
                               layout="ptd", methods=("copy",), workdir=tmp_path)
    old: list[tuple[str, int, int]] = []
    new: list[Any] = []
    bench.run_bench(config, progress=lambda phase, d, t: old.append((phase, d, t)))
    bench.run_bench(config, progress=lambda update: new.append(update))
    assert all(type(u) is bench.BenchProgress for u in new)
    ends = {(p, t) for p, d, t in old if d == t}
    assert ends == {(u.phase, u.total) for u in new if u.done == u.total}
    assert any(p.startswith("staging") for p, _ in ends) and any("copy" in p for p, _ in ends)
