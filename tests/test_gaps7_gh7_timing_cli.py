"""The rest of the timing round's new code, one state each: ``cache export-timing`` without
an engine cache (cli/cache.py), ``cache pull``'s key prefixes (``_keys_as_listed``),
``compile-and-save --backend`` (``backend_arg``), ``check_inputs_tuple`` (export/lowering),
``build_versions``' kept answer (export/build_versions), ``compute_capability`` without a
CUDA driver (engine_key ``_no_cuda_driver``: no torch imported, NO_GPU), and
``EngineCache(wait_timeout=)``'s default (``WAIT_TIMEOUT_TTLS`` x the tier's ``lease_ttl``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtet_store.cli import main
from trtet_store.cli._common import OptionValueError
from trtet_store.cli.cache import _keys_as_listed
from trtet_store.cli.compile import backend_arg
from trtet_store.export import build_versions, engine_key

ROOT = Path(__file__).resolve().parents[1]


# -- cache export-timing without an engine cache --------------------------------------------


def test_export_timing_without_an_engine_cache_is_one_line_and_creates_nothing(tmp_path, capsys):
    where = tmp_path / "nope"
    out = tmp_path / "model.timing"
    assert main(["cache", "--dir", os.fspath(where), "export-timing", os.fspath(out)]) == 1
    said = capsys.readouterr()
    assert said.err.strip() == (f"trtet-store cache: no engine cache at {where}: no timing "
                                "cache to export (nothing written)")
    assert said.out == ""
    assert not where.exists() and not out.exists()
    assert sorted(os.listdir(tmp_path)) == []


# -- cache pull: keys as `cache list --remote` shows them ------------------------------------


def test_keys_as_listed_takes_whole_short_and_prefix_keys_and_refuses_an_ambiguous_one(
        tmp_path, s3env):
    from trtet_store.cache.tier import RemoteTier

    tier = RemoteTier(f"s3://{s3env.bucket}/tier", endpoint_url=s3env.endpoint.url)
    a = "trt-" + "abcdef01" + "1" * 24 + "-sm_89"
    b = "trt-" + "abcdef01" + "2" * 24 + "-sm_89"
    c = "trt-" + "12345678" + "3" * 24 + "-sm_89"
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    for key in (a, b, c):
        assert tier.publish(key, [("engine", f)], {"kind": "trtet_store.tensorrt.build"}
                            ).published
    assert _keys_as_listed(tier, [a, c]) == [a, c]  # whole: as given
    assert _keys_as_listed(tier, ["trt-12345678-sm_89"]) == [c]  # as the listing shows it
    assert _keys_as_listed(tier, ["trt-1234"]) == [c]  # a prefix naming one
    assert _keys_as_listed(tier, ["trt-abcdef011"]) == [a]
    assert _keys_as_listed(tier, ["trt-99999999"]) == ["trt-99999999"]  # none: left to pull
    assert _keys_as_listed(tier, [a, "trt-1234"]) == [a, c]  # whole and short in one pull
    for ambiguous in ("trt-abcdef01", "trt-abcdef01-sm_89", "trt-"):
        with pytest.raises(ValueError, match="entries of s3://.*give more of the key") as got:
            _keys_as_listed(tier, [ambiguous])
        assert f"{ambiguous!r} names " in str(got.value)


# -- compile-and-save --backend -----------------------------------------------------------


def test_backend_arg_takes_the_backends_and_names_a_typo():
    assert backend_arg("tensorrt") == "tensorrt"
    assert backend_arg("xnnpack") == "xnnpack"
    with pytest.raises(OptionValueError) as got:
        backend_arg("xnnpak")
    assert str(got.value) == ("'xnnpak' is not a backend: did you mean xnnpack? choose "
                              "tensorrt (the default) or xnnpack")
    with pytest.raises(OptionValueError) as got:
        backend_arg("cuda")
    assert str(got.value) == "'cuda' is not a backend: choose tensorrt (the default) or xnnpack"
    for text in ("", "TensorRT", "tensorrt "):
        with pytest.raises(OptionValueError):
            backend_arg(text)


def test_compile_and_save_refuses_a_backend_typo_before_anything(tmp_path, capsys):
    with pytest.raises(SystemExit) as got:
        main(["compile-and-save", "--backend", "tensorrtt", os.fspath(tmp_path / "m.py:f"),
              os.fspath(tmp_path / "out.pte")])
    assert got.value.code == 2
    err = capsys.readouterr().err
    assert "'tensorrtt' is not a backend: did you mean tensorrt?" in err
    assert sorted(os.listdir(tmp_path)) == []


# -- lowering.check_inputs_tuple -----------------------------------------------------------


def test_check_inputs_tuple_refuses_a_bare_input():
    from trtet_store.export.lowering import check_inputs_tuple

    for fine in (None, (), (1,), [1, 2]):
        check_inputs_tuple(fine)
    for bare, name in ((1.5, "float"), ("x", "str"), ({"x": 1}, "dict")):
        with pytest.raises(TypeError) as got:
            check_inputs_tuple(bare, "arg_inputs")
        assert str(got.value) == (
            f"arg_inputs must be a tuple of the positional example inputs, got a {name}: for "
            "one input give a tuple of one, (x,) not x")


# -- build_versions: the answer kept only while the import path is as it was ---------------


def _dist(where: Path, name: str, version: str) -> None:
    info = where / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_build_versions_sees_an_install_on_the_import_path(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _dist(site, "tensorrt-cu12", "10.14.1.48")
    _dist(site, "not-tensorrt", "1.0")
    monkeypatch.syspath_prepend(os.fspath(site))
    first = build_versions.build_versions()
    assert ("tensorrt-cu12", "10.14.1.48") in first
    assert all(n != "not-tensorrt" for n, _ in first)
    assert build_versions.build_versions() == first  # kept while nothing changed
    # An install beside it: a dist-info added, the directory's mtime moves.
    _dist(site, "tensorrt-cu12-libs", "10.14.1.48")
    st = os.stat(site)
    os.utime(site, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    second = build_versions.build_versions()
    assert ("tensorrt-cu12-libs", "10.14.1.48") in second
    assert set(second) - set(first) == {("tensorrt-cu12-libs", "10.14.1.48")}


# -- engine_key.compute_capability without a CUDA driver ------------------------------------


def test_compute_capability_without_a_cuda_driver_is_no_gpu_without_torch():
    code = ("import sys; from trtet_store.export import engine_key; "
            "print(engine_key._no_cuda_driver(), engine_key.compute_capability(), "
            "'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.fspath(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    driver = engine_key._no_cuda_driver()
    if not driver:
        pytest.skip("a CUDA driver is installed here: torch answers")
    assert r.stdout.split() == ["True", engine_key.NO_GPU, "False"]


# -- EngineCache(wait_timeout=): WAIT_TIMEOUT_TTLS x the lease_ttl in use --------------------


def test_wait_timeout_default_is_twice_the_lease_ttl_in_use(tmp_path, s3env):
    import trtet_store
    from trtet_store.cache.tier import RemoteTier
    from trtet_store.export import engine_cache

    assert engine_cache.WAIT_TIMEOUT_TTLS == 2.0
    assert engine_cache.DEFAULT_WAIT_TIMEOUT == 600.0
    url = f"s3://{s3env.bucket}/tier"
    plain = trtet_store.EngineCache(tmp_path / "a", remote=url, endpoint_url=s3env.endpoint.url)
    assert plain.wait_timeout == 600.0
    short = trtet_store.EngineCache(tmp_path / "b", remote=url, lease_ttl=30,
                                    endpoint_url=s3env.endpoint.url)
    assert short.wait_timeout == 60.0
    tier = RemoteTier(url, endpoint_url=s3env.endpoint.url, lease_ttl=45)
    given = trtet_store.EngineCache(tmp_path / "c", remote=tier)
    assert given.wait_timeout == 90.0  # the tier's own ttl, not the cache's default
    assert trtet_store.EngineCache(tmp_path / "d", remote=tier,
                                   wait_timeout=None).wait_timeout is None
    assert trtet_store.EngineCache(tmp_path / "e", remote=tier,
                                   wait_timeout=5).wait_timeout == 5


# -- compile-and-save: _check_before_build of --engine-cache-remote -------------------------


def _before_build_args(tmp_path: Path, **given: object) -> object:
    import argparse

    return argparse.Namespace(**{"publish": None, "engine_cache_remote": "s3://bucket/tier",
                                 "endpoint_url": None, "signing_key": None,
                                 "trusted_key": None, "replace": False, **given})


def test_check_before_build_leaves_an_unreachable_tier_to_the_build(tmp_path, monkeypatch,
                                                                    capsys):
    from trtet_store.cli.compile import _check_before_build

    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", os.fspath(tmp_path / "config"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The endpoint does not answer: the tier's rule (a warning, the build goes on).
    args = _before_build_args(tmp_path, endpoint_url=f"http://127.0.0.1:{port}")
    assert _check_before_build(args) is None
    assert capsys.readouterr().err == ""
    # A key file that is not there: refused before the build, one line.
    missing = tmp_path / "no-such.key"
    args = _before_build_args(tmp_path, endpoint_url=f"http://127.0.0.1:{port}",
                              signing_key=os.fspath(missing))
    assert _check_before_build(args) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"--signing-key {missing}: no such file (checked before the build: "
                         "nothing built or written)"), line


def test_needs_out_refuses_refittable_and_local_flags_without_out(capsys):
    import argparse

    from trtet_store.cli.compile import _LOCAL_ONLY, _needs_out

    none = {attr: None for attr in _LOCAL_ONLY}
    assert _needs_out(argparse.Namespace(**none, refittable=False)) is None
    assert _needs_out(argparse.Namespace(**none, refittable=True)) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("--refittable needs OUT (a refit reuses a cached engine: give OUT and "
                         "--engine-cache); --publish without OUT builds immutable engines"), line
    assert _needs_out(argparse.Namespace(**{**none, "etrecord": "x"}, refittable=True)) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("--etrecord need OUT (they write local files); --publish without OUT "
                         "writes none"), line
