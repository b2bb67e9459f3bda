"""``trtet-store publish-set --gc-grace HOURS``: hours, as the help says, never seconds.

The prune after a publish-set commit removes blobs under ``<prefix>blobs/`` that no
manifest names and that are older than gc_grace (publish_set's ``gc_grace`` is seconds;
the CLI's ``--gc-grace`` hours). A concurrent publisher's blob, uploaded by a bucket writer
(boto3 on SeaweedFS) a few seconds before our commit, is younger than 0.25 hours: kept,
byte for byte. The same publish with ``--gc-grace 0`` prunes it (so it was prunable).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from sets_helpers import write

from trtet_store.cli import main

KiB = 1 << 10


def test_gc_grace_is_hours_a_concurrent_publisher_s_young_blob_is_kept(
        s3env: Any, tmp_path: Path, capsys: Any) -> None:
    url = f"s3://{s3env.bucket}/rel/"
    pte = write(tmp_path / "src" / "model.pte", 40 * KiB + 1, 1)
    argv = ["publish-set", url, "--member", "a", os.fspath(pte), "--journal-dir",
            os.fspath(s3env.journal_dir), "--endpoint-url", s3env.endpoint.url,
            "--no-progress", "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    # Another publisher's upload, not committed yet (a name no manifest has).
    theirs = os.urandom(30 * KiB)
    hexname = hashlib.md5(theirs).hexdigest()  # 32 hex digits: a blob's name
    key = f"rel/blobs/{hexname}"
    s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=theirs)
    time.sleep(2.5)  # a few seconds older than our commit, by the server's clock

    assert main([*argv, "--replace", "--gc-grace", "0.25"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pruned"] == [], f"--gc-grace 0.25 (hours) pruned a 2 s old blob: {report}"
    got = s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read()
    assert got == theirs, "the concurrent publisher's blob changed"

    # The default (24 hours) keeps it too.
    assert main([*argv, "--replace"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"] == []

    # --gc-grace 0: pruned (it was a blob the prune takes).
    assert main([*argv, "--replace", "--gc-grace", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"] == [hexname]
    listed = s3env.client.list_objects_v2(Bucket=s3env.bucket, Prefix="rel/blobs/")
    assert key not in [o["Key"] for o in listed.get("Contents", [])]
