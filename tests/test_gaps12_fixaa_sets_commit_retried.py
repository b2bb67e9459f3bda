"""publish_set's commit (``_commit(`` in sets/publish.py) when its answer was lost and the
request retried: the retry's 412 is our own write, not another publisher's.

The set manifest's PutObject is conditional (``If-None-Match: *`` for a new
set, ``If-Match`` the version read for a replacement). When the server
applied it but its answer never came back, botocore sends the very request
again, and that retry is refused (412: the condition no longer holds, since
our write landed). The set is then ours, byte for byte: publish_set must
read it back, see its own bytes, and finish (check, clean-up, prune), not
raise "changed by another publisher". Here botocore's own retry decision
(its ``needs-retry`` event, where a lost answer is decided) asks for the
retry once, after the commit was applied on SeaweedFS; both PutObjects are
counted, and the second one's 412 is seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sets_helpers import write

from trtet_store.remote.s3 import S3
from trtet_store.remote.upload.config import PublishConfig
from trtet_store.sets import SET_KEY, fetch_set, publish_set

SET = f"rel/{SET_KEY}"


def _lost_commit_answer(ours: S3) -> list[int]:
    """Make the first set manifest PutObject's answer "lost": botocore sends it again.

    Returns the status codes the set manifest's PutObjects got, in order.
    """
    statuses: list[int] = []
    keys: list[str] = []

    def before_put(params: dict, **_kw: Any) -> None:
        keys.append(params.get("Key", ""))

    def needs_retry(response: Any = None, attempts: int = 1, **_kw: Any) -> float | None:
        if not keys or keys[-1] != SET or response is None:
            return None
        statuses.append(response[0].status_code)
        if len(statuses) == 1 and statuses[0] == 200:
            return 0  # the answer "lost": botocore sends the same request again
        return None

    ours.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    ours.client.meta.events.register("needs-retry.s3.PutObject", needs_retry)
    return statuses


@pytest.mark.parametrize("replace", [False, True], ids=["new-set", "replacement"])
def test_a_commit_whose_answer_was_lost_and_retried_is_ours_not_another_publisher(
        s3env: Any, tmp_path: Path, replace: bool) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    cfg = PublishConfig(journal_dir=s3env.journal_dir)
    a = write(tmp_path / "src" / "a" / "model.pte", 5000, 1)
    b = write(tmp_path / "src" / "b" / "model.pte", 6000, 2)
    if replace:
        publish_set({"a": [b]}, url, endpoint_url=s3env.endpoint.url, config=cfg)

    ours = S3(s3env.endpoint.url)
    statuses = _lost_commit_answer(ours)
    report = publish_set({"a": [a], "b": [b]}, url, client=ours, config=cfg,
                         if_exists="replace" if replace else "error")
    assert statuses == [200, 412], \
        f"the commit was not applied and then retried into a 412: {statuses}"
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=SET)
    assert report.manifest_etag == head["ETag"].strip('"')
    doc = json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=SET)["Body"].read())
    assert sorted(doc["members"]) == ["a", "b"]
    for name, src in (("a", a), ("b", b)):
        out = tmp_path / "out" / name
        out.parent.mkdir(exist_ok=True)
        fetch_set(url, out, name, endpoint_url=s3env.endpoint.url)
        assert (out / "model.pte").read_bytes() == src.read_bytes()
