"""``trtet-store cache prune --remote URL --older-than AGE --dry-run`` prints the sweep's plan
and deletes nothing, on the real S3 server.

The plan names each entry (its pointer and attempt objects), orphan attempt and
dead lease it would remove, and each it keeps and why (a younger entry); the
bucket's listing, each key with its ETag, is the same after; the real prune
then removes exactly what the dry run named.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier.lease import put
from trtet_store.cli import main


def _listing(s3env) -> dict[str, str]:
    pages = s3env.client.get_paginator("list_objects_v2").paginate(Bucket=s3env.bucket)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _entry(tier: RemoteTier, tmp_path: Path, key: str) -> None:
    record = tmp_path / key / "record"
    record.parent.mkdir()
    record.write_bytes(os.urandom(1000))
    tier.publish(key, [("record", record)], {})


def test_a_dry_run_prints_the_plan_and_deletes_nothing(s3env, tmp_path, capsys) -> None:
    url = f"s3://{s3env.bucket}/cache"
    tier = RemoteTier(url, endpoint_url=s3env.endpoint.url, origin="a",
                      journal_dir=tmp_path / "journal")
    for key in ("old", "older", "young"):
        _entry(tier, tmp_path, key)
    for key in ("old", "older"):  # created a day ago, by the pointer's own clock
        e = tier.lookup(key)
        e.created = time.time() - 86400
        put(tier.s3, s3env.bucket, f"cache/{key}.json", e.to_json(), if_match=e.etag)
    s3env.client.put_object(Bucket=s3env.bucket, Key="cache/gone.lease", Body=b"{}")
    time.sleep(1.1)  # the lease's LastModified (whole seconds) is older than 1s
    before = _listing(s3env)
    assert any(k.startswith("cache/old/") for k in before)

    argv = ["cache", "prune", "--remote", url, "--endpoint-url", s3env.endpoint.url,
            "--older-than", "1h"]
    assert main([*argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert _listing(s3env) == before  # nothing deleted, nothing rewritten
    assert plan[0] == f"would remove 2 entries and leftovers older than 3600 s from {url}"
    assert sorted(plan[1:3]) == ["  old", "  older"]
    assert plan[3:] == ["  kept young: younger than 3600 s"]

    # The lease is younger than an hour (not looked at); at 1s it is in the plan, with all.
    assert main(["cache", "prune", "--remote", url, "--endpoint-url", s3env.endpoint.url,
                 "--older-than", "1s", "--dry-run", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert sorted(got["removed"]) == ["gone.lease", "old", "older", "young"], got
    assert got["dry_run"] and got["kept"] == {}
    assert _listing(s3env) == before
    assert main([*argv]) == 0
    done = capsys.readouterr().out.splitlines()
    assert done[0].startswith("removed 2 entries") and sorted(done[1:3]) == plan[1:3]
    after = _listing(s3env)
    assert not [k for k in after if k.startswith(("cache/old", "cache/older"))], after
    assert {k: v for k, v in before.items() if k.startswith(("cache/young", "cache/gone"))} \
        == after
