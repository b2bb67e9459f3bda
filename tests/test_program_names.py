"""A program's file names are a closed set (issue 44, item 4; the trial's finding 5).

A program's files are its own name and plain ``.ptd`` names: no leading dot,
no path, no control character, none of trtet_store's own names. On the real
SeaweedFS server:

- ``trtet-store publish model.pte NAME s3://...`` (a subprocess, through a
  counting proxy) with ``.bashrc``, ``.w.ptd``, ``.model.pte.trtet-lock``, ``a\\nb.ptd``
  is refused in one line before any request: not a byte through the proxy,
  no object, no multipart upload; ``sub/x.ptd`` as an object's name (the API;
  a path on the command line is published under its file name) likewise.
- A manifest a bucket writer put there with boto3 (objects of 4 MiB each)
  naming ``.bashrc``, ``.cpu.ptd``, ``.trtet-staging``, ``.model.pte.trtet-lock``, a name
  with a newline or an escape sequence, the destination's own name, or a
  directory at the destination: fetch refuses before downloading (the proxy's
  downstream bytes stay far below one object), the directory's listing and
  the user's ``.bashrc`` byte-identical, no staging directory left. The CLI's
  refusal is one line, the name quoted.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from attacker import listing
from digests import file_digest
from test_fetch_support import MiB, assert_nothing_under, b64crc, piece_entries, put_program

import trtet_store
from trtet_store.remote import FileNameError
from trtet_store.remote.download.receive import fetch
from trtet_store.remote.manifest import manifest_key
from trtet_store.remote.upload.source import ObjectSource
from trtet_store.testing.proxy import CountingProxy

OBJECT = 4 * MiB  # each object: far more than every request a refusal may make


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``trtet-store ARGS`` in a subprocess (the environment's credentials)."""
    return subprocess.run([sys.executable, "-m", "trtet_store.cli", *args],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parents[1])


@pytest.fixture
def proxy(s3):
    with CountingProxy.for_url(s3.endpoint.url) as p:
        yield p


# --- publish ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".bashrc", ".w.ptd", ".model.pte.trtet-lock", "a\nb.ptd"])
def test_publish_refuses_a_name_outside_the_set_before_any_request(s3env, tmp_path, proxy,
                                                                   name):
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(OBJECT))
    other = tmp_path / name
    other.write_bytes(b"export PATH=/attacker:$PATH\n")
    url = f"s3://{s3env.bucket}/p/model.pte"
    done = cli("publish", str(pte), str(other), url, "--endpoint-url", proxy.endpoint_url,
               "--journal-dir", str(s3env.journal_dir), "--no-progress")
    assert done.returncode == 1, done
    # One line, naming the file quoted (its newline escaped), saying what a program's files are.
    assert done.stderr.count("\n") == 1, done.stderr
    assert "FileNameError" in done.stderr and repr(name) in done.stderr, done.stderr
    assert ".ptd names" in done.stderr
    assert done.stdout == ""
    assert (proxy.upstream, proxy.downstream) == (0, 0)  # not one request
    assert_nothing_under(s3env, "")
    assert not s3env.journal_dir.exists() or not any(s3env.journal_dir.iterdir())


def test_publish_refuses_a_path_as_an_objects_name_before_any_request(s3env, tmp_path, proxy):
    pte = tmp_path / "model.pte"
    pte.write_bytes(os.urandom(OBJECT))
    with pytest.raises(FileNameError, match=r"'sub/x.ptd' is a path"):
        ObjectSource.of_file(pte, "sub/x.ptd")
    # The API's program rule, as the CLI's: a hidden file among a program's files.
    (tmp_path / ".bashrc").write_bytes(b"x")
    with pytest.raises(FileNameError, match=r"'.bashrc' starts with a dot"):
        trtet_store.publish([pte, tmp_path / ".bashrc"], f"s3://{s3env.bucket}/p/model.pte",
                            endpoint_url=proxy.endpoint_url, journal_dir=s3env.journal_dir)
    # The program's own name is the key's: one of our own names is refused there too.
    with pytest.raises(FileNameError, match="trtet_store's own names"):
        trtet_store.publish([pte], f"s3://{s3env.bucket}/p/.m.pte.trtet-lock",
                            endpoint_url=proxy.endpoint_url, journal_dir=s3env.journal_dir)
    assert (proxy.upstream, proxy.downstream) == (0, 0)
    assert_nothing_under(s3env, "")


# --- fetch: a manifest a bucket writer wrote --------------------------------------------


def plant_manifest(s3, prefix: str, names: list[str]) -> str:
    """Objects of OBJECT random bytes named ``names`` and their manifest, as anyone could.

    The manifest is written as JSON with boto3, in publish's format: the
    constructor would refuse some of these names; a bucket writer does not use it.
    """
    objects = []
    for name in names:
        data = os.urandom(OBJECT)
        key = f"{prefix}/{name}"
        etag = s3.client.put_object(Bucket=s3.bucket, Key=key, Body=data,
                                    ChecksumAlgorithm="CRC64NVME")["ETag"].strip('"')
        md5 = hashlib.md5(data).hexdigest()  # noqa: S324 - S3's part ETag
        objects.append({"name": name, "key": key, "size": len(data), "etag": etag,
                        "crc64nvme": b64crc(data), "part_size": 5 * MiB,
                        "parts": [{"number": 1, "offset": 0, "size": len(data), "etag": md5,
                                   "crc64nvme": b64crc(data), "md5": md5}],
                        "pieces": [p.to_dict() for p in piece_entries(data, [OBJECT])]})
    doc = {"format": "trtet-store-manifest", "version": 1, "program": names[0],
           "chunk_size": MiB, "objects": objects}
    s3.client.put_object(Bucket=s3.bucket, Key=manifest_key(f"{prefix}/{names[0]}"),
                         Body=json.dumps(doc).encode())
    return f"s3://{s3.bucket}/{prefix}/{names[0]}"


