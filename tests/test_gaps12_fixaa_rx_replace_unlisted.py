"""``publish --replace``: when the other programs' manifests cannot be listed after the commit,
the replaced version's objects are all kept (trtet_store/remote/upload/owners.py,
``replaced_plan`` / ``remove_replaced``).

An object the replaced version named and the new one does not is removed only when no other
program's manifest beside it names it (``owners_of``, listed again after the commit). A listing
that fails is not "no other program": ``replaced_plan`` answers None and nothing is removed,
with a warning naming what was kept. Taken as none, another program's ``cpu.ptd`` (its manifest
names it) would be deleted under it.

The state is set up for real on SeaweedFS: program ``b.pte``'s manifest (written by a bucket
writer) names ``a.pte``'s ``cpu.ptd``; ``a.pte`` is published again with ``--replace`` without
its ``cpu.ptd``, through a loopback proxy that resets the answer to every ListObjectsV2
request after the new manifest's PUT (the listing before the upload, the ownership check,
goes through).
"""

from __future__ import annotations

import json
import logging
import os

import pytest
from tcp_proxy import Fault

import trtet_store
from trtet_store.remote.manifest import manifest_key


def _files(d, names):
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(os.urandom(20_000))
    return [os.fspath(d / n) for n in names]


def _etags(s3env):
    got = s3env.client.list_objects_v2(Bucket=s3env.bucket).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in got}


def _second_program_naming_cpu(s3env, a):
    """b.pte beside a.pte, its manifest naming a's cpu.ptd (a bucket writer's copy)."""
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket,
                                             Key=manifest_key("p/a.pte"))["Body"].read())
    pte = dict(doc["objects"][0], name="b.pte", key="p/b.pte")
    with open(a[0], "rb") as f:
        s3env.client.put_object(Bucket=s3env.bucket, Key="p/b.pte", Body=f.read())
    pte["etag"] = s3env.client.head_object(Bucket=s3env.bucket,
                                           Key="p/b.pte")["ETag"].strip('"')
    cpu = next(o for o in doc["objects"] if o["name"] == "cpu.ptd")
    s3env.client.put_object(Bucket=s3env.bucket, Key=manifest_key("p/b.pte"),
                            Body=json.dumps(dict(doc, program="b.pte",
                                                 objects=[pte, cpu])).encode())


def _lists_after_the_commit():
    """A match: the answers to ListObjectsV2 requests after the answer to a PUT of a manifest
    (.trtet.json). The answer is reset right after its headers (a request reset races the
    server's answer, which may reach the client first)."""
    committed = []

    def match(m) -> bool:
        if m.method == "PUT" and m.target.split("?")[0].endswith(".trtet.json"):
            committed.append(m.target)
            return False
        return bool(committed) and m.method == "GET" and "list-type=2" in m.target
    return match


@pytest.mark.parametrize("drop", [["cpu.ptd"], ["cpu.ptd", "gpu.ptd"]],
                         ids=["cpu", "cpu-and-gpu"])
def test_remove_replaced_keeps_everything_when_the_owners_cannot_be_listed(
        s3env, tmp_path, tcp_proxy, caplog, drop) -> None:
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd", "gpu.ptd"])
    trtet_store.publish(a, f"s3://{s3env.bucket}/p/a.pte", endpoint_url=s3env.endpoint.url,
                        journal_dir=s3env.journal_dir)
    _second_program_naming_cpu(s3env, a)
    before = _etags(s3env)
    proxy = tcp_proxy(s3env.endpoint.url, [
        Fault("response", "reset", match=_lists_after_the_commit(), times=1000)])
    keep = [p for p in a if os.path.basename(p) not in drop]
    with caplog.at_level(logging.WARNING, logger="trtet_store.remote"):
        report = trtet_store.publish(keep, f"s3://{s3env.bucket}/p/a.pte", replace=True,
                                     endpoint_url=proxy.url, journal_dir=s3env.journal_dir)
    assert proxy.fired, "no listing after the commit was reset: the state was not set up"
    after = _etags(s3env)
    # The new version is committed (a's manifest changed), and nothing it dropped is gone:
    # cpu.ptd (b.pte's manifest names it) above all, gpu.ptd too (not knowable now).
    assert after[manifest_key("p/a.pte")] != before[manifest_key("p/a.pte")]
    for name in drop:
        assert after[f"p/{name}"] == before[f"p/{name}"], (name, sorted(after))
    assert {k: v for k, v in after.items() if k != manifest_key("p/a.pte")} == \
        {k: v for k, v in before.items() if k != manifest_key("p/a.pte")}
    assert list(getattr(report, "removed", []) or []) == []
    assert "manifests could not be listed" in caplog.text
    assert "p/cpu.ptd" in caplog.text


def test_remove_replaced_control_listing_works_removes_only_the_unowned(
        s3env, tmp_path, tcp_proxy) -> None:
    """The control: through the same proxy without the fault, gpu.ptd (only a named it) is
    removed and cpu.ptd (b.pte's manifest names it) stays."""
    a = _files(tmp_path / "a", ["a.pte", "cpu.ptd", "gpu.ptd"])
    trtet_store.publish(a, f"s3://{s3env.bucket}/p/a.pte", endpoint_url=s3env.endpoint.url,
                        journal_dir=s3env.journal_dir)
    _second_program_naming_cpu(s3env, a)
    before = _etags(s3env)
    proxy = tcp_proxy(s3env.endpoint.url)
    trtet_store.publish([a[0]], f"s3://{s3env.bucket}/p/a.pte", replace=True,
                        endpoint_url=proxy.url, journal_dir=s3env.journal_dir)
    after = _etags(s3env)
    assert "p/gpu.ptd" not in after
    assert after["p/cpu.ptd"] == before["p/cpu.ptd"]
