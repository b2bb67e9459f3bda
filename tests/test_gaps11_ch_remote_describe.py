"""remote/download/describe.py: what ``describe`` refuses in a manifest a bucket writer wrote.

A program's manifest is a bucket object anyone with write access may rewrite. ``describe``
(called by ``fetch`` before any byte of an object) promises:

- every object the manifest names is beside the program (same prefix): a manifest
  naming ``other/w.ptd`` is a ManifestError ("is not beside the program"), and no
  request touches the object elsewhere;
- the manifest is the program's own: the first object's key is the key fetched (the
  manifest of ``a/other.pte`` copied to ``a/model.pte.trtet.json`` is refused, its bytes
  never placed at ``model.pte``);
- every object's HEAD (pinned to the manifest's ETag) has the manifest's size AND
  CRC64NVME: a manifest pointing at a same-size object of other bytes is refused on
  the HEAD, before a single GetObject of it (the cost of a refusal is zero bytes).

Each on the real SeaweedFS: the bucket writer is boto3 on it; the requests fetch makes
are seen on its own boto3 client's event hooks. The destination stays untouched.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from attacker import listing
from test_fetch_support import b64crc, engine_bytes, put_program

from trtet_store.remote.download.receive import fetch
from trtet_store.remote.errors import FetchVerificationError, ManifestError
from trtet_store.remote.manifest import Manifest, manifest_key

MiB = 1 << 20


class Calls:
    """(operation, key) of every request a boto3 client sends."""

    def __init__(self, client: Any) -> None:
        self.seen: list[tuple[str, str]] = []
        client.meta.events.register("before-parameter-build.s3.*", self._before)

    def _before(self, model: Any, params: dict, **_: Any) -> None:
        self.seen.append((model.name, params.get("Key", "")))

    def keys(self, op: str) -> list[str]:
        return [k for o, k in self.seen if o == op]


def _program(s3: Any) -> tuple[Manifest, bytes, bytes]:
    pte, ptd = engine_bytes(11, 300_000), engine_bytes(12, MiB + 7)
    m = put_program(s3.client, s3.bucket, "a", {"model.pte": (pte, [len(pte)]),
                                               "w.ptd": (ptd, [len(ptd)])})
    assert m is not None
    return m, pte, ptd


def _write_manifest(s3: Any, key: str, m: Manifest) -> None:
    s3.client.put_object(Bucket=s3.bucket, Key=manifest_key(key), Body=m.to_json())


def _dest(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pte").write_bytes(b"the version that runs")
    return out


def test_describe_refuses_a_manifest_naming_an_object_in_another_prefix(s3env, tmp_path):
    m, _, ptd = _program(s3env)
    # The bucket writer puts bytes of its own choosing elsewhere (a prefix it may write,
    # or another team's object) and points the program's manifest at them.
    other = s3env.client.put_object(Bucket=s3env.bucket, Key="other/w.ptd", Body=ptd,
                                    ChecksumAlgorithm="CRC64NVME")["ETag"].strip('"')
    moved = dataclasses.replace(m.objects[1], key="other/w.ptd", etag=other)
    _write_manifest(s3env, "a/model.pte", dataclasses.replace(m, objects=(m.objects[0], moved)))
    out = _dest(tmp_path)
    before = listing(out)
    calls = Calls(s3env.client)
    with pytest.raises(ManifestError, match=r"object 'other/w.ptd' is not beside the program "
                                            r"'a/model.pte'"):
        fetch(f"s3://{s3env.bucket}/a/model.pte", out / "model.pte", client=s3env.client)
    assert not [k for _, k in calls.seen if k.startswith("other/")]  # never asked for
    assert calls.keys("GetObject") == ["a/model.pte.trtet.json"]
    assert listing(out) == before


def test_describe_refuses_the_manifest_of_another_program_beside_it(s3env, tmp_path):
    _program(s3env)
    # Another program in the same prefix; its manifest copied over this program's.
    evil = engine_bytes(13, 200_000)
    theirs = put_program(s3env.client, s3env.bucket, "a", {"other.pte": (evil, [len(evil)])})
    assert theirs is not None
    _write_manifest(s3env, "a/model.pte", theirs)
    out = _dest(tmp_path)
    before = listing(out)
    calls = Calls(s3env.client)
    with pytest.raises(ManifestError, match=r"is the manifest of 'a/other.pte', not of "
                                            r"'a/model.pte'"):
        fetch(f"s3://{s3env.bucket}/a/model.pte", out / "model.pte", client=s3env.client)
    assert "a/other.pte" not in calls.keys("GetObject")
    assert listing(out) == before
    assert (out / "model.pte").read_bytes() == b"the version that runs"


def test_describe_refuses_a_same_size_object_of_other_bytes_on_its_head_before_any_get(
        s3env, tmp_path):
    m, _, ptd = _program(s3env)
    # Same size, other bytes, written in place; the manifest is pointed at the new ETag
    # but keeps the old CRC64NVME (and chunk digests): only the HEAD's CRC tells.
    swapped = bytes(b ^ 0xFF for b in ptd[:4096]) + ptd[4096:]
    new = s3env.client.put_object(Bucket=s3env.bucket, Key="a/w.ptd", Body=swapped,
                                  ChecksumAlgorithm="CRC64NVME")["ETag"].strip('"')
    assert b64crc(swapped) != m.objects[1].crc64nvme
    pointed = dataclasses.replace(m.objects[1], etag=new)
    _write_manifest(s3env, "a/model.pte", dataclasses.replace(m, objects=(m.objects[0], pointed)))
    out = _dest(tmp_path)
    before = listing(out)
    calls = Calls(s3env.client)
    with pytest.raises(FetchVerificationError, match=r"a/w.ptd: HeadObject says \d+ bytes, "
                                                     r"CRC64NVME .*; the manifest says"):
        fetch(f"s3://{s3env.bucket}/a/model.pte", out / "model.pte", client=s3env.client,
              attempts=3)
    # Refused on the HEAD: not one byte of either object was asked for.
    assert calls.keys("GetObject") == ["a/model.pte.trtet.json"]
    assert listing(out) == before
    assert not os.path.exists(out / "w.ptd")


@pytest.mark.parametrize("bad", [".bashrc", "x.pte"])
def test_describe_holds_a_bucket_writers_names_to_the_closed_set_before_any_head(
        s3env, tmp_path, bad):
    """check_program_names in describe: a .ptd name that is plain but not a program's
    (a dot file, a second .pte) is refused before any HeadObject."""
    from trtet_store.remote.errors import FileNameError

    m, _, ptd = _program(s3env)
    key = f"a/{bad}"
    etag = s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=ptd,
                                   ChecksumAlgorithm="CRC64NVME")["ETag"].strip('"')
    renamed = dataclasses.replace(m.objects[1], name=bad, key=key, etag=etag)
    _write_manifest(s3env, "a/model.pte",
                    dataclasses.replace(m, objects=(m.objects[0], renamed)))
    out = _dest(tmp_path)
    before = listing(out)
    calls = Calls(s3env.client)
    with pytest.raises(FileNameError):
        fetch(f"s3://{s3env.bucket}/a/model.pte", out / "model.pte", client=s3env.client)
    assert calls.keys("HeadObject") == [] and calls.keys("GetObject") == [
        "a/model.pte.trtet.json"]
    assert listing(out) == before
