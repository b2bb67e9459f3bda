"""remote/upload/owners.py ``owners_of`` / ``replaced_plan`` for programs at the bucket's root.

``owners_of`` lists the manifests beside the program: for ``s3://B/a.pte`` that is the
bucket's root (prefix ``""``, not ``"/"``, which names nothing). Two programs at the
root: ``b.pte`` with its own ``cpu.ptd`` is refused (OwnedByOtherProgramError naming
``a.pte``), with or without replace, ``a``'s objects keep their ETags; and a replace
of ``a.pte`` that drops ``cpu.ptd`` keeps it while another root program's manifest
names it, and removes one only it named.
"""

from __future__ import annotations

import os

import pytest

import trtet_store
from trtet_store.remote.errors import OwnedByOtherProgramError


def _files(d, names):
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(os.urandom(20_000))
    return [os.fspath(d / n) for n in names]


def _publish(s3env, files, key, **kw):
    return trtet_store.publish(files, f"s3://{s3env.bucket}/{key}",
                               endpoint_url=s3env.endpoint.url,
                               journal_dir=s3env.journal_dir, **kw)


def _etags(s3env):
    got = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in got}


@pytest.mark.parametrize("replace", [False, True])
def test_owners_of_at_the_bucket_root_protects_another_root_programs_ptd(s3env, tmp_path,
                                                                        replace):
    _publish(s3env, _files(tmp_path / "a", ["a.pte", "cpu.ptd"]), "a.pte")
    before = _etags(s3env)
    with pytest.raises(OwnedByOtherProgramError, match=rf"cpu.ptd belongs to "
                                                       rf"s3://{s3env.bucket}/a.pte"):
        _publish(s3env, _files(tmp_path / "b", ["b.pte", "cpu.ptd"]), "b.pte", replace=replace)
    assert _etags(s3env) == before
    assert s3env.client.list_multipart_uploads(Bucket=s3env.bucket).get("Uploads", []) == []


def test_replaced_plan_at_the_bucket_root_keeps_what_another_root_manifest_names(s3env,
                                                                               tmp_path):
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd", "gpu.ptd"])
    _publish(s3env, a, "a.pte")
    # b.pte at the root names a's cpu.ptd (its manifest written by a bucket writer who
    # copies a's and renames the program), so cpu.ptd has two owners.
    import json

    from trtet_store.remote.manifest import manifest_key
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=manifest_key("a.pte"))["Body"].read())
    pte = dict(doc["objects"][0], name="b.pte", key="b.pte")
    s3env.client.put_object(Bucket=s3env.bucket, Key="b.pte",
                            Body=open(a[0], "rb").read())  # noqa: SIM115
    head = s3env.client.head_object(Bucket=s3env.bucket, Key="b.pte")
    pte["etag"] = head["ETag"].strip('"')
    cpu = next(o for o in doc["objects"] if o["name"] == "cpu.ptd")
    b_doc = dict(doc, program="b.pte", objects=[pte, cpu])
    s3env.client.put_object(Bucket=s3env.bucket, Key=manifest_key("b.pte"),
                            Body=json.dumps(b_doc).encode())
    before = _etags(s3env)
    # a's new version names neither .ptd: gpu.ptd (only a named it) goes, cpu.ptd stays.
    report = _publish(s3env, [a[0]], "a.pte", replace=True)
    after = _etags(s3env)
    assert "gpu.ptd" not in after
    assert after["cpu.ptd"] == before["cpu.ptd"]
    assert after["b.pte"] == before["b.pte"]
    assert "cpu.ptd" not in getattr(report, "removed", [])