BAD = {
    "dotfile": (".bashrc", FileNameError, "starts with a dot"),
    "hidden-ptd": (".cpu.ptd", FileNameError, "starts with a dot"),
    "staging": (".trtet-staging", FileNameError, "trtet_store's own names"),
    "lock": (".model.pte.trtet-lock", FileNameError, "trtet_store's own names"),
    "newline": ("a\nb.ptd", FileNameError, "control character"),
    "escape": ("\x1b]0;owned\x07.ptd", FileNameError, "control character"),
    "c1": ("a\x85b.ptd", FileNameError, "control character"),
    "not-ptd": ("authorized_keys", FileNameError, "not a .ptd name"),
}


@pytest.fixture
def home(here_fs: Path) -> Path:
    """A user's directory holding a .bashrc and an older file, as fetch's destination."""
    (here_fs / ".bashrc").write_bytes(b"# the user's own\nalias ll='ls -l'\n")
    (here_fs / "notes.txt").write_bytes(b"keep me")
    return here_fs


@pytest.mark.parametrize("case", sorted(BAD))
def test_fetch_refuses_a_manifest_name_before_downloading(s3env, home, proxy, case):
    name, error, says = BAD[case]
    url = plant_manifest(s3env, "evil", ["model.pte", "cpu.ptd", name])
    before = listing(home)
    with pytest.raises(error, match=says) as err:
        fetch(url, home / "model.pte", endpoint_url=proxy.endpoint_url)
    assert repr(name) in str(err.value) and "\n" not in str(err.value)
    # The manifest and nothing else: not one object's bytes came down.
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(home) == before  # .bashrc byte-identical; no staging, lock or journal


def test_fetch_refuses_the_destinations_own_name_and_a_directory_before_downloading(
        s3env, home, proxy):
    # The destination is named cpu.ptd, and the manifest names cpu.ptd as a data file.
    url = plant_manifest(s3env, "twice", ["model.pte", "cpu.ptd"])
    before = listing(home)
    with pytest.raises(FileNameError, match="the destination's own name"):
        fetch(url, home / "cpu.ptd", endpoint_url=proxy.endpoint_url)
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(home) == before
    # A directory where the manifest's data file goes (followed by nothing: lstat).
    (home / "gpu.ptd").mkdir()
    (home / "gpu.ptd" / "inside").write_bytes(b"mine")
    url = plant_manifest(s3env, "dir", ["model.pte", "gpu.ptd"])
    before = listing(home)
    proxy.reset()
    with pytest.raises(IsADirectoryError, match="'gpu.ptd' is a directory"):
        fetch(url, home / "model.pte", endpoint_url=proxy.endpoint_url)
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(home) == before and listing(home / "gpu.ptd") == {
        "inside": file_digest(home / "gpu.ptd" / "inside")}
    # The destination itself a directory: refused as early.
    (home / "out.pte").mkdir()
    before = listing(home)
    proxy.reset()
    with pytest.raises(IsADirectoryError, match="it is a directory"):
        fetch(url, home / "out.pte", endpoint_url=proxy.endpoint_url)
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(home) == before


def test_the_cli_refusal_is_one_line_with_the_name_quoted(s3env, home, proxy):
    url = plant_manifest(s3env, "cli", ["model.pte", "a\nb.ptd", ".bashrc"])
    before = listing(home)
    done = cli("fetch", url, str(home / "model.pte"), "--endpoint-url", proxy.endpoint_url,
               "--no-progress")
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1 and "'a\\nb.ptd'" in done.stderr, done.stderr
    assert done.stdout == ""
    assert proxy.downstream < OBJECT // 4, proxy.downstream
    assert listing(home) == before


def test_an_honest_program_is_fetched_and_listed(s3env, here_fs):
    """The closed set admits what publish writes: a program and its .ptd files."""
    files = {"model.pte": (os.urandom(MiB + 5), [MiB + 5]), "cpu.ptd": (b"w" * 100, [100])}
    put_program(s3env.client, s3env.bucket, "ok", files)
    done = cli("fetch", f"s3://{s3env.bucket}/ok/model.pte", str(here_fs / "model.pte"),
               "--endpoint-url", s3env.endpoint.url, "--no-progress")
    assert done.returncode == 0, done
    assert f"  {here_fs / 'cpu.ptd'}: 100 bytes" in done.stdout
    assert (here_fs / "cpu.ptd").read_bytes() == b"w" * 100


def test_the_cli_quotes_a_name_from_the_bucket_that_could_split_a_line(s3env):
    """``publish --list`` prints the bucket's upload keys: one with a newline stays one line."""
    from trtet_store.cli._shown import shown

    assert shown("/data/cpu.ptd") == "/data/cpu.ptd" and shown("a\nb.ptd") == "'a\\nb.ptd'"
    key = "evil/a\nb.ptd"
    upload = s3env.client.create_multipart_upload(Bucket=s3env.bucket, Key=key)
    try:
        done = cli("publish", "--list", f"s3://{s3env.bucket}/evil/", "--endpoint-url",
                   s3env.endpoint.url)
        assert done.returncode == 0, done
        lines = done.stdout.splitlines()
        assert len(lines) == 1 and lines[0].endswith("  'evil/a\\nb.ptd'"), done.stdout
        assert upload["UploadId"] in lines[0]
    finally:
        s3env.client.abort_multipart_upload(Bucket=s3env.bucket, Key=key,
                                            UploadId=upload["UploadId"])
