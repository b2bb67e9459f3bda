"""A fetch's report of one object: no chunk digests (one per MiB), and a sha256 only when asked."""

from __future__ import annotations

import json

from trtet_store.remote.report import FetchedObject, FetchReport


def _obj(size: int = 3 << 20, **kw: object) -> FetchedObject:
    return FetchedObject(name="m.pte", key="k/m.pte", path="/d/m.pte", size=size, etag='"e"',
                         checksum="crc64nvme:AAAAAAAAAAA=", digest="0" * 32, chunk_size=1 << 20,
                         chunk_digests=(1, 2, 3), **kw)


def test_an_object_s_report_leaves_out_its_chunk_digests_and_an_unasked_sha256() -> None:
    d = _obj().to_json()
    assert "chunk_digests" not in d and "sha256" not in d
    assert d["digest"] == "0" * 32 and d["chunk_size"] == 1 << 20
    assert _obj().chunk_digests == (1, 2, 3)  # the report's dict is a copy
    asked = _obj(sha256="a" * 64).to_json()
    assert asked["sha256"] == "a" * 64 and "chunk_digests" not in asked


def test_a_fetch_report_is_json_with_its_objects_and_size() -> None:
    rep = FetchReport(url="s3://b/k/m.pte", version='"v"', objects=[_obj(), _obj(size=5)])
    d = json.loads(json.dumps(rep.to_json()))
    assert d["size"] == (3 << 20) + 5 and [o.get("sha256") for o in d["objects"]] == [None, None]
    assert all("chunk_digests" not in o for o in d["objects"])
    assert "writes" not in d and d["version"] == '"v"'
    assert rep.paths[0].name == "m.pte"
