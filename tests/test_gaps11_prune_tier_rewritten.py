"""The shared tier's prune (``trtet_store.cache.tier.prune``: ``prune``, ``RemoteTier.prune``)
removes an entry's attempt directory only when its pointer was really deleted: the sweep
deletes each pointer ``If-Match`` the ETag it was listed at, and a pointer rewritten since
(a bucket writer, or a publisher of the same origin committing the same attempt again
between prune's listing and its delete) is kept. Its attempt's objects must stay too: the
``gone`` list the sweep returns is what goes on to ``remove_attempt``, never the plan's
``doomed``. Real SeaweedFS; the rewrite is another client's PutObject, made right after the
plan (``plan_sweep``) and before its execution.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from trtet_store.cache.tier import RemoteTier
from trtet_store.cache.tier import prune as prune_module


def _objects(env: Any) -> dict[str, str]:
    out = {}
    for o in env.client.list_objects_v2(Bucket=env.bucket).get("Contents", []):
        body = env.client.get_object(Bucket=env.bucket, Key=o["Key"])["Body"].read()
        out[o["Key"]] = hashlib.sha256(body).hexdigest()
    return out


@pytest.mark.parametrize("dry_run", [False, True], ids=["prune", "dry-run"])
def test_prune_keeps_the_attempt_of_a_pointer_rewritten_after_its_listing(
        s3env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool) -> None:
    env = s3env
    for var in ("TRTET_SIGNING_KEY", "TRTET_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRTET_CONFIG_FILE", str(tmp_path / "no-config"))
    tier = RemoteTier(f"s3://{env.bucket}/cache", endpoint_url=env.endpoint.url, origin="a",
                      journal_dir=env.journal_dir)
    files = []
    for name, data in (("record", b"r" * 300), ("e0", b"e" * 5000)):
        (tmp_path / name).write_bytes(data)
        files.append((name, tmp_path / name))
    entry = tier.publish("k", files, {"n": 1}).entry
    pointer = "cache/k.json"
    real_plan = prune_module.plan_sweep
    rewritten: list[bytes] = []

    def plan_then_rewrite(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        assert [i.key for i in plan.doomed] == [pointer], plan  # judged old: doomed
        doc = json.loads(env.client.get_object(Bucket=env.bucket, Key=pointer)["Body"].read())
        doc["created"] = doc["created"] + 1.0  # the same attempt, committed again
        body = (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()
        env.client.put_object(Bucket=env.bucket, Key=pointer, Body=body)
        rewritten.append(body)
        return plan

    monkeypatch.setattr(prune_module, "plan_sweep", plan_then_rewrite)
    before = _objects(env)
    kept: dict[str, str] = {}
    removed = tier.prune(0, dry_run=dry_run, kept=kept)
    assert rewritten
    after = _objects(env)
    want = dict(before, **{pointer: hashlib.sha256(rewritten[0]).hexdigest()})
    # Every object of the attempt is there, byte for byte; nothing else went.
    assert after == want, sorted(set(before) - set(after))
    if dry_run:
        assert removed == ["k"], removed  # the plan, said, nothing done
        return
    assert removed == [], removed
    assert kept == {"k": "changed since it was listed"}, kept
    now = tier.lookup("k")
    assert now is not None and now.attempt == entry.attempt
    got = tier.download(now, tmp_path / "dl")
    assert {n: p.read_bytes() for n, p in got.paths.items()} == \
        {n: p.read_bytes() for n, p in files}
