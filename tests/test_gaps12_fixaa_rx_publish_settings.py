"""``compile_and_publish(..., **settings)`` hands the Torch-TensorRT compile settings on to the
export (trtet_store/remote/upload/program.py; upload.program), as ``compile_and_save`` does.

A setting such as ``optimization_level=5`` is checked (``lowering_of``) and then must reach the
TensorRT build: dropped on the way, the engines are built with the defaults and published
without a word. The real ``compile_and_publish`` runs against SeaweedFS with the stub
builder, which records the settings each build was handed; the program is published.
"""

from __future__ import annotations

import pytest

from trtet_store import remote

pytestmark = pytest.mark.executorch(reason="compile_and_publish lowers a model (stub builder)")


@pytest.mark.parametrize("settings", [{"optimization_level": 5},
                                      {"optimization_level": 1, "workspace_size": 1 << 22}],
                         ids=["level5", "level1-workspace"])
def test_compile_and_publish_hands_the_compile_settings_to_the_build(s3env, tmp_path,
                                                                    monkeypatch, settings):
    from trtet_store.export import tensorrt as trt
    from trtet_store.io.units import MiB
    from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    builder = FakeBuilder(engine_sizes=(MiB,), seeds=(3,))
    handed: list[dict] = []

    def recording(exported_program, arg_inputs, kwarg_inputs, store, build_settings):
        handed.append(dict(build_settings))
        return builder(exported_program, arg_inputs, kwarg_inputs, store, build_settings)

    module, inputs = linear_relu()
    url = f"s3://{s3env.bucket}/s/m.pte"
    try:
        with installed(recording):
            report = remote.compile_and_publish(module, inputs, url, store=tmp_path / "work",
                                                endpoint_url=s3env.endpoint.url, **settings)
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert report.url == url
    assert len(builder.built) == 1 and len(handed) == 1
    for name, value in settings.items():
        assert handed[0].get(name) == value, (name, handed[0])
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="s/").get("Contents", [])
    assert "s/m.pte" in [o["Key"] for o in listed]
