"""``trtet_store.remote.compile_and_publish``: export, ``to_executorch`` and publish, nothing local.

The API under ``trtet-store compile-and-save --publish URL`` without OUT
(tests/test_publish_cli.py runs it through the CLI). What is library logic
and tested here: the engines are staged in ``publish_staging(store)``, kept
there when the publish fails (a dropped link must not cost the build), and
taken by the next call of the same build, which builds nothing.
"""

from __future__ import annotations

import json

import pytest
from digests import digest, file_digest
from versions import needs_file_backed_data

from trtet_store import remote
from trtet_store.io.units import MiB
from trtet_store.remote.keys import keygen
from trtet_store.remote.upload import program


def _files(directory):
    return sorted(p for p in directory.rglob("*") if p.is_file())


def test_compile_and_publish_is_the_remote_face_s_and_refuses_unknown_keywords(tmp_path):
    assert remote.compile_and_publish is program.compile_and_publish
    assert program.publish_staging(tmp_path) == tmp_path / ".trtet-publish-staging"
    with pytest.raises(TypeError, match="stagin"):
        remote.compile_and_publish(None, None, "s3://b/m.pte", staging=tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


@needs_file_backed_data  # the engines go to engines.ptd (external_engine_data)
def test_a_failed_publish_keeps_the_staged_engines_and_the_next_call_builds_nothing(
        s3env, tmp_path, monkeypatch):
    from trtet_store.export import tensorrt as trt
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    url = f"s3://{s3env.bucket}/c/m.pte"
    # The failure, set up: the key exists, and the first call is without replace.
    theirs = b"another program's bytes"
    s3env.client.put_object(Bucket=s3env.bucket, Key="c/m.pte", Body=theirs)
    work = tmp_path / "work"
    staging = program.publish_staging(work)
    module, inputs = linear_relu()
    options = {"store": work, "external_engine_data": "engines",
               "endpoint_url": s3env.endpoint.url}

    first = FakeBuilder(engine_sizes=(3 * MiB,), seeds=(7,))
    try:
        with installed(first), pytest.raises(remote.KeyExistsError):
            remote.compile_and_publish(module, inputs, url, **options)
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert len(first.built) == 1
    (engine_digest,) = [d for _engine, d in first.built]
    kept = {file_digest(p): p for p in _files(staging)}
    assert engine_digest in kept, (engine_digest, kept)  # the engine's bytes, as built
    engine_bytes = kept[engine_digest].read_bytes()
    # Nothing of ours is visible, nothing left open, their object untouched.
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="c/").get("Contents", [])
    assert [o["Key"] for o in listed] == ["c/m.pte"]
    got = s3env.client.get_object(Bucket=s3env.bucket, Key="c/m.pte")["Body"].read()
    assert got == theirs
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []

    # The next call of the same build takes the kept engine (another seed would differ).
    # ... and signs its manifest with the key it is given (a signed root, as publish's).
    (tmp_path / "keys").mkdir()
    public = keygen(tmp_path / "keys" / "ci.key")
    again = FakeBuilder(engine_sizes=(3 * MiB,), seeds=(9,))
    try:
        with installed(again):
            report = remote.compile_and_publish(module, inputs, url, replace=True,
                                                signing_key=tmp_path / "keys" / "ci.key",
                                                **options)
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert again.built == []
    assert sorted(o.key for o in report.objects) == ["c/engines.ptd", "c/m.pte"]
    published = s3env.client.get_object(Bucket=s3env.bucket, Key="c/engines.ptd")["Body"].read()
    assert engine_bytes in published, digest(published)
    manifest = json.loads(s3env.client.get_object(
        Bucket=s3env.bucket, Key="c/m.pte.trtet.json")["Body"].read())
    assert [sig["key"] for sig in manifest["signatures"]] == [public.key_id]
    (tmp_path / "fetched").mkdir()
    fetched = remote.fetch(url, tmp_path / "fetched" / "m.pte",
                           endpoint_url=s3env.endpoint.url, trusted_keys=[public])
    assert fetched is not None and (tmp_path / "fetched" / "engines.ptd").read_bytes() == published
    assert not staging.exists()  # released once published, the directory removed
    assert list(work.iterdir()) == []


def test_compile_and_publish_takes_lowering_options_and_refuses_a_conflicting_keyword(tmp_path):
    from trtet_store import LoweringOptions

    lowering = LoweringOptions(backend="xnnpack")
    with pytest.raises(TypeError, match="backend"):
        remote.compile_and_publish(None, None, "s3://b/m.pte", store=tmp_path,
                                   lowering=lowering, backend="tensorrt")
    with pytest.raises(TypeError, match="lowering"):
        remote.compile_and_publish(None, None, "s3://b/m.pte", store=tmp_path,
                                   lowering={"backend": "xnnpack"})
    assert list(tmp_path.iterdir()) == []  # refused before anything was made
    assert lowering == LoweringOptions(backend="xnnpack")  # the caller's object unchanged
