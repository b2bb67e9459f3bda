"""remote.upload.owners.remove_replaced: a replace removes only the replaced version's
objects *beside the program*, never what its old manifest names elsewhere.

The replaced manifest is read back from the bucket, where a bucket writer may
have written it: here it names, besides the program's own objects, an object
under another prefix (``q/other.ptd``) and another program's manifest beside it
(``p/b.pte.trtet.json``), each at its current ETag. Neither is the program's:
the replace keeps both, byte for byte (b stays fetchable), and says so.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import trtet_store
from trtet_store.io.units import MiB
from trtet_store.remote import Manifest, manifest_key

PART = 5 * MiB


def _files(directory: Path, names: list[str], size: int = 70_000) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        p = directory / name
        p.write_bytes(os.urandom(size + len(out)))
        out.append(p)
    return out


def _publish(s3env, files: list[Path], key: str, **kw):
    return trtet_store.publish(files, f"s3://{s3env.bucket}/{key}", part_size=PART,
                               endpoint_url=s3env.endpoint.url,
                               journal_dir=s3env.journal_dir, **kw)


def _objects(s3env) -> dict[str, bytes]:
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket)
    return {o["Key"]: s3env.client.get_object(Bucket=s3env.bucket, Key=o["Key"])["Body"].read()
            for o in listed.get("Contents", [])}


def _etag(s3env, key: str) -> str:
    return s3env.client.head_object(Bucket=s3env.bucket, Key=key)["ETag"].strip('"')


def test_a_replace_never_removes_what_its_old_manifest_names_outside_the_program(
        s3env, tmp_path, caplog) -> None:
    v1 = _files(tmp_path / "v1", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, v1, "p/a.pte")
    b = _files(tmp_path / "b", ["b.pte"])
    _publish(s3env, b, "p/b.pte")
    s3env.client.put_object(Bucket=s3env.bucket, Key="q/other.ptd", Body=b"another prefix's")

    # A bucket writer makes a's manifest name q/other.ptd and b's manifest, at their ETags.
    mkey = manifest_key("p/a.pte")
    old = Manifest.from_json(s3env.client.get_object(Bucket=s3env.bucket,
                                                     Key=mkey)["Body"].read())
    gpu = old.object("gpu.ptd")
    elsewhere = dataclasses.replace(gpu, name="other.ptd", key="q/other.ptd",
                                    etag=_etag(s3env, "q/other.ptd"))
    theirs = dataclasses.replace(gpu, name="b.pte.trtet.json", key=manifest_key("p/b.pte"),
                                 etag=_etag(s3env, manifest_key("p/b.pte")))
    planted = Manifest(program=old.program, chunk_size=old.chunk_size,
                       objects=(*old.objects, elsewhere, theirs))
    s3env.client.put_object(Bucket=s3env.bucket, Key=mkey, Body=planted.to_json())
    assert {o.key for o in Manifest.from_json(planted.to_json()).objects} >= \
        {"q/other.ptd", "p/b.pte.trtet.json"}  # read back as the replaced version
    before = _objects(s3env)

    v2 = _files(tmp_path / "v2", ["a.pte", "cpu.ptd"])
    with caplog.at_level(logging.INFO):
        _publish(s3env, v2, "p/a.pte", replace=True)
    after = _objects(s3env)
    assert after["q/other.ptd"] == before["q/other.ptd"] == b"another prefix's"
    assert after[manifest_key("p/b.pte")] == before[manifest_key("p/b.pte")]
    assert after["p/b.pte"] == before["p/b.pte"]
    assert "p/gpu.ptd" not in after  # the program's own dropped object goes
    assert sorted(after) == sorted(["p/a.pte", mkey, "p/cpu.ptd", "p/b.pte",
                                    manifest_key("p/b.pte"), "q/other.ptd"])
    said = " ".join(r.getMessage() for r in caplog.records)
    for k in ("q/other.ptd", "p/b.pte.trtet.json"):
        assert f"s3://{s3env.bucket}/{k} is kept: the replaced manifest named it, but it is " \
               "not an object beside the program" in said
    into = tmp_path / "got-b"
    into.mkdir()
    trtet_store.fetch(f"s3://{s3env.bucket}/p/b.pte", into / "b.pte", client=s3env.client)
    assert (into / "b.pte").read_bytes() == b[0].read_bytes()
