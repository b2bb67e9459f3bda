"""Every Python example of README.md runs as written (parsed and run by Sybil).

The examples run in order, in one namespace, as a reader pastes them into one
session: a name one section defines (``report``, ``program``'s files on disk)
is there for the next. What a reader brings is given here, small: ``model``
and ``x`` (the suite's linear + ReLU), ``program`` (an XNNPACK program whose
weights go to ``cpu.ptd``), ``stream_of_bytes``/``header_bytes``,
``model_proto`` (an ONNX model with one initializer), ``prefill``/``decode``
with ``tokens``/``token``. TensorRT's build is the stub builder (the one seam);
everything after it is real. ``s3://models`` and ``s3://team-bucket`` are
buckets of the session's SeaweedFS, found the way boto3 finds an endpoint
(``AWS_ENDPOINT_URL``, ``AWS_*`` keys); the cache's default location is under
``XDG_CACHE_HOME``; relative paths are under a fresh directory on the root disk.

A block preceded by ``<!-- skip: next if(...) -->`` is skipped where the
installed ExecuTorch cannot run it (and counts as skipped, never as passed).
Shell blocks are command synopses (``[--option]``), not run here: the
CLI has its own tests, and ``test_readme_synopses.py`` parses each synopsis.
"""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any

import pytest
from programs import xnnpack_linear_program
from versions import _runtime_loads_ptd

README = Path(__file__).resolve().parent.parent / "README.md"
BUCKETS = ("models", "team-bucket")


def _onnx_model() -> Any:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), dtype=np.float32), name="W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "readme",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        initializer=[weight])
    return helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def _reader_objects() -> dict[str, Any]:
    """What the README's reader brings: small stand-ins of their own objects."""
    import torch

    from trtet_store.testing.stub_tensorrt import linear_relu

    model, (x,) = linear_relu()
    torch.manual_seed(1)
    return {
        "model": model, "x": x,
        "program": xnnpack_linear_program(external_tag="cpu").manager,
        "stream_of_bytes": [bytes([i]) * 4096 for i in range(4)],
        "header_bytes": b"HEADER\n",
        "model_proto": _onnx_model(),
        "prefill": torch.nn.Linear(16, 16).eval(), "decode": torch.nn.Linear(16, 16).eval(),
        "tokens": torch.randn(4, 16), "token": torch.randn(1, 16),
        "executorch_runtime_loads_ptd": _runtime_loads_ptd(),
    }


@pytest.fixture
def readme_machine(here_fs: Path, s3: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reader's machine: a working directory, a cache home, an S3 endpoint with two buckets."""
    monkeypatch.chdir(here_fs)
    _write_finetune(here_fs / "finetune.pt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(here_fs / "xdg-cache"))
    # Publish journals (keyed by bucket and key) go under XDG_STATE_HOME: the buckets
    # here have fixed names, and make test-all runs two suites side by side.
    monkeypatch.setenv("XDG_STATE_HOME", str(here_fs / "xdg-state"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.endpoint.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.endpoint.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3.endpoint.region)
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    for bucket in BUCKETS:
        for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=bucket) \
                if bucket in _buckets(s3.client) else ():
            for obj in page.get("Contents", []):
                s3.client.delete_object(Bucket=bucket, Key=obj["Key"])
        if bucket not in _buckets(s3.client):
            s3.client.create_bucket(Bucket=bucket)
    return here_fs


def _write_finetune(path: Path) -> None:
    """The reader's fine-tune checkpoint ("New weights"): ``model``'s state, every weight moved."""
    import torch

    from trtet_store.testing.stub_tensorrt import linear_relu

    model, _ = linear_relu()
    torch.save({k: v + 0.01 for k, v in model.state_dict().items()}, path)


def _buckets(client: Any) -> set[str]:
    return {b["Name"] for b in client.list_buckets().get("Buckets", [])}


def test_every_python_example_of_the_readme_runs_as_written(readme_machine: Path) -> None:
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

    from trtet_store.testing.stub_tensorrt import FakeBuilder, FakeRefitter, installed

    document = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()]).parse(README)
    document.namespace.update(_reader_objects())
    ran, skipped = [], []
    # cpu_tail: the stub leaves a linear layer after its engines, as a partial
    # TensorRT compile does, so the hybrid example has XNNPACK work and a cpu.ptd.
    with installed(FakeBuilder(engine_sizes=(1 << 20,), cpu_tail=8), refitter=FakeRefitter()):
        for example in document:
            code = not isinstance(example.parsed, tuple)  # a skip directive parses to a tuple
            try:
                example.evaluate()
            except unittest.SkipTest:
                skipped.append(example.line)
                continue
            except Exception as exc:
                raise AssertionError(
                    f"README.md line {example.line}: the example fails as written: "
                    f"{type(exc).__name__}: {exc}") from exc
            if code:
                ran.append(example.line)
    print(f"README examples run: lines {ran}; skipped: lines {skipped}")
    # Every Python block was run or (by its directive) skipped: none went unparsed.
    assert len(ran) + len(skipped) == README.read_text().count("```python"), (ran, skipped)
    # What the examples said they wrote is there.
    for name in ("out/model.pte", "model.pte", "cpu.ptd", "deploy/model.pte",
                 "model.safetensors", "out/model.onnx", "out/llm.pte", "out/hybrid.pte"):
        assert (readme_machine / name).exists(), name

