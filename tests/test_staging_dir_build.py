"""Issue 44, item 2: compile_and_save and compile_and_publish check their staging directory
before the build, as fetch does (tests/test_staging_dir_attacks.py).

A ``.trtet-staging`` (or a publish's ``.trtet-publish-staging``) that is a
link, belongs to another user (65534, ``nobody``), or is writable by group
or others is refused with one line naming it; nothing is built, nothing is
written into it or where it points, nothing is uploaded. The TensorRT build
is stubbed at its one seam (trtet_store.testing.stub_tensorrt).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from attacker import NOBODY
from attacker import tree as state

import trtet_store
from trtet_store import remote
from trtet_store.export import tensorrt as trt
from trtet_store.io import STAGING_DIR, UnsafeDirectoryError
from trtet_store.remote.upload import program
from trtet_store.testing.stub_tensorrt import FakeBuilder, installed, linear_relu

MiB = 1 << 20


def plant(staging: Path, case: str, victim: Path) -> str:
    """Make ``staging`` unsafe in the way ``case`` says; the words its refusal must hold."""
    if case == "link":
        os.symlink(victim, staging)
        os.lchown(staging, NOBODY, NOBODY)
        return "it is a symbolic link"
    staging.mkdir()
    if case == "foreign":
        os.chmod(staging, 0o755)
        os.chown(staging, NOBODY, NOBODY)
        return f"it is owned by uid {NOBODY}, not by you"
    os.chmod(staging, 0o777)
    return r"it is writable by group or others \(mode 777\)"


def victim_dir(root: Path) -> Path:
    home = root / "root-only"
    home.mkdir(mode=0o700)
    (home / "shadow.conf").write_bytes(b"secret\n" * 100)
    os.chmod(home / "shadow.conf", 0o600)
    return home


@pytest.mark.parametrize("case", ["link", "foreign", "writable"])
def test_compile_and_save_refuses_an_unsafe_staging_dir_before_the_build(tmp_path, case):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    home = victim_dir(tmp_path)
    staging = shared / STAGING_DIR
    words = plant(staging, case, home)
    before, home_before = state(shared), state(home)
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(MiB,))
    try:
        with installed(builder), pytest.raises(UnsafeDirectoryError) as caught:
            trtet_store.compile_and_save(module, inputs, shared / "m.pte")
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    message = str(caught.value)
    assert message.startswith(f"refusing the staging directory {staging}: ")
    assert message.endswith("; remove it, or pass another staging directory")
    assert re.search(words, message)
    assert builder.built == []  # refused before the build
    assert state(shared) == before and state(home) == home_before


def test_compile_and_publish_refuses_a_linked_publish_staging_dir_before_the_build(
        s3env, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    home = victim_dir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    staging = program.publish_staging(work)
    plant(staging, "link", home)
    before, home_before = state(work), state(home)
    module, inputs = linear_relu()
    builder = FakeBuilder(engine_sizes=(MiB,))
    try:
        with installed(builder), pytest.raises(UnsafeDirectoryError,
                                               match="it is a symbolic link; remove it"):
            remote.compile_and_publish(module, inputs, f"s3://{s3env.bucket}/c/m.pte",
                                       store=work, endpoint_url=s3env.endpoint.url)
    finally:
        trt.unregister_engines(list(trt._engines.values()))
    assert builder.built == []
    assert state(work) == before and state(home) == home_before
    assert s3env.client.list_objects_v2(Bucket=s3env.bucket).get("KeyCount", 0) == 0
